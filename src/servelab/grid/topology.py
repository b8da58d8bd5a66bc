"""The agent-graph shapes a workload draws from: config `workload.topologies` (docs/workload.md).

Every shape is a planner, then one or more *stages* of workers, then an aggregator. Every worker
of the first stage depends on the planner, every worker of a later stage on every worker of the
stage before it, and the aggregator on every worker of the last stage. A shape is therefore its
stage widths:

- ``fanout`` (``workers: N``): one stage of N workers, the study's graph (N defaults to
  ``workload.workers_per_graph``);
- ``chain`` (``depth: D``): D stages of one worker each, planner -> worker -> ... -> aggregator;
- ``layers`` (``widths: [w1, w2, ...]``): stages of the given widths.

Without ``workload.topologies`` every graph is a fanout of ``workload.workers_per_graph`` workers,
and nothing is drawn: the study's traces are compiled exactly as before the key existed. With it,
each graph's shape is drawn with probability weight / total weight (stream "topology" of the
trace seed: ``servelab.workload.topology.draw_topologies``).

This module reads the raw ``workload`` mapping, so the config validation, the offered load
(``servelab.grid.config.offered_load``) and the compiler agree on one parse. Errors name the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servelab.grid.settings import ConfigError

__all__ = [
    "MAX_WORKERS",
    "SHAPES",
    "GraphTopology",
    "graph_topologies",
    "has_topologies",
    "mean_requests_per_graph",
]

# The most workers one graph may hold (as workload.workers_per_graph).
MAX_WORKERS = 64
# Each shape and the one key that sizes it.
SHAPES = {"fanout": "workers", "chain": "depth", "layers": "widths"}


@dataclass(frozen=True)
class GraphTopology:
    """One agent-graph shape: its stage widths and its weight in the mix."""

    shape: str
    widths: tuple[int, ...]
    weight: float = 1.0

    @property
    def name(self) -> str:
        """``fanout-4``, ``chain-2``, ``layers-2x3``."""
        if self.shape == "fanout":
            return f"fanout-{self.widths[0]}"
        if self.shape == "chain":
            return f"chain-{len(self.widths)}"
        return "layers-" + "x".join(map(str, self.widths))

    @property
    def workers(self) -> int:
        return sum(self.widths)

    @property
    def requests(self) -> int:
        """Requests per graph: the planner, the workers and the aggregator."""
        return self.workers + 2

    def as_dict(self) -> dict[str, Any]:
        """The entry as config `workload.topologies` spells it (defaults filled in)."""
        size: Any
        if self.shape == "fanout":
            size = self.widths[0]
        elif self.shape == "chain":
            size = len(self.widths)
        else:
            size = list(self.widths)
        return {"shape": self.shape, SHAPES[self.shape]: size, "weight": self.weight}


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise ConfigError(
            f"config key {key}: must be an integer in [1, {MAX_WORKERS}], got {value!r}"
        )
    return value


def _topology(entry: Any, key: str, workers_per_graph: int) -> GraphTopology:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"config key {key}: expected a mapping, got {type(entry).__name__}")
    shape = entry.get("shape")
    if shape not in SHAPES:
        raise ConfigError(
            f"config key {key}.shape: must be one of {', '.join(SHAPES)}, got {shape!r}"
        )
    size_key = SHAPES[shape]
    for name in entry:
        if name not in ("shape", "weight", size_key):
            raise ConfigError(
                f"config key {key}.{name}: not a key of shape {shape} (it takes {size_key} and weight)"
            )
    widths: tuple[int, ...]
    if shape == "fanout":
        widths = (_count(entry.get("workers", workers_per_graph), f"{key}.workers"),)
    elif shape == "chain":
        if "depth" not in entry:
            raise ConfigError(f"config key {key}.depth: missing (shape chain needs its depth)")
        widths = (1,) * _count(entry["depth"], f"{key}.depth")
    else:
        given = entry.get("widths")
        if not isinstance(given, list) or not given:
            raise ConfigError(
                f"config key {key}.widths: expected a non-empty list of stage widths, got {given!r}"
            )
        widths = tuple(_count(w, f"{key}.widths[{j}]") for j, w in enumerate(given))
    if sum(widths) > MAX_WORKERS:
        raise ConfigError(
            f"config key {key}: {sum(widths)} workers in one graph, more than {MAX_WORKERS}"
        )
    weight = entry.get("weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ConfigError(f"config key {key}.weight: must be a positive number, got {weight!r}")
    return GraphTopology(shape=shape, widths=widths, weight=float(weight))


def has_topologies(workload: Mapping[str, Any]) -> bool:
    """Whether the workload lists its topologies (else every graph is the study's fanout)."""
    return workload.get("topologies") is not None


def graph_topologies(workload: Mapping[str, Any]) -> tuple[GraphTopology, ...]:
    """The workload's topologies, validated (ConfigError naming the key): `workload.topologies`,
    or, when absent, one fanout of `workload.workers_per_graph` workers."""
    workers = workload.get("workers_per_graph")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(
            f"config key workload.workers_per_graph: must be an integer >= 1, got {workers!r}"
        )
    if not has_topologies(workload):
        return (GraphTopology(shape="fanout", widths=(int(workers),)),)
    listed = workload["topologies"]
    if not isinstance(listed, list) or not listed:
        raise ConfigError(
            f"config key workload.topologies: expected a non-empty list, got {listed!r}"
        )
    return tuple(
        _topology(entry, f"workload.topologies[{i}]", int(workers))
        for i, entry in enumerate(listed)
    )


def mean_requests_per_graph(workload: Mapping[str, Any]) -> int | float:
    """Requests per graph on average over the topologies' weights: an integer when every graph
    has the same size (the study's 6), else the weighted mean."""
    tops = graph_topologies(workload)
    sizes = {t.requests for t in tops}
    if len(sizes) == 1:
        return sizes.pop()
    total = math.fsum(t.weight for t in tops)
    return math.fsum(t.weight * t.requests for t in tops) / total
