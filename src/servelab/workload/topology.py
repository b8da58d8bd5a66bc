"""L2: each arrival becomes a planner -> N workers -> aggregator graph; workers wait a tool-call delay.

Request ids are zero-padded so that they sort in trace order: ``g00012-planner``, ``g00012-w1`` .. ``g00012-w4``,
``g00012-aggregator`` (graph numbers get more digits only beyond 99,999 graphs; worker numbers are padded when
there are ten or more workers).

Tool-call delays (config ``workload.tool_delay``): ``lognormal`` with the given median and sigma (of the
underlying normal), truncated to [min_s, max_s] by inverse-CDF sampling: u ~ U(F(min_s), F(max_s)), d = F⁻¹(u),
so the shape inside the bounds is exactly the log-normal's, with no probability mass piled on the bounds (as
clipping would). ``constant`` gives every worker `median_s`. See docs/workload.md for where the default comes
from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from servelab.grid.config import ConfigError
from servelab.workload.streams import substream

__all__ = [
    "ROLE_ORDER",
    "GraphRows",
    "ToolDelay",
    "graph_rows",
    "request_id",
    "tool_delays",
]

ROLE_ORDER = {"planner": 0, "worker": 1, "aggregator": 2}


@dataclass(frozen=True)
class ToolDelay:
    """A validated ``workload.tool_delay`` setting."""

    distribution: str
    median_s: float
    sigma: float
    min_s: float
    max_s: float

    @classmethod
    def from_config(cls, spec: Mapping[str, Any]) -> ToolDelay:
        """Validate a ``workload.tool_delay`` mapping; errors name the key."""
        key = "workload.tool_delay"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"config key {key}: expected a mapping, got {type(spec).__name__}")
        for name in ("distribution", "median_s", "sigma", "min_s", "max_s"):
            if name not in spec:
                raise ConfigError(f"config key {key}.{name}: missing")
        dist = spec["distribution"]
        if dist not in ("lognormal", "constant"):
            raise ConfigError(
                f"config key {key}.distribution: {dist!r} is not lognormal or constant"
            )
        values = {}
        for name in ("median_s", "sigma", "min_s", "max_s"):
            v = spec[name]
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v < 0
            ):
                raise ConfigError(
                    f"config key {key}.{name}: must be a finite number >= 0, got {v!r}"
                )
            values[name] = float(v)
        out = cls(distribution=dist, **values)
        if out.min_s >= out.max_s:
            raise ConfigError(
                f"config key {key}.min_s: must be below max_s ({out.min_s} >= {out.max_s})"
            )
        degenerate = dist == "constant" or out.sigma == 0
        if degenerate and not out.min_s <= out.median_s <= out.max_s:
            raise ConfigError(
                f"config key {key}.median_s: a constant delay of {out.median_s} s lies outside "
                f"[min_s, max_s] = [{out.min_s}, {out.max_s}]"
            )
        if not degenerate:
            if out.median_s <= 0:
                raise ConfigError(f"config key {key}.median_s: a log-normal median must be > 0")
            lo, hi = out._cdf_bounds()
            if not hi > lo:
                raise ConfigError(
                    f"config key {key}: the log-normal (median {out.median_s} s, sigma {out.sigma}) has no "
                    f"probability mass in [{out.min_s}, {out.max_s}] s"
                )
        return out

    def _cdf_bounds(self) -> tuple[float, float]:
        """F(min_s), F(max_s) of the untruncated log-normal."""
        return float(_lognorm_cdf(self.min_s, self)), float(_lognorm_cdf(self.max_s, self))

    def as_dict(self) -> dict[str, Any]:
        return {
            "distribution": self.distribution,
            "median_s": self.median_s,
            "sigma": self.sigma,
            "min_s": self.min_s,
            "max_s": self.max_s,
        }


# The log-normal CDF and its inverse through the standard normal's (scipy.special.ndtr / ndtri): the same
# functions scipy.stats.lognorm(s=sigma, scale=median) evaluates, without scipy.stats' 1.5 s import.
def _lognorm_cdf(x: float, spec: ToolDelay) -> float:
    from scipy.special import ndtr

    if x <= 0:
        return 0.0
    return float(ndtr((math.log(x) - math.log(spec.median_s)) / spec.sigma))


def _lognorm_ppf(p: np.ndarray, spec: ToolDelay) -> np.ndarray:
    from scipy.special import ndtri

    return spec.median_s * np.exp(spec.sigma * ndtri(p))


def tool_delays(seed: int, n: int, spec: ToolDelay) -> np.ndarray:
    """`n` tool-call delays (seconds) from stream "tool_delay" of `seed`, each within [min_s, max_s].

    Log-normal: u ~ U(0, 1) from the stream, d = F⁻¹(F(min_s) + u·(F(max_s) − F(min_s))).
    """
    if spec.distribution == "constant" or spec.sigma == 0:
        return np.full(n, spec.median_s, dtype=np.float64)
    lo, hi = spec._cdf_bounds()
    u = substream(seed, "tool_delay").random(n)
    delays = np.asarray(_lognorm_ppf(lo + u * (hi - lo), spec), dtype=np.float64)
    # The inverse CDF can land a rounding error outside the bounds; the bounds are part of the contract.
    return np.clip(delays, spec.min_s, spec.max_s)


def request_id(
    graph_id: int, role: str, worker: int = 0, *, graph_width: int = 5, worker_width: int = 1
) -> str:
    """``g00012-planner``, ``g00012-w3``, ``g00012-aggregator``."""
    suffix = f"w{worker:0{worker_width}d}" if role == "worker" else role
    return f"g{graph_id:0{graph_width}d}-{suffix}"


@dataclass(frozen=True)
class GraphRows:
    """The scheduling columns of a trace, one entry per request in trace order."""

    request_id: list[str]
    graph_id: np.ndarray  # int32
    role: list[str]
    arrival_s: np.ndarray  # float64
    depends_on: list[list[str]]
    tool_delay_s: np.ndarray  # float64
    max_tokens: np.ndarray  # int32

    def __len__(self) -> int:
        return len(self.request_id)


def graph_rows(
    arrivals: np.ndarray, delays: np.ndarray, workers: int, max_tokens: Mapping[str, int]
) -> GraphRows:
    """Expand each arrival into planner, `workers` workers and an aggregator, in trace order.

    `delays` holds one tool delay per worker, graph-major (``delays[g * workers + i]``).
    """
    n_graphs = int(arrivals.size)
    if delays.size != n_graphs * workers:
        raise ValueError(f"expected {n_graphs * workers} tool delays, got {delays.size}")
    per_graph = workers + 2
    gw = max(5, len(str(max(n_graphs - 1, 0))))
    ww = 1 if workers < 10 else len(str(workers))
    ids: list[str] = []
    roles: list[str] = []
    deps: list[list[str]] = []
    tool = np.zeros(n_graphs * per_graph, dtype=np.float64)
    caps = np.empty(n_graphs * per_graph, dtype=np.int32)
    for g in range(n_graphs):
        planner = request_id(g, "planner", graph_width=gw)
        worker_ids = [
            request_id(g, "worker", i, graph_width=gw, worker_width=ww)
            for i in range(1, workers + 1)
        ]
        ids += [planner, *worker_ids, request_id(g, "aggregator", graph_width=gw)]
        roles += ["planner", *(["worker"] * workers), "aggregator"]
        deps += [[], *([[planner]] * workers), worker_ids]
        base = g * per_graph
        tool[base + 1 : base + 1 + workers] = delays[g * workers : (g + 1) * workers]
        caps[base] = max_tokens["planner"]
        caps[base + 1 : base + 1 + workers] = max_tokens["worker"]
        caps[base + 1 + workers] = max_tokens["aggregator"]
    return GraphRows(
        request_id=ids,
        graph_id=np.repeat(np.arange(n_graphs, dtype=np.int32), per_graph),
        role=roles,
        arrival_s=np.repeat(np.asarray(arrivals, dtype=np.float64), per_graph),
        depends_on=deps,
        tool_delay_s=tool,
        max_tokens=caps,
    )
