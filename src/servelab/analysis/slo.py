"""Latency metrics by name and definition, per-request SLOs, goodput, and results/run_metrics.csv.

Seed 002 ("Where the Definitions Fork") shows tools reporting different numbers under one name;
here every metric is named with its definition (`METRIC_DEFINITIONS`, also written beside the CSV)
and computed from requests.parquet alone:

- a request meets the SLO when its TTFT, TPOT and E2E are each within their limit (a limit left
  out is not applied). A response of fewer than two tokens has no TPOT: the TPOT limit does not
  apply to it (vLLM's benchmark harness scores its TPOT as 0, which meets every limit; the effect
  is the same). Seed 002's advice holds: give an E2E limit where short responses matter.
- goodput = requests/s, over the window W of X, of the non-warm-up requests that completed and
  meet the SLO; goodput <= X, equal when every request meets it.

Each row also carries the run's energy and cost per output token (servelab.analysis.energy: the
GPU's energy counter from telemetry.parquet, the node's price from config `analysis.cost`), empty
where a run has no GPU energy series or the campaign's GPU no price.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import numpy.typing as npt

from servelab.analysis import stats
from servelab.analysis.energy import COST_DEFINITIONS, read_telemetry, run_cost
from servelab.analysis.reduce import (
    RequestMetrics,
    latency_sample,
    reduce_requests,
    run_metrics,
    window_s,
)
from servelab.artifacts import (
    REQUESTS_SCHEMA,
    read_parquet,
    read_run_json,
    write_text,
)
from servelab.grid.settings import RequestSlo

__all__ = [
    "METRIC_DEFINITIONS",
    "goodput",
    "latency_percentiles",
    "latency_values",
    "meets_slo",
    "run_metrics_row",
    "write_run_metrics",
]

NAN = float("nan")

METRIC_DEFINITIONS: dict[str, str] = {
    "ttft": "time to first token: first output chunk's arrival - request sent (s)",
    "tpot": (
        "time per output token: (last chunk - first chunk) / (output tokens - 1), output tokens "
        "from the engine's usage count; undefined below 2 tokens (s)"
    ),
    "itl_token": (
        "inter-token latency per token (GenAI-Perf): each chunk after the first, its gap since "
        "the previous chunk / the tokens it carries; one sample per chunk (s)"
    ),
    "itl_chunk": (
        "inter-token latency per chunk (vLLM bench's itl): each chunk after the first, its gap "
        "since the previous chunk, undivided; a chunk is not a token (s)"
    ),
    "e2e": "end-to-end latency: last output chunk - request sent (s)",
    "normalised": "normalised latency: E2E / output tokens (s per token)",
    "throughput": "X: completed non-warm-up requests / W, W from the first send to the last chunk",
    "goodput": "completed non-warm-up requests meeting every per-request SLO limit / W",
    "slo_attainment": "goodput / X: the share of completed requests that meet the SLO",
    **COST_DEFINITIONS,
}
PERCENTILES = (50, 95, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl_token", "itl_chunk", "e2e", "normalised")


def meets_slo(req: RequestMetrics, slo: RequestSlo) -> npt.NDArray[np.bool_]:
    """Per row: completed with an output chunk and within every limit (module docstring)."""
    ok = ~req.warmup & req.ok & (req.n_chunks > 0) & np.isfinite(req.ttft)
    with np.errstate(invalid="ignore"):
        if slo.ttft_s is not None:
            ok &= req.ttft <= slo.ttft_s
        if slo.tpot_s is not None:
            # fewer than two tokens: no TPOT, so the TPOT limit does not apply
            ok &= (req.output_tokens < 2) | (req.tpot <= slo.tpot_s)
        if slo.e2e_s is not None:
            ok &= req.e2e <= slo.e2e_s
    return ok


def goodput(req: RequestMetrics, slo: RequestSlo) -> float:
    """Requests/s over W meeting the SLO (module docstring); NaN without a window."""
    window = window_s(req)
    if not np.isfinite(window) or window <= 0:
        return NAN
    return float(np.count_nonzero(meets_slo(req, slo))) / window


def latency_values(
    req: RequestMetrics, sample: npt.NDArray[np.bool_]
) -> dict[str, npt.NDArray[np.float64]]:
    """Every named latency metric's samples over the rows in `sample` (ITL: their chunks)."""
    in_sample = sample[req.itl_row] if req.itl_row.size else np.zeros(0, dtype=bool)
    return {
        "ttft": req.ttft[sample],
        "tpot": req.tpot[sample],
        "itl_token": req.itl_token[in_sample],
        "itl_chunk": req.itl_chunk[in_sample],
        "e2e": req.e2e[sample],
        "normalised": req.normalised[sample],
    }


def latency_percentiles(values: Mapping[str, npt.NDArray[np.float64]]) -> dict[str, float]:
    """`{metric}_p{q}_s` for every named metric and percentile (NaN for an empty sample)."""
    return {
        f"{name}_p{q}_s": stats.percentile(values[name], q)
        for name in LATENCY_METRICS
        for q in PERCENTILES
    }


def run_metrics_row(
    req: RequestMetrics, slo: RequestSlo, *, exclude_first_graph: bool = True
) -> dict[str, float | int]:
    """One run's named metrics: percentiles of each latency metric over the measured sample
    (reduce.run_metrics' rule), X, goodput and SLO attainment."""
    sample = latency_sample(req, exclude_first_graph=exclude_first_graph)
    x = run_metrics(req, exclude_first_graph=exclude_first_graph).throughput
    good = goodput(req, slo)
    row: dict[str, float | int] = {"n_sample": int(np.count_nonzero(sample))}
    row.update(latency_percentiles(latency_values(req, sample)))
    row.update(throughput_rps=x, goodput_rps=good, slo_attainment=good / x if x > 0 else NAN)
    return row


def csv_cell(value: object) -> str:
    if isinstance(value, float):
        return "" if not np.isfinite(value) else f"{value:.6g}"
    return str(value)


def write_run_metrics(
    run_dirs: Sequence[str | Path],
    out_csv: str | Path,
    *,
    slo: RequestSlo,
    exclude_first_graph: bool = True,
    usd_per_node_hour: float | None = None,
) -> Path:
    """results/run_metrics.csv: one row per measured run (sorted by run id) with every named
    metric, and `<out>.json` beside it: the definitions, the SLO and the node price
    (`usd_per_node_hour`, None: none, the dollar column is empty) the numbers were computed
    with. Runs whose run.json status is not ok are left out. A run folder without
    telemetry.parquet has no energy figure."""
    rows: list[dict[str, object]] = []
    for raw in run_dirs:
        run_dir = Path(raw)
        record = read_run_json(run_dir / "run.json")
        if record["status"] != "ok":
            continue
        table = read_parquet(run_dir / "requests.parquet", REQUESTS_SCHEMA)
        req = reduce_requests(table, str(run_dir / "requests.parquet"))
        rows.append(
            {
                "run_id": record["run_id"],
                "arm": record["arm"],
                "engine": record["engine"],
                "condition": record["condition"],
                "rep": record["rep"],
                "offered_load_rps": float(record["offered_load_rps"]),
                **run_metrics_row(req, slo, exclude_first_graph=exclude_first_graph),
                **run_cost(record, req, read_telemetry(run_dir)).as_row(usd_per_node_hour),
            }
        )
    if not rows:
        raise ValueError(f"{out_csv}: no measured run among {len(run_dirs)} run directories")
    rows.sort(key=lambda r: str(r["run_id"]))
    header = list(rows[0])
    lines = [",".join(header)] + [",".join(csv_cell(r[h]) for h in header) for r in rows]
    write_text(out_csv, "\n".join(lines) + "\n")
    sidecar = {
        "format": "servelab-run-metrics/2",
        "definitions": METRIC_DEFINITIONS,
        "percentiles": list(PERCENTILES),
        "slo": asdict(slo),
        "cost": {"node_usd_per_hour": usd_per_node_hour},
        "one_token_tpot": (
            "a response of fewer than two tokens has no TPOT; the TPOT limit does not apply to it"
        ),
    }
    write_text(Path(f"{out_csv}.json"), json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    return Path(out_csv)
