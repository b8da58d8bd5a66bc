"""A campaign's plan (before), status (during and after) and the redo of chosen runs.

Everything here is a pure function of the configuration and the results folder: it reads the
artifacts the campaign writes (`run.json`, `attempts/`, the `reason.json` of
`results/discarded/` and `results/redone/`) and
never a backend, so it answers the same on a laptop holding a copy of a GPU campaign's results.

- `plan_campaign`: the runs a target would measure, grouped by deployment, with their load,
  warm-up, pauses and deployment start-ups summed into GPU-hours (`servelab campaign plan`).
- `campaign_status`: every run of the grid with its state, attempts, node and wall time
  (`servelab campaign status`, `results/campaign_status.csv`).
- `redo_runs`: moves chosen runs' measurements aside with a reason, so the workflow measures them
  again (`servelab campaign redo`). Nothing is ever deleted.

See docs/campaigns.md.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from servelab.artifacts import (
    ATTEMPTS_DIR,
    MEASURED_DIR,
    MEASUREMENT_KEY_FILE,
    RUN_FILES,
    ArtifactError,
    next_generation_dir,
    read_json,
    read_run_json,
    write_json,
    write_text,
)
from servelab.config import (
    Run,
    analysis_settings,
    conditions,
    deployment_for,
    floor_blocks,
    floor_settings,
    reps,
    runs,
)
from servelab.settings import CampaignSettings, DispatchSettings, KubernetesSettings

__all__ = [
    "STATUS_COLUMNS",
    "TARGETS",
    "CampaignPlan",
    "DeploymentPlan",
    "RedoError",
    "Redone",
    "RunStatus",
    "artifacts_fingerprint",
    "campaign_status",
    "format_plan",
    "format_status",
    "paired_conditions",
    "plan_campaign",
    "redo_runs",
    "run_status",
    "status_csv",
    "target_runs",
    "write_status_csv",
]

# ----------------------------------------------------------------------------- targets


def paired_conditions(config: Mapping[str, Any]) -> list[str]:
    """Conditions that every engine runs in every arm: the rows of Tables 4-6."""
    run_ids = {run.id for run in runs(config)}
    first_rep = reps(config)[0]
    return [
        condition
        for condition in conditions(config)
        if all(
            f"{arm}/{engine}/{condition}/{first_rep}" in run_ids
            for arm in config["arms"]
            for engine in config["engines"]
        )
    ]


# What each target needs measured, as the rules of workflow/rules/analysis.smk read it.
TARGETS: dict[str, str] = {
    "table3": "every run of the grid",
    "table4": "SGLang's runs of the paired conditions",
    "table5": "every run of the paired conditions",
    "table6": "every run of the paired conditions",
    "figures": "every run of the grid",
    "numbers": "every run of the grid",
    "all": "every run of the grid",
}


def target_runs(config: Mapping[str, Any], target: str) -> list[Run]:
    """The runs of the grid that `target` reads, in campaign (deployment) order."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: one of {', '.join(TARGETS)}")
    grid = runs(config)
    if target in ("table4", "table5", "table6"):
        paired = set(paired_conditions(config))
        grid = [run for run in grid if run.condition in paired]
    if target == "table4":  # Table 4: the control engine's two deployments (the study's SGLang)
        engines = analysis_settings(config)["engines"]
        grid = [run for run in grid if len(engines) == 2 and run.engine == engines[1]]
    return grid


# ----------------------------------------------------------------------------- status

State = Literal["done", "failed", "discarded", "missing"]
# A published run.json in one of these is final: the workflow will not measure it again.
FINAL_RUN_STATUSES = ("ok", "failed")
# What a run directory publishes: the run job's three files and the telemetry job's table.
PUBLISHED = (*RUN_FILES, "telemetry.parquet")


@dataclass(frozen=True)
class RunStatus:
    """One run's state, read from its artifacts. `record_status` is run.json's `status`."""

    run_id: str
    arm: str
    engine: str
    condition: str
    rep: str
    state: State
    attempts: int
    node: str
    wall_s: float | None
    reason: str
    discards: int
    record_status: str | None = None

    @property
    def needs_measuring(self) -> bool:
        """No published run.json, or one that is not final."""
        return self.record_status not in FINAL_RUN_STATUSES


# The columns of results/campaign_status.csv, in order.
STATUS_COLUMNS = tuple(f.name for f in fields(RunStatus) if f.name != "record_status")


def _run_dir(results: Path, run: Run) -> Path:
    return results / "runs" / run.arm / run.engine / run.condition / run.rep


def _kept_attempts(run_dir: Path) -> int:
    folder = run_dir / ATTEMPTS_DIR
    if not folder.is_dir():
        return 0
    return sum(1 for p in folder.glob("attempt-*") if p.name.split("-", 1)[1].isdigit())


def _discard_generations(results: Path, run: Run) -> list[dict[str, Any]]:
    """The reason.json of every discard generation that holds this run's rep, oldest first."""
    root = results / "discarded" / run.arm / run.engine / run.condition
    if not root.is_dir():
        return []
    found = []
    for generation in sorted(p for p in root.iterdir() if p.name.isdigit()):
        reason_file = generation / "reason.json"
        try:
            reason = read_json(reason_file)
        except ArtifactError:
            continue  # a generation being written (or damaged) holds no usable reason
        if run.rep in reason.get("discarded_reps", []):
            found.append(reason)
    return found


def _latest_redo(results: Path, run: Run) -> dict[str, Any] | None:
    """The reason.json of the run's latest redo generation, if it was ever redone."""
    root = results / "redone" / run.arm / run.engine / run.condition / run.rep
    if not root.is_dir():
        return None
    for generation in sorted((p for p in root.iterdir() if p.name.isdigit()), reverse=True):
        try:
            return read_json(generation / "reason.json")
        except ArtifactError:
            continue  # a redo being written: its files are moved before its reason
    return None


def _node_name(record: Mapping[str, Any]) -> str:
    node = record.get("node")
    if not isinstance(node, Mapping):
        return ""
    for end in ("end", "start"):
        side = node.get(end)
        if isinstance(side, Mapping) and side.get("name"):
            return str(side["name"])
    return ""


def _failure_reason(record: Mapping[str, Any]) -> str:
    for key in ("error", "interrupted_reason", "reclaimed_reason"):
        if record.get(key):
            return str(record[key])
    return (
        f"status {record['status']}: {record.get('n_ok', 0)}/{record.get('n_sent', 0)} requests ok"
    )


def run_status(results: str | Path, run: Run) -> RunStatus:
    """The state of one run from its artifacts alone."""
    results = Path(results)
    run_dir = _run_dir(results, run)
    discards = _discard_generations(results, run)
    common = {
        "run_id": run.id,
        "arm": run.arm,
        "engine": run.engine,
        "condition": run.condition,
        "rep": run.rep,
        "discards": len(discards),
    }
    run_json = run_dir / "run.json"
    if run_json.is_file():
        try:
            record = read_run_json(run_json)
        except ArtifactError as exc:
            return RunStatus(
                **common,
                state="failed",
                attempts=_kept_attempts(run_dir),
                node="",
                wall_s=None,
                reason=f"unreadable run.json: {exc}",
            )
        done = record["status"] == "ok"
        return RunStatus(
            **common,
            state="done" if done else "failed",
            attempts=int(record.get("attempt", 1)),
            node=_node_name(record),
            wall_s=round(float(record["end_unix_s"]) - float(record["start_unix_s"]), 3),
            reason="" if done else _failure_reason(record),
            record_status=str(record["status"]),
        )
    redo = _latest_redo(results, run)
    discarded_at = float(discards[-1].get("discarded_at_unix_s", 0)) if discards else None
    if redo is not None and (
        discarded_at is None or float(redo.get("redone_at_unix_s", 0)) >= discarded_at
    ):
        # moved aside on purpose after any discard: the workflow measures it again
        return RunStatus(
            **common,
            state="missing",
            attempts=_kept_attempts(run_dir),
            node="",
            wall_s=None,
            reason=f"redone: {redo.get('why', '')}",
        )
    if discards:
        return RunStatus(
            **common,
            state="discarded",
            attempts=_kept_attempts(run_dir),
            node="",
            wall_s=None,
            reason=str(discards[-1].get("reason", "")),
        )
    return RunStatus(
        **common, state="missing", attempts=_kept_attempts(run_dir), node="", wall_s=None, reason=""
    )


def campaign_status(config: Mapping[str, Any], results: str | Path) -> list[RunStatus]:
    """Every run of the grid, in campaign order, with its state."""
    return [run_status(results, run) for run in runs(config)]


def status_csv(rows: Iterable[RunStatus]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(STATUS_COLUMNS)
    for row in rows:
        values = [getattr(row, name) for name in STATUS_COLUMNS]
        writer.writerow(["" if v is None else v for v in values])
    return out.getvalue()


def write_status_csv(config: Mapping[str, Any], results: str | Path, path: str | Path) -> None:
    write_text(path, status_csv(campaign_status(config, results)))


def format_status(rows: Sequence[RunStatus]) -> str:
    """A table for people: one line per run, then the count of each state."""
    header = ("run", "state", "attempts", "node", "wall_s", "discards", "reason")
    lines = [
        (
            r.run_id,
            r.state,
            str(r.attempts),
            r.node,
            "" if r.wall_s is None else f"{r.wall_s:.0f}",
            str(r.discards),
            r.reason,
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header[:-1])]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True))
        + "  "
        + line[-1]
        for line in [header, *lines]
    ]
    counts = {state: sum(r.state == state for r in rows) for state in get_args(State)}
    text.append(f"{len(rows)} runs: " + ", ".join(f"{n} {state}" for state, n in counts.items()))
    return "\n".join(line.rstrip() for line in text) + "\n"


def artifacts_fingerprint(results: str | Path) -> str:
    """A digest of the files the status reads (names, sizes, mtimes): changes when any run's
    state may have, so the status rule is rebuilt then and only then."""
    results = Path(results)
    digest = hashlib.sha256()
    for top, name in (
        ("runs", "run.json"),
        ("discarded", "reason.json"),
        ("redone", "reason.json"),
    ):
        for path in sorted((results / top).rglob(name)):
            stat = path.stat()
            digest.update(
                f"{path.relative_to(results)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()
            )
    for path in sorted((results / "runs").rglob("attempt-*")):
        digest.update(f"{path.relative_to(results)}\n".encode())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- plan

# Deployment start-up, seconds, per backend. kubernetes: model load plus CUDA-graph capture of an
# 8B model on an L4 takes 3-5 minutes (docs/kubernetes.md's Fig. 14 restart: 157 s from delete to
# Ready with the image already on the node); the upper end, since a first start also pulls the
# image. `kubernetes.timeouts.ready_s` is the worst case the plan also prints. local: a sim server
# process (Python start-up and imports, then /health). sim: nothing starts (virtual time).
KUBERNETES_STARTUP_S = 300.0
LOCAL_STARTUP_S = 10.0
STARTUP_ESTIMATE_S = {"sim": 0.0, "local": LOCAL_STARTUP_S, "kubernetes": KUBERNETES_STARTUP_S}
# The warm-up requests of a run are sent at once (128-token prompts, 16 output tokens) and finish
# as one batch; seconds on a GPU. Generous: a run's warm-up is small next to its load.
WARMUP_ESTIMATE_S = 10.0


@dataclass(frozen=True)
class DeploymentPlan:
    """The runs of one deployment a target would measure, and the GPU time they take."""

    deployment_id: str
    runs: tuple[str, ...]
    load_s: float  # the conditions' arrival windows (duration_s), summed
    warmup_s: float
    pauses_s: float
    startup_s: float

    @property
    def total_s(self) -> float:
        return self.load_s + self.warmup_s + self.pauses_s + self.startup_s


@dataclass(frozen=True)
class CampaignPlan:
    target: str
    backend: str
    runs_in_target: int
    deployments: tuple[DeploymentPlan, ...]
    startup_each_s: float
    worst_startup_each_s: float | None  # kubernetes: timeouts.ready_s
    floor_runs: int = 0  # `all` also measures the unloaded floors (not in the hours)

    def total(self, part: str) -> float:
        return sum(getattr(d, part) for d in self.deployments)

    @property
    def runs_to_measure(self) -> int:
        return sum(len(d.runs) for d in self.deployments)

    @property
    def gpu_hours(self) -> float:
        return self.total("total_s") / 3600.0

    @property
    def worst_case_gpu_hours(self) -> float | None:
        if self.worst_startup_each_s is None:
            return None
        extra = len(self.deployments) * (self.worst_startup_each_s - self.startup_each_s)
        return (self.total("total_s") + extra) / 3600.0


def plan_campaign(
    config: Mapping[str, Any], target: str, results: str | Path = "results"
) -> CampaignPlan:
    """What `target` would measure from the state of `results`: each run whose run.json is
    missing or not final, grouped by deployment, one start-up per deployment with such a run."""
    backend = str(config["backend"])
    condition_of = conditions(config)
    warmups = DispatchSettings.from_section(config["dispatch"]).warmup_requests
    pause = CampaignSettings.from_section(config["campaign"]).pause_between_runs_s
    startup = STARTUP_ESTIMATE_S[backend]
    worst = (
        KubernetesSettings.from_section(config.get("kubernetes")).timeouts.ready_s
        if backend == "kubernetes"
        else None
    )
    selected = target_runs(config, target)
    grouped: dict[str, list[Run]] = {}
    for run in selected:
        if run_status(results, run).needs_measuring:
            deployment = deployment_for(config, run.arm, run.engine, run.condition).id
            grouped.setdefault(deployment, []).append(run)
    plans = tuple(
        DeploymentPlan(
            deployment_id=deployment,
            runs=tuple(run.id for run in group),
            load_s=sum(condition_of[run.condition].duration_s for run in group),
            warmup_s=len(group) * (WARMUP_ESTIMATE_S if warmups > 0 else 0.0),
            pauses_s=len(group) * pause,
            startup_s=startup,
        )
        for deployment, group in grouped.items()
    )
    return CampaignPlan(
        target=target,
        backend=backend,
        runs_in_target=len(selected),
        deployments=plans,
        startup_each_s=startup,
        worst_startup_each_s=worst,
        floor_runs=(
            len(floor_blocks(config)) * floor_settings(config)["repetitions"]
            if target == "all"
            else 0
        ),
    )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600.0:.2f}"


def format_plan(plan: CampaignPlan) -> str:
    """The plan as a table (hours per deployment) and a total."""
    header = ("deployment", "runs", "load_h", "warmup_h", "pauses_h", "startup_h", "gpu_h")
    rows = [
        (
            d.deployment_id,
            str(len(d.runs)),
            _hours(d.load_s),
            _hours(d.warmup_s),
            _hours(d.pauses_s),
            _hours(d.startup_s),
            _hours(d.total_s),
        )
        for d in plan.deployments
    ]
    parts = ("load_s", "warmup_s", "pauses_s", "startup_s", "total_s")
    total = ("total", str(plan.runs_to_measure), *(_hours(plan.total(p)) for p in parts))
    table = [header, *rows, total]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [
        f"target {plan.target} ({TARGETS[plan.target]}), backend {plan.backend}: "
        f"{plan.runs_to_measure} of its {plan.runs_in_target} runs to measure, "
        f"{len(plan.deployments)} deployment(s)",
        *(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
            for row in table
        ),
        f"GPU-hours: {plan.gpu_hours:.2f} (load {_hours(plan.total('load_s'))} h: the conditions' "
        f"duration_s; warm-ups {WARMUP_ESTIMATE_S:.0f} s per run; pauses "
        f"campaign.pause_between_runs_s per run; start-ups {plan.startup_each_s:.0f} s per "
        "deployment, an estimate)",
    ]
    if plan.worst_case_gpu_hours is not None:
        lines.append(
            f"worst case, every start-up taking kubernetes.timeouts.ready_s "
            f"({plan.worst_startup_each_s:.0f} s): {plan.worst_case_gpu_hours:.2f} GPU-hours"
        )
    if plan.floor_runs:
        lines.append(
            f"not in these hours: {plan.floor_runs} unloaded-floor run(s) of results/floor.csv "
            "(closed loop, floor.requests requests one at a time: a floor's length is not known "
            "before it runs; docs/capacity.md gives the study grid's on the sim)"
        )
    if plan.backend == "sim":
        lines.append("backend sim: the simulator runs these in virtual time, on no GPU")
    return "\n".join(line.rstrip() for line in lines) + "\n"


# ----------------------------------------------------------------------------- redo


class RedoError(ValueError):
    """A redo refused before anything was moved."""


@dataclass(frozen=True)
class Redone:
    run_id: str
    folder: Path  # results/redone/{arm}/{engine}/{condition}/{rep}/NNN
    moved: tuple[str, ...]


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

    Every id is checked first, so a bad one moves nothing. The workflow then plans the run's
    block again (its run.json is missing) and measures that run only.
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
    empty = [run.id for run in chosen if not _measurement_names(_run_dir(results, run))]
    if empty:
        raise RedoError(
            f"RUN_ID {', '.join(empty)}: nothing measured under {results / 'runs'} to redo "
            "(the workflow measures a missing run anyway)"
        )
    done = []
    for run in chosen:
        run_dir = _run_dir(results, run)
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
        done.append(Redone(run.id, folder, names))
    return done
