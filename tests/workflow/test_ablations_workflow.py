"""`snakemake --cores 1 ablations` through the real Snakefile, in a scratch folder whose study grid
is one short condition and whose only ablation is SGLang fcfs in the matched arm (the
`sglang-fcfs` overlay's change): every ablation output under results/ablations/ID/, its own gate
confirming fcfs, the study's own outputs beside it, and a campaign killed in the middle resumed
with nothing measured twice."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The module's campaign is one costly set-up: every test of it on one xdist worker, so that the
# two workers do not each run it.
pytestmark = pytest.mark.xdist_group("ablations")

STUDY = """
repetitions: 2
conditions:
  - {sweep: rate, rate: 0.28, sharing: 0.9, prompt_tokens: 1024, duration_s: 40}
arms:
  matched:
    conditions: all
    engines:
      sglang:
        flags_by_condition: null
        skip_conditions: null
dispatch:
  warmup_requests: 2
analysis:
  table_conditions: [rate-0.28]
"""

TINY = """
ablation:
  question: Does SGLang's order matter here?
  base: [config/config.yaml, config/short.yaml]
arms:
  defaults:
    engines:
      sglang:
        expect: {chunked_prefill: true, chunk_size: 2048, schedule_policy: lpm}
  matched:
    engines:
      sglang:
        flags: [--schedule-policy=fcfs]
        expect: {chunked_prefill: true, chunk_size: 2048, schedule_policy: fcfs}
analysis:
  control_differs: true
"""


def _snakemake(*args: str) -> list[str]:
    return [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--cores", "1", *args]


def _wait_for(path_glob: str, root: Path, proc: subprocess.Popen[str], timeout_s: float) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(root.glob(path_glob))
        if found:
            return found[0]
        if proc.poll() is not None:
            raise AssertionError(f"the campaign ended before {path_glob} existed")
        time.sleep(0.5)
    raise AssertionError(f"no {path_glob} after {timeout_s} s")


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float, bytes]:
    """The campaign, killed (SIGKILL to its process group) once the ablation's first block is
    measured and recorded (its first telemetry job has run), then run again to the end. Returns
    the folder, that block, its mtime and its first repetition's requests.parquet."""
    work = tmp_path_factory.mktemp("ablations")
    (work / "config" / "ablations").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    short = yaml.safe_load(STUDY)
    (work / "config" / "short.yaml").write_text(yaml.safe_dump(short))
    (work / "config" / "ablations" / "tiny.yaml").write_text(TINY)
    args = ("ablations", "--configfile", "config/short.yaml")
    proc = subprocess.Popen(
        _snakemake(*args),
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        telemetry = _wait_for(
            "results/ablations/tiny/runs/*/*/*/rep1/telemetry.parquet", work, proc, 900
        )
        block = telemetry.parent.parent / "block.json"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    first_mtime = block.stat().st_mtime
    first_requests = (telemetry.parent / "requests.parquet").read_bytes()
    done = subprocess.run(_snakemake(*args), cwd=work, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "servelab: wrote results/ablations/summary.csv" in done.stdout + done.stderr
    return work, block, first_mtime, first_requests


def test_a_killed_campaign_resumes_and_measures_nothing_twice(
    campaign: tuple[Path, Path, float, bytes],
) -> None:
    work, block, first_mtime, first_requests = campaign
    blocks = sorted((work / "results" / "ablations" / "tiny" / "runs").glob("*/*/*/block.json"))
    assert len(blocks) == 4  # two arms x two engines, one condition
    assert block.stat().st_mtime == first_mtime  # the block measured before the kill was kept
    assert (block.parent / "rep1" / "requests.parquet").read_bytes() == first_requests
    again = subprocess.run(
        _snakemake("-n", "ablations", "--configfile", "config/short.yaml"),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_every_output_of_the_ablation_is_under_its_folder(
    campaign: tuple[Path, Path, float, bytes],
) -> None:
    work = campaign[0]
    tiny = work / "results" / "ablations" / "tiny"
    for name in ("table3.csv", "table4.csv", "table5.csv", "table6.csv", "run_metrics.csv"):
        assert (tiny / name).is_file(), name
    for name in ("numbers.json", "checksums.json", "defaults_diff.csv", "ablation.json"):
        assert (tiny / name).is_file(), name
    assert len(list((tiny / "figures").glob("*.png"))) == 10
    assert (tiny / "logs" / "runs").is_dir() and (
        work / "results/logs/ablations/tiny.log"
    ).is_file()
    assert not (tiny / "floor.csv").exists()  # an ablation measures no floor
    # The study's own outputs: in results/, not in the ablation's folder.
    assert (work / "results" / "table5.csv").is_file()
    assert not (work / "results" / "numbers.json").exists()  # `ablations` asks for Table 5 only
    record = json.loads((tiny / "ablation.json").read_text())
    assert record["id"] == "tiny" and record["results_dir"] == "results/ablations/tiny"
    assert [s["file"] for s in record["sources"]] == [
        "config/config.yaml",
        "config/short.yaml",
        "config/ablations/tiny.yaml",
    ]


def test_the_gate_confirmed_each_policy_and_the_defaults_arm_is_the_studys(
    campaign: tuple[Path, Path, float, bytes],
) -> None:
    work = campaign[0]
    tiny = work / "results" / "ablations" / "tiny"
    policies = {}
    for path in (tiny / "deployments").glob("*/resolved.json"):
        resolved = json.loads(path.read_text())
        if resolved["engine"] == "sglang":
            policies[resolved["deployment_id"].split("-")[0]] = resolved["schedule_policy"]
    assert policies == {"defaults": "lpm", "matched": "fcfs"}
    # Same seeds, same deployments: the ablation's defaults arm and traces are the study's, byte
    # for byte.
    for ours in sorted((tiny / "runs" / "defaults").glob("*/*/*/requests.parquet")):
        theirs = work / "results" / ours.relative_to(tiny)
        assert ours.read_bytes() == theirs.read_bytes(), ours
    for ours in sorted((tiny / "traces").glob("*/*/trace.parquet")):
        assert ours.read_bytes() == (work / "results" / ours.relative_to(tiny)).read_bytes()
    notes = (tiny / "analysis_notes.txt").read_text()
    assert "configuration differs between the arms by design" in notes


def test_the_summary_puts_the_ablation_beside_the_study(
    campaign: tuple[Path, Path, float, bytes],
) -> None:
    work = campaign[0]
    with (work / "results" / "ablations" / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["ablation"] for r in rows} == {"study", "tiny"}
    study = {(r["condition"], r["metric"]): r for r in rows if r["ablation"] == "study"}
    tiny = {(r["condition"], r["metric"]): r for r in rows if r["ablation"] == "tiny"}
    assert study.keys() == tiny.keys() and ("rate-0.28", "ttft_p50") in study
    # The defaults arm is the same campaign in both: the same gaps.
    for key, row in study.items():
        assert tiny[key]["defaults_gap"] == row["defaults_gap"], key
