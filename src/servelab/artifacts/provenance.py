"""Where a result came from: servelab version and git commit, recorded in every run.json."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

from servelab import __version__

__all__ = ["git_commit", "servelab_version"]


def servelab_version() -> str:
    return __version__


@cache
def git_commit(cwd: str | None = None) -> str:
    """The commit of the checkout servelab runs from ("unknown" outside git), "+dirty" if modified."""
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
        return "unknown"
    return sha + ("+dirty" if dirty else "")
