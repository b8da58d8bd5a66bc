"""Where a result came from: servelab version and git commit, recorded in every run.json."""

from __future__ import annotations

import os
import re
import subprocess
from functools import cache
from pathlib import Path

from servelab import __version__

__all__ = ["COMMIT_ENV", "git_commit", "servelab_version"]

# Where servelab runs without its .git (the image the repository's Dockerfile builds), the commit
# it was built from, given at build time.
COMMIT_ENV = "SERVELAB_GIT_COMMIT"


def servelab_version() -> str:
    return __version__


@cache
def git_commit(cwd: str | None = None) -> str:
    """The commit of the checkout servelab runs from, "+dirty" if modified; outside git, the commit
    $SERVELAB_GIT_COMMIT names (a built image's), else "unknown"."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        given = os.environ.get(COMMIT_ENV, "").strip()
        return given if re.fullmatch(r"[0-9a-f]{7,64}", given) else "unknown"
    return sha + ("+dirty" if dirty else "")
