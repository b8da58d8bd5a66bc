"""The redo of chosen runs (`servelab campaign redo`): moves their measurements aside under
`results/redone/` with a reason, so the workflow measures them again. Nothing is ever deleted.
`redo --engine` does it for every run of one engine, both arms, and with them the engine's
unloaded floors (made before and after its loaded runs): the re-make of a deployment the
bracketing floor refused (docs/simulator.md, "The bracketing floor"). See docs/campaigns.md.
"""

from __future__ import annotations

import os
import re
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
    floor_blocks,
    runs,
)

__all__ = [
    "FLOOR_KINDS",
    "RedoError",
    "Redone",
    "RedoneEngine",
    "RedoneFloor",
    "redo_engine",
    "redo_runs",
]

# The roots a deployment's unloaded floor is made under: before its loaded runs, and with config
# `floor.bracket` again after them (workflow/rules/common.smk, FLOOR_DIR and FLOOR_AFTER_DIR).
FLOOR_KINDS = ("floor", "floor-after")


# ----------------------------------------------------------------------------- redo


class RedoError(ValueError):
    """A redo refused before anything was moved."""


@dataclass(frozen=True)
class Redone:
    run_id: str
    folder: Path  # results/redone/{arm}/{engine}/{condition}/{rep}/NNN
    moved: tuple[str, ...]
    target: Path  # the run's run.json: the snakemake target that measures it again


@dataclass(frozen=True)
class RedoneFloor:
    deployment: str
    kind: str  # "floor" (before the loaded runs) or "floor-after"
    folder: Path  # results/redone/{kind}/{deployment}/NNN, holding the moved runs/ folder


@dataclass(frozen=True)
class RedoneEngine:
    engine: str
    runs: tuple[Redone, ...]
    floors: tuple[RedoneFloor, ...]
    # The run.json files to name beside the comparison's target (the redone runs', else the
    # engine's first run's): any one brings the engine's floors, runs and floors after back into
    # the plan, which the target alone does not (snakemake/snakemake#1978).
    targets: tuple[Path, ...]


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
    return _move_runs(results, chosen, why)


def _move_runs(results: Path, chosen: Sequence[Run], why: str) -> list[Redone]:
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


def redo_engine(
    config: Mapping[str, Any], results: str | Path, engine: str, why: str
) -> RedoneEngine:
    """Move aside every measured run of `engine`, in every arm, and every floor of its
    deployments (before and after the loaded runs), each with a reason.json; delete nothing.

    The re-make of a deployment the bracketing floor refused: the CPU platform's fit pools an
    engine's arms, so both are floored and run again together, within one invocation, or the fit
    mixes floors made at different speeds of the machine (docs/simulator.md, "An eighteenth
    measurement"). The engine is checked first, so a bad one moves nothing."""
    if not why.strip():
        raise RedoError(
            "--why must say why the runs are measured again (it is kept in reason.json)"
        )
    engines = sorted(name for name, spec in (config.get("engines") or {}).items() if spec)
    if engine not in engines:
        raise RedoError(
            f"--engine {engine!r} is not an engine of the configuration "
            f"(config `engines`: {', '.join(engines)})"
        )
    results = Path(results)
    engine_runs = [run for run in runs(config) if run.engine == engine]
    # Every repetition measured on disk, not only the configuration's: a campaign made with
    # `snakemake --config repetitions=4` has more repetitions than its configuration files say.
    blocks = {(run.arm, run.condition): run_folder(results, run).parent for run in engine_runs}
    measured = [
        Run(arm, engine, condition, rep.name)
        for (arm, condition), block in blocks.items()
        for rep in sorted(block.glob("rep*"), key=lambda p: (len(p.name), p.name))
        if re.fullmatch(r"rep\d+", rep.name) and _measurement_names(rep)
    ]
    deployments = sorted(
        {block.deployment.id for block in floor_blocks(config) if block.deployment.engine == engine}
    )
    floors = [
        (kind, deployment)
        for kind in FLOOR_KINDS
        for deployment in deployments
        if (results / kind / deployment).is_dir()
    ]
    if not measured and not floors:
        raise RedoError(
            f"--engine {engine}: nothing measured under {results} to redo "
            "(the workflow measures a missing run anyway)"
        )
    # The floors after first: from then on the comparison cannot judge the engine's deployments
    # on a half-moved bracket, whatever a kill interrupts.
    moved_floors = []
    for kind, deployment in sorted(floors, key=lambda f: f[0] != "floor-after"):
        folder = next_generation_dir(results / "redone" / kind / deployment)
        source = results / kind / deployment
        names = tuple(sorted(p.name for p in source.iterdir()))
        for name in names:
            shutil.move(os.fspath(source / name), os.fspath(folder / name))
        source.rmdir()  # emptied: the workflow makes it again
        write_json(
            folder / "reason.json",
            {
                "deployment": deployment,
                "kind": kind,
                "engine": engine,
                "why": why,
                "redone_at_unix_s": round(time.time(), 3),
                "moved": list(names),
            },
        )
        moved_floors.append(RedoneFloor(deployment, kind, folder))
    moved_runs = _move_runs(results, measured, why)
    targets = [run.target for run in moved_runs] or [
        run_folder(results, engine_runs[0]) / "run.json"
    ]
    return RedoneEngine(engine, tuple(moved_runs), tuple(moved_floors), tuple(targets))
