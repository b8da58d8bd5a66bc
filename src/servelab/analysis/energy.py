"""Energy and cost per output token (docs/analysis.md, "Energy and cost per token").

Both figures are over one window and one count of tokens, read from a run's artifacts alone:

- the window is the run's own, run.json's [start_unix_s, end_unix_s]: what scrape.parquet and
  telemetry.parquet cover, the warm-up requests included (t = 0 is when they are sent);
- the tokens are the output tokens of every request of requests.parquet with status ok, warm-ups
  included (they ran in the window), as the engine counted them (usage; the streamed chunks'
  token sum when it did not: `reduce.RequestMetrics.output_tokens`).

Joules per output token = the increase of the GPU's energy counter (telemetry `gpu_energy_mj`,
DCGM's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION) over the window, reset-aware like PromQL's
`increase` without its extrapolation (`stats.counter_increase`: after a drop the new value counts
in full), in joules, ÷ the tokens. A run without the GPU's series (the sim and local backends, a
cluster without DCGM, a series that did not cover the window) has no energy: null, never 0 and
never modelled.

Dollars per million output tokens = the node's price per hour (config `analysis.cost`, by
`gpu.name`) × the window in hours ÷ the tokens × 10^6: what the node cost while it served the
run. Pauses, deployments and idle time between runs are not charged. Null without a price.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from servelab.analysis import stats
from servelab.analysis.reduce import RequestMetrics
from servelab.artifacts import TELEMETRY_SCHEMA, read_parquet

__all__ = [
    "COST_DEFINITIONS",
    "RunCost",
    "gpu_energy_j",
    "ok_output_tokens",
    "read_telemetry",
    "run_cost",
]

NAN = float("nan")
ENERGY_METRIC = "gpu_energy_mj"

COST_DEFINITIONS: dict[str, str] = {
    "output_tokens": (
        "output tokens of every request with status ok in the run, warm-ups included (usage; the "
        "chunk-token sum where the engine reported none)"
    ),
    "gpu_energy_j": (
        "increase of the engine GPU's energy counter (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ) "
        "over the run's window [start_unix_s, end_unix_s], reset-aware, in J; empty without the "
        "GPU's series (no made-up or modelled figure)"
    ),
    "j_per_output_token": "gpu_energy_j / output_tokens (J per token); empty without gpu_energy_j",
    "usd_per_million_output_tokens": (
        "node price per hour (analysis.cost.node_usd_per_hour[gpu.name]) x the run's window in "
        "hours / output_tokens x 1e6 (USD); empty without a price"
    ),
}


@dataclass(frozen=True)
class RunCost:
    """What a run's energy and cost per token are computed from (the module docstring)."""

    window_s: float
    output_tokens: float
    gpu_energy_j: float  # NaN: no GPU energy series

    @property
    def j_per_output_token(self) -> float:
        """Joules per output token; NaN without the energy series or without a token."""
        if not (math.isfinite(self.gpu_energy_j) and self.output_tokens > 0):
            return NAN
        return self.gpu_energy_j / self.output_tokens

    def usd_per_million_output_tokens(self, usd_per_hour: float | None) -> float:
        """Dollars per million output tokens at `usd_per_hour`; NaN without a price, a window
        or a token."""
        if usd_per_hour is None or not (self.output_tokens > 0 and self.window_s > 0):
            return NAN
        return usd_per_hour * (self.window_s / 3600.0) / self.output_tokens * 1e6

    @classmethod
    def pooled(cls, costs: Iterable[RunCost]) -> RunCost:
        """Several runs as one: windows, tokens and energy summed (so the pooled figures are
        ratios of sums); the energy is NaN unless every run has it."""
        costs = list(costs)
        return cls(
            window_s=float(sum(c.window_s for c in costs)),
            output_tokens=float(sum(c.output_tokens for c in costs)),
            gpu_energy_j=float(sum(c.gpu_energy_j for c in costs)) if costs else NAN,
        )

    def as_row(self, usd_per_hour: float | None) -> dict[str, float | int]:
        """The columns results/run_metrics.csv gives them (COST_DEFINITIONS)."""
        return {
            "output_tokens": int(self.output_tokens),
            "gpu_energy_j": self.gpu_energy_j,
            "j_per_output_token": self.j_per_output_token,
            "usd_per_million_output_tokens": self.usd_per_million_output_tokens(usd_per_hour),
        }


def gpu_energy_j(telemetry: pa.Table | None) -> float:
    """Joules the GPU used over the telemetry's window: the reset-aware increase of its
    `gpu_energy_mj` counter ÷ 1000. NaN when the table is missing or has no such series."""
    if telemetry is None:
        return NAN
    rows = telemetry.filter(pc.equal(telemetry.column("metric"), ENERGY_METRIC))
    if rows.num_rows < 2:  # an increase needs two samples
        return NAN
    times = rows.column("t_s").to_pylist()
    values = rows.column("value").to_pylist()
    return stats.counter_increase(times, values) / 1000.0


def ok_output_tokens(req: RequestMetrics) -> float:
    """Output tokens of every request with status ok, warm-ups included."""
    return float(np.sum(req.output_tokens[req.ok & np.isfinite(req.output_tokens)]))


def run_cost(record: Mapping[str, Any], req: RequestMetrics, telemetry: pa.Table | None) -> RunCost:
    """One run's window (its run.json), ok output tokens and GPU energy."""
    window = float(record["end_unix_s"]) - float(record["start_unix_s"])
    return RunCost(
        window_s=window, output_tokens=ok_output_tokens(req), gpu_energy_j=gpu_energy_j(telemetry)
    )


def read_telemetry(run_dir: str | Path) -> pa.Table | None:
    """A run's telemetry.parquet, or None when it has none (a results folder without it)."""
    path = Path(run_dir) / "telemetry.parquet"
    return read_parquet(path, TELEMETRY_SCHEMA) if path.is_file() else None
