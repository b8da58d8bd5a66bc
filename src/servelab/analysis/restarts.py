"""Restart records (§7.5, Figure 14): a small JSON format, its reader and the per-phase summary.

One file per restart, conventionally `results/restarts/{engine}/{rep}/restart.json`:

```json
{
  "engine": "vllm",
  "rep": "rep1",
  "events": {
    "deleted": 1730000000.0,
    "terminated": 1730000005.0,
    "scheduled": 1730000005.0,
    "pull_started": 1730000006.0,
    "pulled": 1730000010.0,
    "container_started": 1730000011.0,
    "ready": 1730000131.0
  }
}
```

Event times are unix seconds (Kubernetes event timestamps: 1 s resolution) and must be ordered as
listed. Any other top-level keys (`arm`, `backend`, `node`, ...) are kept but not used. Phases
(servelab.artifacts.restart_phases, which the restart experiment uses too): terminate =
terminated − deleted; schedule = scheduled − terminated; image pull = pulled − pull_started;
initialise = ready − container_started (bounded by the readiness probe); unmeasured gaps = the
rest of total = ready − deleted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.artifacts import (
    RESTART_EVENTS,
    RESTART_PHASES,
    ArtifactError,
    read_json,
    restart_events_out_of_order,
    restart_phases,
)

__all__ = [
    "RESTART_EVENTS",
    "RESTART_PHASES",
    "RestartRecord",
    "discover_restart_records",
    "read_restart_record",
    "summarise_restarts",
]


@dataclass(frozen=True)
class RestartRecord:
    engine: str
    rep: str
    path: str
    phases: dict[str, float]  # RESTART_PHASES, seconds
    total_s: float


def read_restart_record(path: str | os.PathLike[str]) -> RestartRecord:
    """Read and check one restart record; errors name the file and the offending event."""
    obj = read_json(path, ("engine", "rep", "events"))
    events = obj["events"]
    if not isinstance(events, dict):
        raise ArtifactError(f"{path}: events must be an object")
    missing = [e for e in RESTART_EVENTS if e not in events]
    if missing:
        raise ArtifactError(f"{path}: events missing {', '.join(missing)}")
    try:
        t = {e: float(events[e]) for e in RESTART_EVENTS}
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: event times must be numbers ({exc})") from exc
    reversed_pair = restart_events_out_of_order(t)
    if reversed_pair is not None:
        a, b = reversed_pair
        raise ArtifactError(f"{path}: event {b!r} ({t[b]}) precedes {a!r} ({t[a]})")
    phases = restart_phases(t)
    return RestartRecord(
        engine=str(obj["engine"]),
        rep=str(obj["rep"]),
        path=str(path),
        phases={p: phases[p] for p in RESTART_PHASES},
        total_s=phases["total"],
    )


def discover_restart_records(root: str | os.PathLike[str]) -> list[Path]:
    """Every `restart.json` under `root` (sorted); empty when `root` does not exist."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(root.rglob("restart.json"))


def summarise_restarts(records: Sequence[RestartRecord]) -> dict[str, dict[str, object]]:
    """Per engine: n, reps, mean of each phase, and total mean / min / max (seconds)."""
    out: dict[str, dict[str, object]] = {}
    for engine in sorted({r.engine for r in records}):
        mine = sorted((r for r in records if r.engine == engine), key=lambda r: (r.rep, r.path))
        totals = np.array([r.total_s for r in mine])
        out[engine] = {
            "n": len(mine),
            "reps": [r.rep for r in mine],
            "phase_mean_s": {
                p: float(np.mean([r.phases[p] for r in mine])) for p in RESTART_PHASES
            },
            "total_mean_s": float(totals.mean()),
            "total_min_s": float(totals.min()),
            "total_max_s": float(totals.max()),
        }
    return out
