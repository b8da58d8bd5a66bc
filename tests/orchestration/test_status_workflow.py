"""`servelab campaign status|plan|redo` and `results/campaign_status.csv` over a real sim campaign:
an injected persistent failure, an injected reclamation, deleted runs and a grid larger than what
was run."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
VLLM = "defaults/vllm/rate-0.28"
SGLANG = "defaults/sglang/rate-0.28"


def run_json(run_id: str) -> str:
    return f"results/runs/{run_id}/run.json"


def servelab(workdir, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "servelab"), *args],
        cwd=workdir.path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def artifacts(workdir) -> dict[str, tuple[int, int]]:
    """Every file under results/ but the status CSV and the job logs: (size, mtime)."""
    results = workdir.path / "results"
    return {
        str(p.relative_to(results)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in results.rglob("*")
        if p.is_file() and p.name != "campaign_status.csv" and "logs" not in p.parts
    }


def status_rows(workdir) -> dict[str, dict[str, str]]:
    with (workdir.path / "results" / "campaign_status.csv").open(newline="") as f:
        return {row["run_id"]: row for row in csv.DictReader(f)}


def test_status_lists_every_run_with_its_state(workdir) -> None:
    retries = workdir.config["campaign"]["retries"]
    workdir.config["campaign"]["faults"] = [
        {"run": f"{SGLANG}/rep1", "kind": "fail", "attempts": retries + 3},
        {"run": f"{VLLM}/rep2", "kind": "reclaim", "at_s": 20},
    ]
    workdir.write_config()
    runs = [f"{block}/{rep}" for block in (VLLM, SGLANG) for rep in ("rep1", "rep2")]
    result = workdir.snakemake(*map(run_json, runs))
    assert result.returncode == 0, result.stdout + result.stderr

    # the reclamation discarded both vLLM reps and measured them again; now lose rep1 and a
    # sglang run, and grow the grid by a repetition nobody ran
    (reason,) = (workdir.path / "results" / "discarded" / VLLM).glob("*/reason.json")
    discard_reason = json.loads(reason.read_text())["reason"]
    shutil.rmtree(workdir.run_dir(f"{VLLM}/rep1"))
    shutil.rmtree(workdir.run_dir(f"{SGLANG}/rep2"))
    workdir.config["repetitions"] = 3
    workdir.write_config()

    before = artifacts(workdir)
    result = workdir.snakemake("results/campaign_status.csv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert artifacts(workdir) == before  # no deploy, run or telemetry job: nothing else changed

    csv_path = workdir.path / "results" / "campaign_status.csv"
    rows = status_rows(workdir)
    assert list(rows) == [f"{b}/rep{k}" for b in (VLLM, SGLANG) for k in (1, 2, 3)]
    states = {run_id: row["state"] for run_id, row in rows.items()}
    assert states == {
        f"{VLLM}/rep1": "discarded",
        f"{VLLM}/rep2": "done",
        f"{VLLM}/rep3": "missing",
        f"{SGLANG}/rep1": "failed",
        f"{SGLANG}/rep2": "missing",
        f"{SGLANG}/rep3": "missing",
    }
    assert rows[f"{VLLM}/rep1"]["reason"] == discard_reason
    assert rows[f"{VLLM}/rep1"]["discards"] == "1"
    done = rows[f"{VLLM}/rep2"]
    record = json.loads((workdir.run_dir(f"{VLLM}/rep2") / "run.json").read_text())
    assert done["discards"] == "1"
    assert done["node"] == record["node"]["end"]["name"]
    # the status table gives the wall time to the millisecond (campaign_status.run_status)
    wall = record["end_unix_s"] - record["start_unix_s"]
    assert float(done["wall_s"]) == pytest.approx(wall, abs=5e-4)
    failed = rows[f"{SGLANG}/rep1"]
    assert failed["attempts"] == str(1 + retries)
    assert failed["reason"].startswith("status failed")
    assert [rows[f"{b}/rep3"]["reason"] for b in (VLLM, SGLANG)] == ["", ""]

    # the CLI reads the same artifacts the same way
    shown = servelab(workdir, "campaign", "status")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == "6 runs: 1 done, 1 failed, 1 discarded, 3 missing"

    # the plan measures what is not final: the discarded and missing runs, not the failed one
    plan = servelab(workdir, "campaign", "plan", "--target", "all")
    assert plan.returncode == 0, plan.stderr
    assert "4 of its 6 runs to measure, 2 deployment(s)" in plan.stdout

    # unchanged artifacts: nothing to rebuild; a redo changes them and the CSV follows
    written = csv_path.stat().st_mtime_ns
    again = workdir.snakemake("results/campaign_status.csv")
    assert again.returncode == 0, again.stdout + again.stderr
    assert csv_path.stat().st_mtime_ns == written
    redo = servelab(workdir, "campaign", "redo", f"{VLLM}/rep2", "--why", "rehearsal")
    assert redo.returncode == 0, redo.stderr
    rebuilt = workdir.snakemake("results/campaign_status.csv")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert csv_path.stat().st_mtime_ns != written
    redone = status_rows(workdir)[f"{VLLM}/rep2"]
    assert (redone["state"], redone["reason"]) == ("missing", "redone: rehearsal")


def test_a_redone_run_is_measured_again_and_only_it(workdir) -> None:
    runs = [f"{VLLM}/rep1", f"{VLLM}/rep2"]
    assert workdir.snakemake(*map(run_json, runs)).returncode == 0
    sibling = workdir.run_dir(runs[1]) / "run.json"
    sibling_inode = sibling.stat().st_ino
    old = (workdir.run_dir(runs[0]) / "run.json").read_bytes()

    redo = servelab(workdir, "campaign", "redo", runs[0], "--why", "suspect the engine")
    assert redo.returncode == 0, redo.stderr
    folder = workdir.path / "results" / "redone" / runs[0] / "001"
    assert (folder / "run.json").read_bytes() == old
    assert json.loads((folder / "reason.json").read_text())["why"] == "suspect the engine"
    # the targets it prints are what the workflow must be asked for
    (targets,) = [line for line in redo.stdout.splitlines() if line.startswith("targets: ")]
    assert targets.split()[1:] == [run_json(runs[0])]

    result = workdir.snakemake(*targets.split()[1:], run_json(runs[1]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (workdir.run_dir(runs[0]) / "run.json").is_file()
    assert sibling.stat().st_ino == sibling_inode  # republished, not measured again
    assert (folder / "run.json").read_bytes() == old  # the old measurement is kept
