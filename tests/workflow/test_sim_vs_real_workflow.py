"""The sim-vs-real rules: the CPU platform's fit depends on the floor alone (no loaded run is in its
part of the DAG), every run of the grid is predicted and compared, and the CPU pair runs on the sim
backend with a fitted platform (config/cpu-pair-sim.yaml) through the real Snakefile."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIGS = ("--configfile", "config/cpu-pair.yaml", "config/sim-vs-real.yaml")


def snakemake(
    *args: str, cwd: Path = REPO, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    command = [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--cores", "1"]
    return subprocess.run(
        [*command, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:", 1)[1]
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)
        if m.group(1) != "total"
    }


def test_the_platform_fit_needs_the_floor_and_no_loaded_run() -> None:
    done = snakemake("-n", "--forceall", "results/sim_vs_real/platform.json", *CONFIGS)
    assert done.returncode == 0, done.stderr[-2000:]
    jobs = job_counts(done.stdout)
    assert jobs["cpu_platform"] == 1 and jobs["floor_run"] > 0
    # the loaded runs and their traces are not in the fit's part of the DAG
    assert "run" not in jobs and "compile_trace" not in jobs and "predict_run" not in jobs


def test_the_comparison_predicts_every_run_of_the_grid_once() -> None:
    done = snakemake("-n", "--forceall", "results/sim_vs_real.csv", *CONFIGS)
    assert done.returncode == 0, done.stderr[-2000:]
    jobs = job_counts(done.stdout)
    config = yaml.safe_load((REPO / "config" / "sim-vs-real.yaml").read_text())
    blocks = 2 * 2 * len(config["conditions"])  # arms x engines x rates
    assert jobs["run"] == blocks
    assert jobs["predict_run"] == blocks * config["repetitions"]
    assert jobs["sim_vs_real"] == 1 and jobs["cpu_platform"] == 1


def test_every_condition_of_the_comparison_offers_twelve_graphs_a_repetition() -> None:
    # a repetition of fewer graphs is one graph's critical path, not a rate's percentiles
    config = yaml.safe_load((REPO / "config" / "sim-vs-real.yaml").read_text())
    offered = {f"rate-{c['rate']:.2f}": c["rate"] * c["duration_s"] for c in config["conditions"]}
    assert offered and all(graphs >= 12 for graphs in offered.values()), offered


def test_the_cpu_pair_runs_on_the_sim_backend_with_a_fitted_platform(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    short = {"repetitions": 1, "dispatch": {"warmup_requests": 1}}
    (tmp_path / "config" / "short.yaml").write_text(yaml.safe_dump(short))
    done = snakemake(
        "results/table5.csv",
        "--configfile",
        "config/cpu-pair.yaml",
        "config/cpu-pair-sim.yaml",
        "config/short.yaml",
        cwd=tmp_path,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    with (tmp_path / "results" / "table5.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows, "Table 5 is empty"
    logs = sorted((tmp_path / "results" / "deployments").glob("*llamacpp*/startup.log"))
    assert len(logs) == 2, logs  # both arms, confirmed by the gate from the simulated log
    resolved = {p.parent.name.split("-")[0]: p.parent / "resolved.json" for p in logs}
    assert '"chunk_size": 256' in resolved["matched"].read_text()
    assert '"chunked_prefill": false' in resolved["defaults"].read_text()
