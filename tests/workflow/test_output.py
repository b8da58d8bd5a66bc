"""What the workflow prints with the repository's profile: progress and errors, one line per job,
no start-up banner or per-job reasons, and a closing line naming what was written.

The runs happen in a scratch copy of the workflow (the package is the installed one); the one real
job is a single trace compilation of the small grid (seconds).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.settings.enums import Quietness

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROFILE = REPO / "profiles" / "default" / "config.yaml"
TRACE_DIR = "results/traces/rate-0.12/rep1"
FAILING_SCRIPT = """\
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):
    raise RuntimeError("injected by test_output")
"""


def snakemake(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # targets first: --configfile takes every word after it
        [str(BIN / "snakemake"), *args, "--cores", "1", "--configfile", "config/test.yaml"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def scratch_workflow(dest: Path) -> Path:
    for name in ("Snakefile", "environment.yml", "workflow", "config", "profiles"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, dest / name)
    return dest


def test_the_profile_quiets_only_what_snakemake_knows_and_keeps_progress_and_errors() -> None:
    """`rules` would also drop "Error in rule ..." and the failed job's log; `progress` the
    "N of M steps" lines; `all` everything."""
    quiet = yaml.safe_load(PROFILE.read_text(encoding="utf-8"))["quiet"]
    assert set(quiet) <= set(Quietness.choices())
    assert not set(quiet) & {"rules", "progress", "all"}


def test_a_job_prints_one_line_and_the_workflow_ends_naming_what_it_wrote(tmp_path: Path) -> None:
    root = scratch_workflow(tmp_path)
    result = snakemake(f"{TRACE_DIR}/trace.parquet", cwd=root)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "Using workflow specific profile profiles/default" in out
    assert "Snakemake version:" not in out  # the start-up banner (quiet: host)
    assert "reason:" not in out.lower()  # per-job reasons (quiet: reason)
    assert "    output:" not in out  # the rule's input/output block: its message instead
    assert "compile and validate the trace of rate-0.12/rep1" in out
    assert "1 of 1 steps (100%) done" in out  # progress stays
    written = [line for line in out.splitlines() if line.startswith("servelab: ")]
    assert written == [f"servelab: wrote {TRACE_DIR}/manifest.json, {TRACE_DIR}/trace.parquet"]


def test_a_failing_job_still_shows_its_error_and_log(tmp_path: Path) -> None:
    root = scratch_workflow(tmp_path)
    (root / "workflow" / "scripts" / "compile_trace.py").write_text(FAILING_SCRIPT)
    result = snakemake(f"{TRACE_DIR}/trace.parquet", cwd=root)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Error in rule compile_trace" in out
    # show-failed-logs: the job's own log, with the exception it logged
    assert "Logfile results/logs/traces/rate-0.12/rep1.log:" in out
    assert out.count("RuntimeError: injected by test_output") >= 1
    closing = [line for line in out.splitlines() if line.startswith("servelab: ")]
    assert closing == [
        "servelab: some jobs failed (their errors are above); wrote nothing; not made: "
        f"{TRACE_DIR}/manifest.json, {TRACE_DIR}/trace.parquet"
    ]


@pytest.mark.parametrize("target", ["results/table5.csv"])
def test_a_dry_run_with_the_profile_still_lists_the_jobs(tmp_path: Path, target: str) -> None:
    """The quiet settings must not empty a plan: `snakemake -n` still prints its job table."""
    root = scratch_workflow(tmp_path)
    result = snakemake("-n", target, cwd=root)
    assert result.returncode == 0, result.stderr
    assert "Job stats:" in result.stdout
    assert "table5" in result.stdout.split("Job stats:", 1)[1]
