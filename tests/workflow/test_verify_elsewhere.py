"""A bundle made here verifies elsewhere: another clone, another path, a fresh locked environment.

The session's tiny sim campaign (tests/conftest.py's `tiny_campaign`) ran the real workflow up to
`results/bundle.tar.gz`; the bundle is copied away from it; a `git clone` of this repository at
another path builds `.venv-verify` from `requirements/verify.lock` with `make verify`, which must
regenerate every output from the bundle alone and find it identical.

The clone is of HEAD: uncommitted changes are not in it (CI tests a clean clone of main, where
that is the same thing). The environment is built from the lock by pip, which fetches nothing that
its cache (or a local mirror) already holds; on CI's two cores it takes about a minute. Nothing here
skips: a missing bundle rule or module fails the campaign fixture, a missing Makefile target fails
`make verify`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from campaigns import Workdir

REPO = Path(__file__).resolve().parents[2]
VERIFIED_PREFIX = "verified: every output identical"
BUNDLE_TARGET = "results/bundle.tar.gz"
ENVIRONMENT_TIMEOUT_S = 900  # a cold pip cache downloads every locked wheel
VERIFY_TIMEOUT_S = 300


def _run(
    argv: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _tail(result: subprocess.CompletedProcess[str], lines: int = 40) -> str:
    return "\n".join((result.stdout + result.stderr).strip().splitlines()[-lines:])


def test_a_bundle_made_here_is_verified_identical_in_a_fresh_clone(
    tmp_path: Path, tiny_campaign: Workdir
) -> None:
    second, elsewhere = tmp_path / "second", tmp_path / "elsewhere"
    cloned = _run(["git", "clone", "--quiet", str(REPO), str(second)], tmp_path, 120)
    assert cloned.returncode == 0, _tail(cloned)
    environment = _run(
        ["make", "--no-print-directory", "-C", str(second), ".venv-verify/.installed"],
        tmp_path,
        ENVIRONMENT_TIMEOUT_S,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert environment.returncode == 0, f"building .venv-verify failed:\n{_tail(environment)}"

    # Nothing of the first place comes along but the bundle: verify needs no config beside it.
    elsewhere.mkdir()
    bundle = elsewhere / "bundle.tar.gz"
    shutil.copy(tiny_campaign.path / BUNDLE_TARGET, bundle)

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
