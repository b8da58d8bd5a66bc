"""Build a run's `run.json` record from its requests table (shared by every backend)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from servelab.artifacts.provenance import git_commit, servelab_version

__all__ = ["build_run_record", "lag_stats", "run_status"]


def lag_stats(requests: pa.Table, at: str = "sent_s") -> dict[str, float | None]:
    """Schedule lag (`at` − scheduled_s) over the non-warm-up requests that have an `at` time:
    `sent_s`, when the dispatcher took the request, or `written_s`, when its last byte was
    written to the socket (on the wire); a table without the column has no lag at it."""
    if at not in requests.column_names:
        return {"median": None, "p99": None, "max": None, "mean": None}
    warm = np.asarray(requests.column("warmup").to_pylist(), dtype=bool)
    sent = requests.column(at).to_pylist()
    sched = requests.column("scheduled_s").to_pylist()
    lags = np.array(
        [s - c for s, c, w in zip(sent, sched, warm, strict=True) if not w and s is not None],
        dtype=float,
    )
    if lags.size == 0:
        return {"median": None, "p99": None, "max": None, "mean": None}
    return {
        "median": float(np.median(lags)),
        "p99": float(np.percentile(lags, 99)),
        "max": float(lags.max()),
        "mean": float(lags.mean()),
    }


def run_status(n_measured: int, n_ok: int, success_threshold: float, interrupted: bool) -> str:
    if interrupted:
        return "interrupted"
    if n_measured == 0 or n_ok / n_measured < success_threshold:
        return "failed"
    return "ok"


def build_run_record(
    *,
    arm: str,
    engine: str,
    condition: str,
    rep: str,
    seed: int,
    trace_sha256: str,
    backend: str,
    deployment_id: str,
    resolved_config: Mapping[str, Any],
    start_unix_s: float,
    end_unix_s: float,
    offered_load_rps: float,
    requests: pa.Table,
    success_threshold: float,
    attempt: int,
    node: Mapping[str, Any],
    interrupted: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Counts cover the trace's requests (warm-up excluded); status follows the success check."""
    warm = requests.column("warmup").to_pylist()
    status = requests.column("status").to_pylist()
    measured = [s for s, w in zip(status, warm, strict=True) if not w]
    n_ok = sum(1 for s in measured if s == "ok")
    n_sent = len(measured)
    record: dict[str, Any] = {
        "run_id": f"{arm}/{engine}/{condition}/{rep}",
        "arm": arm,
        "engine": engine,
        "condition": condition,
        "rep": rep,
        "seed": int(seed),
        "trace_sha256": trace_sha256,
        "backend": backend,
        "deployment_id": deployment_id,
        "resolved_config": dict(resolved_config),
        "start_unix_s": float(start_unix_s),
        "end_unix_s": float(end_unix_s),
        "offered_load_rps": float(offered_load_rps),
        "n_sent": n_sent,
        "n_ok": n_ok,
        "n_failed": n_sent - n_ok,
        "n_warmup": sum(1 for w in warm if w),
        "success_fraction": (n_ok / n_sent) if n_sent else 0.0,
        "status": run_status(n_sent, n_ok, success_threshold, interrupted),
        "attempt": int(attempt),
        "node": dict(node),
        "dispatcher_lag_s": lag_stats(requests),
        "wire_lag_s": lag_stats(requests, "written_s"),
        "servelab_version": servelab_version(),
        "git_commit": git_commit(),
    }
    if extra:
        record.update(extra)
    return record
