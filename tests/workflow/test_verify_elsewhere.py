"""A bundle made here verifies elsewhere: another clone, another path, a fresh locked environment.

A tiny sim campaign runs the real workflow up to `results/bundle.tar.gz` in one folder (with the
environment the tests run in); the bundle is moved away and that folder deleted; a `git clone` of
this repository at another path builds `.venv-verify` from `requirements/verify.lock` with
`make verify`, which must regenerate every output from the bundle alone and find it identical.

The clone is of HEAD: uncommitted changes are not in it (CI tests a clean clone of main, where
that is the same thing). The environment is built from the lock by pip, which fetches nothing that
its cache (or a local mirror) already holds; on CI's two cores it takes about two minutes, built
while the campaign runs.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
VERIFIED_PREFIX = "verified: every output identical"
BUNDLE_TARGET = "results/bundle.tar.gz"
CAMPAIGN_TIMEOUT_S = 600
ENVIRONMENT_TIMEOUT_S = 900  # a cold pip cache downloads every locked wheel
VERIFY_TIMEOUT_S = 300

pytestmark = pytest.mark.slow


def tiny_campaign_config(study: dict) -> dict:
    """One short condition, two repetitions, both engines, the defaults arm only (as
    tests/orchestration/conftest.py's `tiny_config`)."""
    cfg = copy.deepcopy(study)
    cfg["repetitions"] = 2
    cfg["conditions"] = [
        {"sweep": "rate", "rate": 0.28, "sharing": 0.9, "prompt_tokens": 1024, "duration_s": 40}
    ]
    cfg["arms"] = {"defaults": copy.deepcopy(study["arms"]["defaults"])}
    cfg["dispatch"]["warmup_requests"] = 2
    cfg["campaign"]["faults"] = []
    return cfg


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _tail(result: subprocess.CompletedProcess[str], lines: int = 40) -> str:
    return "\n".join((result.stdout + result.stderr).strip().splitlines()[-lines:])


def _skip_unless_bundling_is_available(workdir: Path) -> None:
    if importlib.util.find_spec("servelab.bundle") is None:
        pytest.skip("servelab bundle/verify is not importable yet (src/servelab/bundle.py)")
    committed = _run(["git", "cat-file", "-e", "HEAD:src/servelab/bundle.py"], REPO, 30)
    if committed.returncode != 0:
        pytest.skip("HEAD has no src/servelab/bundle.py yet: the clone could not run verify")
    dry = _run([*_snakemake(), "-n", BUNDLE_TARGET], workdir, 120)
    if "MissingRuleException" in dry.stdout + dry.stderr:
        pytest.skip(f"the workflow has no rule for {BUNDLE_TARGET} yet")


def _snakemake() -> list[str]:
    return [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile")]


def _build_locked_environment(clone: Path, log: Path) -> subprocess.Popen[bytes]:
    """`make verify`'s environment, built in the background while the campaign runs."""
    with log.open("wb") as out:
        return subprocess.Popen(
            ["make", "--no-print-directory", "-C", str(clone), ".venv-verify/.installed"],
            env={**os.environ, "PYTHON": sys.executable},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout ends pip too
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _wait(process: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        pytest.fail(f"building .venv-verify took over {timeout} s:\n{log.read_text()[-3000:]}")
    assert returncode == 0, f"building .venv-verify failed:\n{log.read_text()[-3000:]}"


def test_a_bundle_made_here_is_verified_identical_in_a_fresh_clone(tmp_path: Path) -> None:
    first, second, elsewhere = tmp_path / "first", tmp_path / "second", tmp_path / "elsewhere"
    study = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    (first / "config").mkdir(parents=True)
    (first / "config" / "config.yaml").write_text(
        yaml.safe_dump(tiny_campaign_config(study), sort_keys=False)
    )
    _skip_unless_bundling_is_available(first)

    cloned = _run(["git", "clone", "--quiet", str(REPO), str(second)], tmp_path, 120)
    assert cloned.returncode == 0, _tail(cloned)
    environment_log = tmp_path / "venv-verify.log"
    environment = _build_locked_environment(second, environment_log)
    campaign: subprocess.CompletedProcess[str] | None = None
    try:
        campaign = _run([*_snakemake(), "--cores", "1", BUNDLE_TARGET], first, CAMPAIGN_TIMEOUT_S)
    finally:
        if campaign is None or campaign.returncode != 0:
            _stop(environment)  # the test fails here: no point waiting for pip
    assert campaign is not None
    assert campaign.returncode == 0, _tail(campaign)
    _wait(environment, ENVIRONMENT_TIMEOUT_S, environment_log)

    # Nothing of the first place survives but the bundle: verify needs no config beside it.
    elsewhere.mkdir()
    bundle = elsewhere / "bundle.tar.gz"
    shutil.move(first / BUNDLE_TARGET, bundle)
    shutil.rmtree(first)

    # The environment is the clone's own: its servelab is the clone's source, not this one's.
    where = _run(
        [
            str(second / ".venv-verify" / "bin" / "python"),
            *("-c", "import servelab; print(servelab.__file__)"),
        ],
        elsewhere,
        60,
    )
    assert where.returncode == 0, _tail(where)
    assert Path(where.stdout.strip()).is_relative_to(second / "src"), where.stdout

    verified = _run(
        ["make", "--no-print-directory", "-C", str(second), "verify", f"BUNDLE={bundle}"],
        elsewhere,
        VERIFY_TIMEOUT_S,
    )
    assert verified.returncode == 0, _tail(verified)
    report_lines = [line for line in verified.stdout.splitlines() if line.strip()]
    assert report_lines, _tail(verified)
    assert report_lines[-1].startswith(VERIFIED_PREFIX), _tail(verified)
