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
def test_needs_prometheus(prometheus_program):
    assert prometheus_program

def test_unmarked():
    pass
"""


def run_planted(
    tmp_path: Path, source: str, *, prometheus: str | None, ci: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run a planted test file under a copy of tests/conftest.py, with no `prometheus` on PATH
    whatever this machine has installed; SERVELAB_PROMETHEUS names one if `prometheus` is given."""
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_planted.py").write_text(source)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers\nmarkers =\n    prometheus: planted\n"
        "    llamacpp: planted\n"
    )
    empty_path = tmp_path / "no-programs"
    empty_path.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SERVELAB_PROMETHEUS", "CI", "PYTEST_ADDOPTS")
    }
    env["PATH"] = str(empty_path)
    if prometheus is not None:
        env["SERVELAB_PROMETHEUS"] = prometheus
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def passing_output(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def notices(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("SKIPPED the ")]


def test_a_skipped_tier_with_its_program_missing_prints_one_line_with_the_install_command(
    tmp_path: Path,
):
    output = passing_output(run_planted(tmp_path, PLANTED, prometheus=None))
    lines = notices(output)
    assert len(lines) == 1, output
    assert "live-Prometheus tier (1 tests marked 'prometheus')" in lines[0]
    assert "apt-get install prometheus" in lines[0]
    assert "1 passed, 1 skipped" in output


def test_under_ci_a_missing_program_fails_the_run_naming_it(tmp_path: Path):
    result = run_planted(tmp_path, PLANTED, prometheus=None, ci=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed, 1 error" in result.stdout  # the fixture fails at set-up
    assert "CI=true: the live-Prometheus tier needs `prometheus`" in result.stdout


def test_no_line_when_the_program_is_there(tmp_path: Path):
    # any existing file stands for the program: the fixture only looks it up
    output = passing_output(run_planted(tmp_path, PLANTED, prometheus=sys.executable))
    assert notices(output) == [], output
    assert "2 passed" in output


def test_no_line_when_no_test_of_the_tier_was_skipped(tmp_path: Path):
    # the program is missing, but no test asked for it: there is nothing to announce
    source = PLANTED.replace("def test_needs_prometheus(prometheus_program):", "def test_other():")
    source = source.replace("assert prometheus_program", "pass")
    assert "prometheus_program" not in source
    output = passing_output(run_planted(tmp_path, source, prometheus=None))
    assert notices(output) == [], output
