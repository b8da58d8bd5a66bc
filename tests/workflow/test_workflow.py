"""The Snakemake workflow itself: lint, format, the full grid's DAG, config errors before any job."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def snakemake(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "snakemake"), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:", 1)[1]
    counts = {}
    for line in table.splitlines()[3:]:
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not match:
            break
        counts[match.group(1)] = int(match.group(2))
    return counts


def test_lint_is_clean():
    result = snakemake("--lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


def test_snakefmt_is_clean():
    result = subprocess.run(
        [str(BIN / "snakefmt"), "--check", "Snakefile", "workflow/rules"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dry_run_of_the_full_grid_expands_every_run():
    result = snakemake("-n", "--forceall", "all", "results/table5.csv")
    assert result.returncode == 0, result.stderr
    counts = job_counts(result.stdout)
    assert counts["run"] == 33  # blocks: (arm, engine, condition), 3 repetitions each
    assert counts["telemetry"] == 99
    assert (
        counts["compile_trace"] == 39
    )  # 13 conditions × 3 repetitions, shared by engines and arms
    assert counts["deploy"] == 5


def test_dry_run_of_table5_needs_exactly_its_36_runs():
    result = snakemake("-n", "--forceall", "results/table5.csv")
    assert result.returncode == 0, result.stderr
    counts = job_counts(result.stdout)
    assert counts["run"] == 12  # its 36 runs, in blocks of 3 repetitions
    assert counts["telemetry"] == 36
    assert counts["compile_trace"] == 9


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("repetitions=0", "config key repetitions"),
        ("backend=docker", "config key backend"),
        ("campaign_seed=-3", "config key campaign_seed"),
    ],
)
def test_invalid_config_stops_before_any_job_naming_the_key(override, key, tmp_path):
    result = snakemake("-n", "results/table5.csv", "--config", override)
    assert result.returncode != 0
    assert key in result.stderr + result.stdout
    assert "Job stats" not in result.stdout


def test_a_grid_point_outside_the_config_is_not_a_target():
    result = snakemake("-n", "results/runs/matched/sglang/rate-0.20/rep1/run.json")
    assert result.returncode != 0
    assert "matched/sglang/rate-0.20 is not a block of the configured grid" in (
        result.stderr + result.stdout
    )
