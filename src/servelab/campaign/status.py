"""A campaign's status, during and after: every run of the grid with its state, attempts, node and
wall time (`servelab campaign status`, `results/campaign_status.csv`).

A pure function of the configuration and the results folder: it reads the artifacts the campaign
writes (`run.json`, `attempts/`, the `reason.json` of `results/discarded/` and `results/redone/`)
and never a backend, so it answers the same on a laptop holding a copy of a GPU campaign's
results. See docs/campaigns.md.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from servelab.artifacts import (
    ATTEMPTS_DIR,
    RUN_FILES,
    ArtifactError,
    read_json,
    read_run_json,
    write_text,
)
from servelab.grid.config import (
    Run,
    runs,
)

__all__ = [
    "STATUS_COLUMNS",
    "RunStatus",
    "artifacts_fingerprint",
    "campaign_status",
    "format_status",
    "run_folder",
    "run_status",
    "status_csv",
    "write_status_csv",
]


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


def run_folder(results: Path, run: Run) -> Path:
    """The folder of one run: results/runs/{arm}/{engine}/{condition}/{rep}."""
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
    run_dir = run_folder(results, run)
    discards = _discard_generations(results, run)
    common: dict[str, Any] = {
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
