"""`make test` says so, in one line with the install command, when a tier is skipped for a missing
system package (tests/conftest.py's SYSTEM_TIERS)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PLANTED = """
import pytest

@pytest.mark.prometheus
@pytest.mark.skip(reason="planted: stands in for the tier's own skip")
def test_needs_prometheus():
    pass

@pytest.mark.prometheus
def test_runs_anyway():
    pass

def test_unmarked():
    pass
"""


def run_planted(tmp_path: Path, source: str, *, prometheus: str | None) -> str:
    """Run a planted test file under a copy of tests/conftest.py; return pytest's -q output."""
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_planted.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    prometheus: planted\n")
    empty_path = tmp_path / "no-programs"
    empty_path.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SERVELAB_PROMETHEUS"}
    env["PATH"] = str(empty_path)  # no `prometheus` on PATH, whatever this machine has installed
    if prometheus is not None:
        env["SERVELAB_PROMETHEUS"] = prometheus
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def notices(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("SKIPPED the ")]


def test_a_skipped_tier_with_its_program_missing_prints_one_line_with_the_install_command(
    tmp_path: Path,
):
    lines = notices(run_planted(tmp_path, PLANTED, prometheus=None))
    assert len(lines) == 1, lines
    assert "live-Prometheus tier (1 tests marked 'prometheus')" in lines[0]
    assert "apt-get install prometheus" in lines[0]


def test_no_line_when_the_program_is_there(tmp_path: Path):
    output = run_planted(tmp_path, PLANTED, prometheus="/usr/bin/prometheus")
    assert notices(output) == [], output


def test_no_line_when_no_test_of_the_tier_was_skipped(tmp_path: Path):
    # the same file without the skip: the tier's tests ran, so there is nothing to announce
    source = PLANTED.replace(
        '@pytest.mark.skip(reason="planted: stands in for the tier\'s own skip")\n', ""
    )
    assert source != PLANTED
    output = run_planted(tmp_path, source, prometheus=None)
    assert notices(output) == [], output
