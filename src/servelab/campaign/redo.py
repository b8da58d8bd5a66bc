"""The redo of chosen runs (`servelab campaign redo`): moves their measurements aside under
`results/redone/` with a reason, so the workflow measures them again. Nothing is ever deleted.
See docs/campaigns.md.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.artifacts import (
    ATTEMPTS_DIR,
    MEASURED_DIR,
    MEASUREMENT_KEY_FILE,
    next_generation_dir,
    write_json,
)
from servelab.campaign.status import PUBLISHED, run_folder
from servelab.grid.config import (
    Run,
    runs,
)

__all__ = [
    "RedoError",
    "Redone",
    "redo_runs",
]


# ----------------------------------------------------------------------------- redo


class RedoError(ValueError):
    """A redo refused before anything was moved."""


@dataclass(frozen=True)
class Redone:
    run_id: str
    folder: Path  # results/redone/{arm}/{engine}/{condition}/{rep}/NNN
    moved: tuple[str, ...]
    target: Path  # the run's run.json: the snakemake target that measures it again


def _run_of(run_id: str, grid: Mapping[str, Run]) -> Run:
    if run_id not in grid:
        raise RedoError(
            f"RUN_ID {run_id!r} is not a run of the configured grid "
            "(a run id is {arm}/{engine}/{condition}/{rep}, e.g. defaults/vllm/rate-0.28/rep1)"
        )
    return grid[run_id]


def _measurement_names(run_dir: Path) -> tuple[str, ...]:
    """What a redo moves: the sealed measurement, the failed attempts and the published files."""
    names = (MEASURED_DIR, ATTEMPTS_DIR, *PUBLISHED)
    return tuple(name for name in names if (run_dir / name).exists())


def redo_runs(
    config: Mapping[str, Any], results: str | Path, run_ids: Sequence[str], why: str
) -> list[Redone]:
    """Move each run's measurement under results/redone/ with a reason.json; delete nothing.

    Every id is checked first, so a bad one moves nothing. With each run's run.json among its
    targets (`Redone.target`), the workflow then plans the run's block again and measures that
    run only. Named, because Snakemake does not re-make a missing intermediate file when the
    targets downstream of it are present (snakemake/snakemake#1978, since 7.7).
    """
    if not why.strip():
        raise RedoError(
            "--why must say why the runs are measured again (it is kept in reason.json)"
        )
    if not run_ids:
        raise RedoError("RUN_ID: name at least one run")
    results = Path(results)
    grid = {run.id: run for run in runs(config)}
    chosen = [_run_of(run_id, grid) for run_id in dict.fromkeys(run_ids)]
    empty = [run.id for run in chosen if not _measurement_names(run_folder(results, run))]
    if empty:
        raise RedoError(
            f"RUN_ID {', '.join(empty)}: nothing measured under {results / 'runs'} to redo "
            "(the workflow measures a missing run anyway)"
        )
    done = []
    for run in chosen:
        run_dir = run_folder(results, run)
        names = _measurement_names(run_dir)
        key_file = run_dir / MEASURED_DIR / MEASUREMENT_KEY_FILE
        key = key_file.read_text(encoding="utf-8").strip() if key_file.is_file() else None
        folder = next_generation_dir(
            results / "redone" / run.arm / run.engine / run.condition / run.rep
        )
        # run.json first: from then on the run is unpublished, whatever else a kill interrupts
        for name in sorted(names, key=lambda n: n != "run.json"):
            shutil.move(os.fspath(run_dir / name), os.fspath(folder / name))
        write_json(
            folder / "reason.json",
            {
                "run_id": run.id,
                "why": why,
                "redone_at_unix_s": round(time.time(), 3),
                "measurement_key": key,
                "moved": list(names),
            },
        )
        done.append(Redone(run.id, folder, names, run_dir / "run.json"))
    return done
