"""Request and run metrics (§4.1-4.2), vectorised over a run's `requests.parquet` and telemetry.

The list columns `chunk_times_s` / `chunk_tokens` are read through their offsets and flat value
buffers (no per-row Python):

- TTFT = first output chunk − sent_s; E2E = last chunk − sent_s; lag = sent_s − scheduled_s.
- TPOT = (last chunk − first chunk) / (n − 1) for n ≥ 2 output tokens, with n from the engine's usage
  (`output_tokens`); a chunk may carry several tokens, so the chunk count is never used as n. When an
  engine did not report usage (`output_tokens` null) n falls back to the sum of `chunk_tokens`.
- ITL (seed 002, Forks 1 and 2), from the second output chunk on (the first token is TTFT's):
  ITL per chunk = the gap since the previous chunk (vLLM's `itl[]`: one sample per streamed chunk);
  ITL per token = that gap ÷ the tokens the later chunk carries (GenAI-Perf's definition). With
  one token per chunk they are the same; with k tokens per chunk only the per-chunk one grows.
- normalised latency = E2E ÷ output tokens.
- Measured requests (latency): not warm-up, graph_id > 0 (graph ≥ 0 when the first graph is kept),
  status ok, at least one output chunk.
- X = N_ok / W: N_ok counts non-warm-up requests with status ok, graph 0 included; W runs from the
  first non-warm-up sent_s to the last output chunk of any non-warm-up request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from servelab.analysis import stats
from servelab.artifacts import ROLES, ArtifactError

__all__ = [
    "RequestMetrics",
    "RunMetrics",
    "latency_sample",
    "reduce_requests",
    "reduce_telemetry",
    "run_metrics",
    "window_s",
]

FloatArray = npt.NDArray[np.float64]
ROLE_CODES = {role: i for i, role in enumerate(ROLES)}
NAN = float("nan")


def _list_bounds(
    column: pa.ChunkedArray, what: str
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], np.ndarray]:
    """(start, stop, flat values) of a list column: row i holds values[start[i]:stop[i]]."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not isinstance(arr, pa.ListArray | pa.LargeListArray):
        raise ArtifactError(f"{what}: expected a list column")
    offsets = arr.offsets.to_numpy().astype(np.int64, copy=False)
    values = arr.values.to_numpy(zero_copy_only=False)
    return offsets[:-1], offsets[1:], values


def _floats(column: pa.ChunkedArray) -> FloatArray:
    return np.asarray(pc.fill_null(pc.cast(column, pa.float64()), NAN).to_numpy(), dtype=np.float64)


@dataclass(frozen=True)
class RequestMetrics:
    """Per-request quantities of one run (all rows, warm-ups included), aligned with the table."""

    warmup: npt.NDArray[np.bool_]
    graph_id: npt.NDArray[np.int64]
    role: npt.NDArray[np.int8]  # index into ROLES, -1 for warm-up or unknown
    ok: npt.NDArray[np.bool_]
    n_chunks: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.float64]  # usage, or the chunk-token sum when usage is null
    sent: FloatArray
    lag: FloatArray
    ttft: FloatArray
    tpot: FloatArray
    e2e: FloatArray
    last_chunk: FloatArray
    # ITL samples, one per output chunk after a request's first, flat; `itl_row` is the request
    # (row) each sample belongs to.
    itl_chunk: FloatArray = field(default_factory=lambda: np.empty(0), repr=False)
    itl_token: FloatArray = field(default_factory=lambda: np.empty(0), repr=False)
    itl_row: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.empty(0, dtype=np.int64), repr=False
    )

    @property
    def normalised(self) -> FloatArray:
        """E2E ÷ output tokens (NaN without an output token)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.output_tokens >= 1, self.e2e / self.output_tokens, NAN)


def _itl(
    times: FloatArray,
    tokens: np.ndarray,
    start: npt.NDArray[np.int64],
    stop: npt.NDArray[np.int64],
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.int64]]:
    """(per-chunk gaps, per-token gaps, owning row) for every chunk after its request's first."""
    n = stop - start
    owner = np.repeat(np.arange(n.size, dtype=np.int64), np.maximum(n - 1, 0))
    if owner.size == 0:
        return np.empty(0), np.empty(0), owner
    # flat index of each later chunk: its request's start + 1, 2, ..., n - 1
    rank = np.arange(owner.size) - np.repeat(
        np.cumsum(np.maximum(n - 1, 0)) - np.maximum(n - 1, 0), np.maximum(n - 1, 0)
    )
    later = start[owner] + 1 + rank
    gaps = times[later] - times[later - 1]
    carried = np.asarray(tokens, dtype=np.float64)[later]
    with np.errstate(invalid="ignore", divide="ignore"):
        per_token = np.where(carried > 0, gaps / carried, NAN)
    return gaps, per_token, owner


def reduce_requests(table: pa.Table, what: str) -> RequestMetrics:
    """Compute per-request metrics from a REQUESTS_SCHEMA table; `what` names the file in errors."""
    times_start, times_stop, times = _list_bounds(table.column("chunk_times_s"), what)
    tok_start, tok_stop, tokens = _list_bounds(table.column("chunk_tokens"), what)
    n_chunks = times_stop - times_start
    mismatch = np.flatnonzero(n_chunks != (tok_stop - tok_start))
    if mismatch.size:
        rid = table.column("request_id")[int(mismatch[0])].as_py()
        raise ArtifactError(
            f"{what}: request {rid!r}: chunk_times_s and chunk_tokens differ in length "
            f"({mismatch.size} request(s) affected)"
        )
    times = np.asarray(times, dtype=np.float64)
    has = n_chunks > 0
    first = np.full(n_chunks.size, NAN)
    last = np.full(n_chunks.size, NAN)
    first[has] = times[times_start[has]]
    last[has] = times[times_stop[has] - 1]

    csum = np.concatenate(([0], np.cumsum(np.asarray(tokens, dtype=np.int64))))
    token_sum = (csum[tok_stop] - csum[tok_start]).astype(np.float64)
    usage = _floats(table.column("output_tokens"))
    n_out = np.where(np.isnan(usage), token_sum, usage)

    sent = _floats(table.column("sent_s"))
    scheduled = _floats(table.column("scheduled_s"))
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(n_out >= 2, (last - first) / (n_out - 1.0), NAN)

    roles = table.column("role").to_numpy(zero_copy_only=False)
    role_code = np.full(roles.size, -1, dtype=np.int8)
    for name, code in ROLE_CODES.items():
        role_code[roles == name] = code

    return RequestMetrics(
        warmup=np.asarray(table.column("warmup").to_numpy(zero_copy_only=False), dtype=bool),
        graph_id=np.asarray(table.column("graph_id").to_numpy(), dtype=np.int64),
        role=role_code,
        ok=np.asarray(pc.equal(table.column("status"), "ok").to_numpy(zero_copy_only=False)),
        n_chunks=n_chunks,
        output_tokens=n_out,
        sent=sent,
        lag=sent - scheduled,
        ttft=first - sent,
        tpot=tpot,
        e2e=last - sent,
        last_chunk=last,
        **cast(
            "dict[str, Any]",
            dict(
                zip(
                    ("itl_chunk", "itl_token", "itl_row"),
                    _itl(times, tokens, times_start, times_stop),
                    strict=True,
                )
            ),
        ),
    )


@dataclass(frozen=True)
class RunMetrics:
    """One run's metrics (§4.2) plus the per-request arrays the pooled statistics need."""

    n_requests: int  # non-warm-up rows
    n_measured: int  # non-warm-up rows in the measured graphs (any status)
    n_measured_success: int  # of those, status ok
    n_sample: int  # of those, status ok with at least one output chunk: the latency sample
    n_ok: int  # non-warm-up, status ok, graph 0 included (numerator of X)
    role_counts: dict[str, int]  # measured requests by role (any status)
    ttft_p50: float
    ttft_p95: float
    tpot_p50: float
    e2e_p50: float
    throughput: float  # X, requests/s
    window_s: float  # W
    lag_median: float
    lag_max: float
    ttft: FloatArray = field(repr=False)  # measured latency sample, in table order
    role: npt.NDArray[np.int8] = field(repr=False)  # aligned with ttft
    tpot: FloatArray = field(repr=False)


def latency_sample(
    req: RequestMetrics, *, exclude_first_graph: bool = True
) -> npt.NDArray[np.bool_]:
    """The latency sample: measured rows (not warm-up, past the first graph unless it is kept),
    status ok, with an output chunk (module docstring)."""
    first_graph = 1 if exclude_first_graph else 0
    measured = ~req.warmup & (req.graph_id >= first_graph)
    return measured & req.ok & (req.n_chunks > 0) & np.isfinite(req.ttft)


def window_s(req: RequestMetrics) -> float:
    """W: the first non-warm-up send to the last output chunk of any non-warm-up request."""
    trace = ~req.warmup
    sent = req.sent[trace & np.isfinite(req.sent)]
    ends = req.last_chunk[trace & np.isfinite(req.last_chunk)]
    return float(ends.max() - sent.min()) if sent.size and ends.size else NAN


def run_metrics(req: RequestMetrics, *, exclude_first_graph: bool = True) -> RunMetrics:
    """Reduce per-request metrics to the run metrics of §4.2."""
    trace = ~req.warmup
    first_graph = 1 if exclude_first_graph else 0
    measured_rows = trace & (req.graph_id >= first_graph)
    sample = latency_sample(req, exclude_first_graph=exclude_first_graph)
    ttft = req.ttft[sample]
    tpot = req.tpot[sample]
    role = req.role[sample]

    n_ok = int(np.count_nonzero(trace & req.ok))
    window = window_s(req)
    throughput = n_ok / window if np.isfinite(window) and window > 0 else NAN

    lags = req.lag[trace & np.isfinite(req.lag)]
    role_counts = {
        name: int(np.count_nonzero(measured_rows & (req.role == code)))
        for name, code in ROLE_CODES.items()
    }
    return RunMetrics(
        n_requests=int(np.count_nonzero(trace)),
        n_measured=int(np.count_nonzero(measured_rows)),
        n_measured_success=int(np.count_nonzero(measured_rows & req.ok)),
        n_sample=int(ttft.size),
        n_ok=n_ok,
        role_counts=role_counts,
        ttft_p50=stats.percentile(ttft, 50),
        ttft_p95=stats.percentile(ttft, 95),
        tpot_p50=stats.percentile(tpot, 50),
        e2e_p50=stats.percentile(req.e2e[sample], 50),
        throughput=throughput,
        window_s=window,
        lag_median=float(np.median(lags)) if lags.size else NAN,
        lag_max=float(lags.max()) if lags.size else NAN,
        ttft=ttft,
        role=role,
        tpot=tpot,
    )


def reduce_telemetry(table: pa.Table) -> tuple[float, float]:
    """(peak kv_cache_usage, preemptions during the window) from a TELEMETRY_SCHEMA table.

    Each is NaN when the engine exported no such series (SGLang 0.4.1 has no preemption counter).
    """
    metric = table.column("metric")
    t = _floats(table.column("t_s"))
    v = _floats(table.column("value"))
    kv_mask = np.asarray(pc.equal(metric, "kv_cache_usage").to_numpy(zero_copy_only=False))
    pre_mask = np.asarray(pc.equal(metric, "preemptions_total").to_numpy(zero_copy_only=False))
    kv_peak = float(np.max(v[kv_mask])) if kv_mask.any() else NAN
    preemptions = stats.counter_increase(t[pre_mask], v[pre_mask]) if pre_mask.any() else NAN
    return kv_peak, preemptions
