"""The unloaded floor's trace: a shape's requests, one at a time (seed 002, protocol step 2).

Seed 002 measures the floor with `vllm bench serve --max-concurrency 1`: single-stream TTFT and ITL
on an idle server, the denominator of slowdown-relative SLOs and the check that an absolute SLO is
reachable at all on the model and GPU. servelab expresses "one request at a time" in the trace
itself, so every backend (the simulator's runner and the live dispatcher drive the same
`ReleaseTracker`) runs it without a mode of its own: a **closed-loop chain**. Each request depends
on the one before it with no tool delay, so it is sent the moment its predecessor's last token
arrives, and at most one request is ever in flight.

The requests are the first `requests` rows of a campaign-style trace of the shape (σ, L), compiled
from the floor's own seed (`trace_seed(campaign_seed, floor id, rep)`): the same prompt
construction (the shape's shared prefix and distinct suffixes) and the same per-role output
lengths. The chain is one agent graph whose requests keep their ids, roles and `max_tokens`, in
role order (planners, then workers, then aggregators: the order the trace validator requires inside
a graph), so the floor trace passes the six checks unchanged and is loaded like any other.

**Idle gaps** (config `floor.idle_gaps`, off by default). A closed loop never lets the engine idle,
so the floor alone cannot price what a pass costs after an idle (servelab.sim.cpu_platform, the
after-idle term). With `idle_gaps: {every: n, seconds: [...]}`, the chain's requests at positions
n, 2n, 3n, ... wait the next of `seconds` (cycling) after their predecessor's last token, as its
`tool_delay_s`: the engine idles that long, then serves one request at a time again. The manifest
records the gaps (`floor.idle_gaps`), and the trace validator admits exactly those delays on a floor
trace. The floor's TTFT then includes the requests after an idle: the fit (servelab.sim.cpu_fit)
keeps them apart.

**Prompts sent together** (config `floor.shapes[].together`, 1 unless given). One request at a
time, the floor never has a pass of several prompts, so it cannot price one: in a single prompt
the per-token cost and the attention mask's square term grow together, and a fit splits them its
own way, while two prompts in one pass double the first and not the second (docs/simulator.md,
"The pass of two prompts, measured"). A shape with `together: k` is a chain of groups of k
requests: every request of a group depends on every request of the group before it, so the
group is released, and sent, together when the last of the group before it has finished, as a
graph's workers are when their planner ends. Idle gaps then fall before groups (the group at
positions n, 2n, ...). The last group holds what is left of `requests`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from servelab.artifacts import TRACE_SCHEMA
from servelab.grid.config import Condition, FloorShape
from servelab.workload.arrivals import arrival_times
from servelab.workload.compiler import WorkloadSettings, compile_trace, write_validated_trace
from servelab.workload.topology import ROLE_ORDER
from servelab.workload.validate import TokenColumn, measure_sharing

__all__ = ["FLOOR_SOURCE_RATE", "IdleGaps", "compile_floor_trace_files", "floor_trace"]

# Agent graphs/s of the trace the floor's requests are taken from (its arrivals are discarded).
FLOOR_SOURCE_RATE = 1.0
# The source trace is lengthened (doubled) at most this many times until it holds enough requests.
_MAX_LENGTHENINGS = 12


@dataclass(frozen=True)
class IdleGaps:
    """Config `floor.idle_gaps` (module docstring): every `every`-th request of the chain waits the
    next of `seconds` after its predecessor."""

    every: int
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"config key floor.idle_gaps.every: must be >= 1, got {self.every}")
        if not self.seconds or not all(math.isfinite(x) and x > 0 for x in self.seconds):
            raise ValueError(
                f"config key floor.idle_gaps.seconds: must be positive seconds, got {self.seconds}"
            )

    @classmethod
    def from_config(cls, given: Mapping[str, Any] | None) -> IdleGaps | None:
        if not given:
            return None
        return cls(int(given["every"]), tuple(float(x) for x in given["seconds"]))

    def delays(self, n: int) -> list[float]:
        """The tool delay of each of a chain's `n` requests (or groups sent together)."""
        return [
            self.seconds[(k // self.every - 1) % len(self.seconds)]
            if k > 0 and k % self.every == 0
            else 0.0
            for k in range(n)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"every": self.every, "seconds": list(self.seconds)}


def floor_trace(
    table: pa.Table,
    manifest: Mapping[str, Any],
    *,
    condition: str,
    requests: int,
    idle_gaps: IdleGaps | None = None,
    together: int = 1,
) -> tuple[pa.Table, dict[str, Any]]:
    """The closed-loop chain of the first `requests` rows of a compiled trace (module docstring),
    in groups of `together` sent together, with `idle_gaps` if given: (TRACE_SCHEMA table,
    manifest without `checks` and `trace_sha256`)."""
    if together < 1:
        raise ValueError(f"floor of {condition}: together must be at least 1, got {together}")
    if requests < 1:
        raise ValueError(f"floor of {condition}: requests must be at least 1, got {requests}")
    if table.num_rows < requests:
        raise ValueError(
            f"floor of {condition}: the source trace holds {table.num_rows} requests, "
            f"fewer than the {requests} asked for"
        )
    head = table.slice(0, requests)
    roles = head.column("role").to_pylist()
    order = sorted(range(requests), key=lambda r: (ROLE_ORDER[roles[r]], r))
    chain = head.take(pa.array(order, type=pa.int64()))
    ids = chain.column("request_id").to_pylist()
    n = chain.num_rows
    chain = chain.set_column(
        chain.schema.get_field_index("graph_id"),
        "graph_id",
        pa.array(np.zeros(n, dtype=np.int32), type=pa.int32()),
    )
    chain = chain.set_column(
        chain.schema.get_field_index("arrival_s"),
        "arrival_s",
        pa.array(np.zeros(n), type=pa.float64()),
    )
    # each request's group, and every group's requests: a group waits for all of the one before
    group = [r // together for r in range(n)]
    members = [ids[g * together : (g + 1) * together] for g in range(group[-1] + 1)]
    group_delays = idle_gaps.delays(len(members)) if idle_gaps else [0.0] * len(members)
    chain = chain.set_column(
        chain.schema.get_field_index("depends_on"),
        "depends_on",
        pa.array(
            [members[group[r] - 1] if group[r] > 0 else [] for r in range(n)],
            type=pa.list_(pa.string()),
        ),
    )
    chain = chain.set_column(
        chain.schema.get_field_index("tool_delay_s"),
        "tool_delay_s",
        pa.array([group_delays[group[r]] for r in range(n)], type=pa.float64()),
    )
    chain = chain.cast(TRACE_SCHEMA)
    prefix = np.asarray(chain.column("prefix_tokens").to_numpy(), dtype=np.int64)
    _, sigma = measure_sharing(TokenColumn(chain), prefix)
    out = dict(manifest)
    out.update(
        condition=condition,
        rate=None,
        offered_load_rps=None,
        n_graphs=1,
        n_requests=n,
        requests_per_graph=n,
        achieved_sharing=float(np.mean(sigma)),
        floor={
            "protocol": (
                "closed loop, one request at a time: every request depends on the one before it "
                "with no tool delay, so it is sent when its predecessor's last token arrives"
                if together == 1
                else f"closed loop, {together} requests at a time: every request depends on "
                "every request of the group before it with no tool delay, so a group is sent "
                "together when the last of the group before it has finished"
            ),
            **({"together": together} if together > 1 else {}),
            "requests": n,
            "order": "the source trace's first rows, in role order (planners, workers, aggregators)",
            "roles": {role: roles.count(role) for role in ROLE_ORDER},
            "source": {
                "rate": manifest["rate"],
                "duration_s": manifest["duration_s"],
                "n_requests": manifest["n_requests"],
            },
            **({"idle_gaps": idle_gaps.to_dict()} if idle_gaps else {}),
        },
    )
    out["verification"] = dict(manifest["verification"], prompts_encoded=n)
    return chain, out


def compile_floor_trace_files(
    *,
    shape: FloorShape,
    rep: str,
    seed: int,
    requests: int,
    workload: Mapping[str, Any],
    tokenizer: str,
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
    idle_gaps: IdleGaps | None = None,
) -> dict[str, Any]:
    """Compile the floor trace of one shape (module docstring; its id names the floor's
    condition, its `together` the requests sent together), with `idle_gaps` if given, validate it
    (the six checks) and write trace.parquet and manifest.json atomically; return the manifest.

    The source trace runs at FLOOR_SOURCE_RATE for a duration that holds `requests` requests on
    average three times over; a seed whose arrivals fall short doubles it (deterministically).
    """
    settings = WorkloadSettings.from_config(workload)
    # the smallest graph the workload may draw (the study's: 6), so that enough graphs are enough
    # requests whichever shapes are drawn
    per_graph = min(t.requests for t in settings.graph_topologies)
    duration_s = 3.0 * math.ceil(requests / per_graph) / FLOOR_SOURCE_RATE + 10.0
    # the compiler's own arrival stream: lengthen until it holds enough graphs, then compile once
    for _ in range(_MAX_LENGTHENINGS):
        graphs = arrival_times(seed, FLOOR_SOURCE_RATE, settings.arrival_cv, duration_s).size
        if graphs * per_graph >= requests:
            break
        duration_s *= 2
    source = Condition(
        id=shape.id,
        sweep="floor",
        rate=FLOOR_SOURCE_RATE,
        sharing=shape.sharing,
        prompt_tokens=shape.prompt_tokens,
        duration_s=duration_s,
    )
    table, manifest = compile_trace(
        condition=source, rep=rep, seed=seed, workload=workload, tokenizer=tokenizer
    )
    chain, floor_manifest = floor_trace(
        table,
        manifest,
        condition=shape.id,
        requests=requests,
        idle_gaps=idle_gaps,
        together=shape.together,
    )
    return write_validated_trace(
        chain, floor_manifest, trace_path=trace_path, manifest_path=manifest_path
    )
