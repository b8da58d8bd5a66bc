"""Helpers for the Snakemake side: route an adapter's logging to its rule's log
(workflow/scripts), the one line the workflow ends with (the Snakefile's handlers), and whether
the command asks for an ablation (workflow/rules/ablations.smk)."""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["ABLATIONS_ENV", "ablations_requested", "log_to", "requested_targets", "summary_line"]

# Set to 1 to load every ablation whatever the command asks for (`snakemake --lint`, the API), to 0
# to load none.
ABLATIONS_ENV = "SERVELAB_ABLATIONS"

# More files than this in one folder are named by the folder and their count (Figures: 28 files).
FILES_NAMED_PER_FOLDER = 3


@contextlib.contextmanager
def log_to(path: str) -> Iterator[logging.Logger]:
    """Send logging, warnings and any uncaught exception's traceback to the rule's log file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("a", encoding="utf-8", buffering=1) as log_file:
        handler = logging.StreamHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        logging.getLogger("fontTools").setLevel(logging.WARNING)  # PDF font subsetting chatter
        logging.captureWarnings(True)
        try:
            yield logging.getLogger("servelab")
        except BaseException:
            log_file.write(traceback.format_exc())
            raise
        finally:
            root.removeHandler(handler)
            sys.stderr.flush()


def requested_targets(workflow: Any) -> list[str]:
    """The files the command asked for: a target file itself, a target rule's outputs, or, for a
    rule without outputs such as `all`, its inputs. `workflow` is the Snakefile's `workflow`."""
    found: dict[str, None] = {}
    for job in workflow.dag.targetjobs:
        found.update(dict.fromkeys(str(f) for f in (job.output or job.input)))
    return sorted(found)


def summary_line(targets: Iterable[str], started_s: float, *, failed: bool = False) -> str:
    """One line naming what the workflow wrote: targets modified since `started_s` (wall-clock
    seconds) are written, older ones up to date, absent ones not made (only after a failure)."""
    written: list[str] = []
    current: list[str] = []
    missing: list[str] = []
    for target in targets:
        path = Path(target)
        if not path.exists():
            missing.append(target)
        elif path.stat().st_mtime >= started_s:
            written.append(target)
        else:
            current.append(target)
    parts = [f"wrote {_compact(written)}" if written else "wrote nothing"]
    if current:
        parts.append(f"up to date: {_compact(current)}")
    if missing:
        parts.append(f"not made: {_compact(missing)}")
    head = "servelab: some jobs failed (their errors are above); " if failed else "servelab: "
    return head + "; ".join(parts)


def _compact(paths: list[str]) -> str:
    """Paths in order, a folder's files collapsed into `folder/ (N files)` when there are many."""
    by_folder: dict[str, list[str]] = {}
    for p in paths:
        by_folder.setdefault(str(Path(p).parent), []).append(p)
    named: list[str] = []
    for folder, files in by_folder.items():
        if len(files) > FILES_NAMED_PER_FOLDER:
            named.append(f"{folder}/ ({len(files)} files)")
        else:
            named.extend(files)
    return ", ".join(named)


def ablations_requested(argv: Iterable[str], environ: Mapping[str, str]) -> bool:
    """Whether a snakemake command (its arguments after the program) asks for an ablation: a word
    of it names one (the target `ablations`, a rule `ablation_*`, a path under
    results/ablations/), or ABLATIONS_ENV is 1. Each ablation is the whole workflow again as a
    module, parsed anew (seconds per ablation), so a command that asks for none loads none."""
    forced = environ.get(ABLATIONS_ENV)
    if forced is not None:
        return forced.strip() == "1"
    return any("ablation" in word for word in argv)
