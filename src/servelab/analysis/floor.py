"""results/floor.csv: each deployment's unloaded floor, one request at a time (seed 002, step 2).

A floor run replays a closed-loop chain (servelab.workload.floor): every request is sent when the
one before it has finished, so the engine serves one request on an otherwise idle GPU: no queue,
no batching. Its TTFT, TPOT, ITL and E2E percentiles (the definitions of servelab.analysis.slo)
are the denominator of slowdown-relative SLOs, and say whether an absolute SLO is reachable at all
on this model and GPU. `max_in_flight` is measured from the requests' own send and last-chunk
times: 1 confirms the run was one request at a time (a larger value means it was not a floor).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from servelab.analysis.reduce import RequestMetrics, latency_sample, reduce_requests
from servelab.analysis.slo import (
    LATENCY_METRICS,
    METRIC_DEFINITIONS,
    PERCENTILES,
    csv_cell,
    latency_percentiles,
    latency_values,
)
from servelab.artifacts import REQUESTS_SCHEMA, read_parquet, read_run_json, write_text
from servelab.grid.config import FloorShape

__all__ = ["max_in_flight", "write_floor"]


def max_in_flight(req: RequestMetrics) -> int:
    """The most trace requests in flight at once: each from its send to its last chunk (a request
    sent at the instant another's last chunk arrives does not overlap it)."""
    rows = ~req.warmup & np.isfinite(req.sent) & np.isfinite(req.last_chunk)
    if not rows.any():
        return 0
    starts = np.sort(req.sent[rows])
    ends = np.sort(req.last_chunk[rows])
    # in flight just after each send: sends so far minus requests already ended (end <= send)
    ended = np.searchsorted(ends, starts, side="right")
    return int((np.arange(1, starts.size + 1) - ended).max())


def write_floor(run_dirs: Sequence[str | Path], out_csv: str | Path) -> Path:
    """results/floor.csv: one row per (deployment, shape), its repetitions pooled, and
    `<out>.json` beside it with the definitions. Every floor run must have status ok: a floor is
    the denominator of other numbers, so one that failed is an error, not a gap."""
    if not run_dirs:
        raise ValueError(f"{out_csv}: no floor runs")
    groups: dict[tuple[str, str, str, str], list[tuple[dict[str, Any], RequestMetrics]]] = {}
    for raw in run_dirs:
        run_dir = Path(raw)
        record = read_run_json(run_dir / "run.json")
        if record["status"] != "ok":
            raise ValueError(
                f"{run_dir / 'run.json'}: floor run {record['run_id']} has status "
                f"{record['status']!r}; redo it (docs/campaigns.md) before reading the floor"
            )
        table = read_parquet(run_dir / "requests.parquet", REQUESTS_SCHEMA)
        req = reduce_requests(table, str(run_dir / "requests.parquet"))
        key = (record["deployment_id"], record["arm"], record["engine"], record["condition"])
        groups.setdefault(key, []).append((record, req))
    rows: list[dict[str, object]] = []
    for (deployment, arm, engine, floor), runs in sorted(groups.items()):
        shape = FloorShape.from_id(floor)
        pooled: dict[str, list[npt.NDArray[np.float64]]] = {}
        n_requests = n_sample = 0
        in_flight = 0
        for _record, req in runs:
            sample = latency_sample(req, exclude_first_graph=False)
            for name, values in latency_values(req, sample).items():
                pooled.setdefault(name, []).append(values)
            n_requests += int(np.count_nonzero(~req.warmup))
            n_sample += int(np.count_nonzero(sample))
            in_flight = max(in_flight, max_in_flight(req))
        rows.append(
            {
                "deployment_id": deployment,
                "arm": arm,
                "engine": engine,
                "floor": floor,
                "sharing": f"{shape.sharing:.2f}",
                "prompt_tokens": shape.prompt_tokens,
                "runs": len(runs),
                "n_requests": n_requests,
                "n_sample": n_sample,
                "max_in_flight": in_flight,
                **latency_percentiles({k: np.concatenate(v) for k, v in pooled.items()}),
            }
        )
    header = list(rows[0])
    lines = [",".join(header)] + [",".join(csv_cell(r[h]) for h in header) for r in rows]
    write_text(out_csv, "\n".join(lines) + "\n")
    sidecar = {
        "format": "servelab-floor/1",
        "protocol": (
            "closed loop, one request at a time (every request sent when the one before it has "
            "finished), after the run protocol's warm-up; repetitions pooled"
        ),
        "definitions": {k: METRIC_DEFINITIONS[k] for k in LATENCY_METRICS},
        "max_in_flight": "the most trace requests in flight at once, from send to last chunk",
        "percentiles": list(PERCENTILES),
    }
    if any(FloorShape.from_id(str(r["floor"])).together > 1 for r in rows):
        sidecar["together"] = (
            "a floor id ending -x<n> (config floor.shapes[].together): n requests at a time, "
            "each group sent together when the last of the group before it has finished"
        )
    write_text(Path(f"{out_csv}.json"), json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    return Path(out_csv)
