"""L2: each arrival becomes an agent graph (planner -> stages of workers -> aggregator); workers wait a
tool-call delay.

The study's graph is one stage of N workers (a fanout). Config ``workload.topologies`` adds chains
(planner -> worker -> worker -> aggregator) and layered graphs, and a seeded mix of them: each
graph's shape is drawn from stream "topology" (`draw_topologies`); `layered_rows` expands each
arrival into its shape's rows (servelab.grid.topology describes the shapes).

Request ids are zero-padded so that they sort in trace order: ``g00012-planner``, ``g00012-w1`` .. ``g00012-w4``,
``g00012-aggregator`` (graph numbers get more digits only beyond 99,999 graphs; worker numbers are padded when
a graph may have ten or more workers). Workers are numbered in row order, stage after stage.

Tool-call delays (config ``workload.tool_delay``): ``lognormal`` with the given median and sigma (of the
underlying normal), truncated to [min_s, max_s] by inverse-CDF sampling: u ~ U(F(min_s), F(max_s)), d = F⁻¹(u),
so the shape inside the bounds is exactly the log-normal's, with no probability mass piled on the bounds (as
clipping would). ``constant`` gives every worker `median_s`. See docs/workload.md for where the default comes
from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servelab.grid.config import ConfigError
from servelab.grid.topology import GraphTopology
from servelab.workload.streams import substream

__all__ = [
    "ROLE_ORDER",
    "GraphRows",
    "ToolDelay",
    "draw_topologies",
    "graph_rows",
    "layered_rows",
    "request_id",
    "tool_delays",
    "worker_id_width",
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


# Tool-call delays are drawn to the microsecond: the double nearest to a whole number of them (tool_delays).
TOOL_DELAY_DECIMALS = 6


def tool_delays(seed: int, n: int, spec: ToolDelay) -> np.ndarray:
    """`n` tool-call delays (seconds) from stream "tool_delay" of `seed`, each within [min_s, max_s].

    Log-normal: u ~ U(0, 1) from the stream, d = F⁻¹(F(min_s) + u·(F(max_s) − F(min_s))), rounded to the
    microsecond (TOOL_DELAY_DECIMALS).
    """
    if spec.distribution == "constant" or spec.sigma == 0:
        return np.full(n, spec.median_s, dtype=np.float64)
    lo, hi = spec._cdf_bounds()
    u = substream(seed, "tool_delay").random(n)
    delays = np.asarray(_lognorm_ppf(lo + u * (hi - lo), spec), dtype=np.float64)
    # np.exp's last bit depends on the CPU: NumPy takes its own AVX-512 code where the CPU has it and the C
    # library's exp elsewhere, and the two can differ in the last bit (the study's traces did, between two
    # machines). Rounding to the microsecond makes the trace the same on every machine: a last-bit change
    # (about 1e-16 s) moves a value across a rounding boundary about once in 10^10 values.
    delays = np.round(delays, TOOL_DELAY_DECIMALS)
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


def draw_topologies(seed: int, n_graphs: int, topologies: Sequence[GraphTopology]) -> np.ndarray:
    """Each graph's topology, as an index into `topologies` (int64, one per graph in arrival
    order): drawn from stream "topology" with probability weight / total weight. With one
    topology nothing is drawn (every index is 0).

    One uniform u per graph picks the first topology whose cumulative share exceeds u
    (`numpy.searchsorted` over the cumulative weights): plain float64 arithmetic on the stream's
    doubles, so the choice is the same on any machine.
    """
    if n_graphs < 0:
        raise ValueError(f"n_graphs must be >= 0, got {n_graphs}")
    if not topologies:
        raise ValueError("at least one topology is needed")
    if len(topologies) == 1:
        return np.zeros(n_graphs, dtype=np.int64)
    # a sequential cumulative sum over its own last element: the same doubles on every machine,
    # and the last share exactly 1.0, so u < 1 never picks past the last topology
    cumulative = np.cumsum(np.asarray([t.weight for t in topologies], dtype=np.float64))
    cumulative /= cumulative[-1]
    u = substream(seed, "topology").random(n_graphs)
    picks = np.searchsorted(cumulative, u, side="right")
    return np.minimum(picks, len(topologies) - 1).astype(np.int64)


def worker_id_width(max_workers: int) -> int:
    """Digits of worker numbers: 1 below ten workers per graph, else enough for the most."""
    return 1 if max_workers < 10 else len(str(max_workers))


def layered_rows(
    arrivals: np.ndarray,
    delays: np.ndarray,
    widths: Sequence[tuple[int, ...]],
    max_tokens: Mapping[str, int],
    *,
    worker_width: int,
) -> GraphRows:
    """Expand each arrival into its graph, in trace order: the planner, the workers stage by
    stage, the aggregator. `widths[g]` is graph g's stage widths; a worker of stage 1 depends on
    the planner, one of stage k on every worker of stage k - 1, the aggregator on every worker of
    the last stage.

    `delays` holds one tool delay per worker, graph-major, in row order.
    """
    n_graphs = int(arrivals.size)
    if len(widths) != n_graphs:
        raise ValueError(f"expected {n_graphs} graph shapes, got {len(widths)}")
    sizes = np.asarray([sum(w) + 2 for w in widths], dtype=np.int64)
    n_workers = int(sizes.sum()) - 2 * n_graphs
    if delays.size != n_workers:
        raise ValueError(f"expected {n_workers} tool delays, got {delays.size}")
    n = int(sizes.sum())
    gw = max(5, len(str(max(n_graphs - 1, 0))))
    ids: list[str] = []
    roles: list[str] = []
    deps: list[list[str]] = []
    tool = np.zeros(n, dtype=np.float64)
    caps = np.empty(n, dtype=np.int32)
    row = 0
    used = 0
    for g in range(n_graphs):
        planner = request_id(g, "planner", graph_width=gw)
        ids.append(planner)
        roles.append("planner")
        deps.append([])
        caps[row] = max_tokens["planner"]
        row += 1
        previous = [planner]
        number = 0
        for width in widths[g]:
            stage = []
            for _ in range(width):
                number += 1
                stage.append(
                    request_id(g, "worker", number, graph_width=gw, worker_width=worker_width)
                )
            ids += stage
            roles += ["worker"] * width
            deps += [previous] * width
            previous = stage
        workers = number
        tool[row : row + workers] = delays[used : used + workers]
        caps[row : row + workers] = max_tokens["worker"]
        row += workers
        used += workers
        ids.append(request_id(g, "aggregator", graph_width=gw))
        roles.append("aggregator")
        deps.append(previous)
        caps[row] = max_tokens["aggregator"]
        row += 1
    return GraphRows(
        request_id=ids,
        graph_id=np.repeat(np.arange(n_graphs, dtype=np.int32), sizes),
        role=roles,
        arrival_s=np.repeat(np.asarray(arrivals, dtype=np.float64), sizes),
        depends_on=deps,
        tool_delay_s=tool,
        max_tokens=caps,
    )


def graph_rows(
    arrivals: np.ndarray, delays: np.ndarray, workers: int, max_tokens: Mapping[str, int]
) -> GraphRows:
    """Expand each arrival into planner, `workers` workers and an aggregator (the study's fanout),
    in trace order.

    `delays` holds one tool delay per worker, graph-major (``delays[g * workers + i]``).
    """
    return layered_rows(
        arrivals,
        delays,
        [(workers,)] * int(arrivals.size),
        max_tokens,
        worker_width=worker_id_width(workers),
    )
