"""The closed queueing model of the agent-graph workload (issue 29), beside the fluid model (§6.3).

The fluid model of Eq. 8 treats the engine as an open queue: every request of a graph joins the
backlog when the graph arrives, so a throughput shortfall δ makes the wait grow at δ/(1 − δ) per
second of run. The workload is not open inside a graph: the workers are sent only when the planner
has finished, the aggregator only when every worker has, so a congested engine delays the arrival
of its own later requests (§6.3, "a partially closed system"). This module models that structure.

**The network.** One station is the engine, a load-dependent server (`Engine`): at most `slots`
requests in service at once (the KV cache's room for the workload's requests, `engine_slots`), a
first-come-first-served waiting room in front, and a service rate that grows with the number in
service n,

    μ(n) = n / R̄(n),   R̄(n) = n·P + (Ō − 1)·τ(n),   τ(n) = τ₁ + (n − 1)·c,

where P is the unloaded prefill (the floor's TTFT), τ₁ the unloaded decode step (the floor's
TPOT), c the decode step's cost per further sequence in the batch, and Ō the mean output tokens
per request. R̄(n) is a request's mean residence with n in service: its own prefill, the prefills
of the n − 1 others that stall its Ō − 1 decode steps, and those steps. μ(1) = 1 / (P + (Ō − 1)τ₁)
is the floor's own service rate; μ(slots) is the saturated throughput. The other station is the
client: a delay (the tool call before each worker). Each agent graph is a fork-join job: planner,
fork into the workers (each after its tool delay), join, aggregator.

**Evaluation on the trace** (`run_network`, `evaluate`): graphs enter at the trace's own arrival
times and tool delays; a request is released when its last predecessor completes (as
`servelab.workload.release` releases it) and waits for a free slot in order of release. In service
it prefills for P, then decodes its O_r − 1 further tokens one per step of
θ(n) = τ(n) + (n − 1)·P/(Ō − 1) seconds, n the number in service at the time (a load-dependent
processor-sharing server: as a batch drains its survivors speed up). Its first token comes P after
it starts, plus half a decode step τ(m)/2 when m − 1 others are in service (the step it arrives
during). This is the network's sample path for deterministic service, so it keeps the trace's
bursts and its realised arrival count, which the fluid model's T/2 does not.

**The fork-join approximation** (`fork_join_growth`): with the engine saturated at X and the wait
growing linearly, w(t) = a·t, stage k of a graph arriving at s joins the queue near s(1 + a)^k, so
the backlog grows at λ·Σ_k m_k (1 + a)^(−k) − X, with m_k the requests of stage k per graph. With
Q = X·w this gives the growth rate a as the root of

    X·(1 + a) = λ · Σ_k m_k · (1 + a)^(−k).

One stage (m₀ = 6, an open workload) gives a = Λ/X − 1 = δ/(1 − δ), the fluid model's slope; the
planner → 4 workers → aggregator graph gives about half of it near the knee. That is the
mechanism behind the fluid model's over-prediction.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from scipy import optimize
from scipy import stats as sps

from servelab.artifacts import TRACE_SCHEMA, ArtifactError, read_parquet, read_trace_manifest

__all__ = [
    "Engine",
    "Evaluation",
    "GraphTrace",
    "engine_slots",
    "evaluate",
    "fork_join_growth",
    "per_seq_for_throughput",
    "read_graph_trace",
    "run_network",
    "ttft_growth",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
NAN = float("nan")


# --------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class GraphTrace:
    """What the model needs of a trace: who depends on whom, when roots arrive, how long the tool
    calls are, and each request's prompt and output size. Rows in trace order."""

    request_ids: tuple[str, ...]
    graph_id: IntArray
    arrival_s: FloatArray  # the graph's arrival (every request of a graph carries it)
    tool_delay_s: FloatArray
    parents: tuple[tuple[int, ...], ...]  # row indices of each request's predecessors
    prompt_tokens: IntArray
    prefix_tokens: IntArray
    max_tokens: IntArray
    duration_s: float  # the arrival window T (the manifest's duration_s)

    @property
    def n(self) -> int:
        return len(self.request_ids)

    @property
    def n_graphs(self) -> int:
        return int(np.unique(self.graph_id).size)

    @property
    def mean_output(self) -> float:
        """Ō: mean output tokens per request (max_tokens: the runs ignore EOS)."""
        return float(np.mean(self.max_tokens)) if self.n else NAN

    def depth(self) -> IntArray:
        """Each request's stage: 0 for a request without predecessors, else 1 + its deepest one."""
        out = np.full(self.n, -1, dtype=np.int64)
        for i in self._topological():
            ps = self.parents[i]
            out[i] = 0 if not ps else 1 + max(int(out[p]) for p in ps)
        return out

    def stage_sizes(self) -> tuple[float, ...]:
        """m_k: the mean number of requests per graph at each stage (planner, workers, ...)."""
        depth = self.depth()
        graphs = max(self.n_graphs, 1)
        return tuple(float(np.sum(depth == k)) / graphs for k in range(int(depth.max()) + 1))

    def _topological(self) -> list[int]:
        indegree = [len(p) for p in self.parents]
        children: list[list[int]] = [[] for _ in range(self.n)]
        for i, ps in enumerate(self.parents):
            for p in ps:
                children[p].append(i)
        order = [i for i in range(self.n) if indegree[i] == 0]
        for i in order:  # grows while iterating: Kahn's algorithm
            for j in children[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    order.append(j)
        if len(order) != self.n:
            raise ArtifactError("trace: the dependency graph has a cycle")
        return order

    @classmethod
    def from_table(cls, table: pa.Table, duration_s: float, what: str = "trace") -> GraphTrace:
        ids = [str(x) for x in table.column("request_id").to_pylist()]
        index = {rid: i for i, rid in enumerate(ids)}
        if len(index) != len(ids):
            raise ArtifactError(f"{what}: duplicate request ids")
        parents = []
        for rid, deps in zip(ids, table.column("depends_on").to_pylist(), strict=True):
            missing = [d for d in deps if d not in index]
            if missing:
                raise ArtifactError(f"{what}: {rid} depends on unknown request(s) {missing}")
            parents.append(tuple(index[d] for d in deps))
        lengths = pc.list_value_length(table.column("prompt_token_ids"))
        return cls(
            request_ids=tuple(ids),
            graph_id=table.column("graph_id").to_numpy().astype(np.int64),
            arrival_s=table.column("arrival_s").to_numpy().astype(np.float64),
            tool_delay_s=table.column("tool_delay_s").to_numpy().astype(np.float64),
            parents=tuple(parents),
            prompt_tokens=lengths.to_numpy(zero_copy_only=False).astype(np.int64),
            prefix_tokens=table.column("prefix_tokens").to_numpy().astype(np.int64),
            max_tokens=table.column("max_tokens").to_numpy().astype(np.int64),
            duration_s=float(duration_s),
        )


def read_graph_trace(trace_path: str, manifest_path: str) -> GraphTrace:
    """A trace's structure from its trace.parquet and manifest.json (errors name the file)."""
    manifest = read_trace_manifest(manifest_path)
    table = read_parquet(trace_path, TRACE_SCHEMA)
    return GraphTrace.from_table(table, float(manifest["duration_s"]), what=str(trace_path))


# --------------------------------------------------------------------------- the engine


def engine_slots(
    kv_tokens: int,
    *,
    prompt_tokens: float,
    prefix_tokens: float,
    mean_output: float,
    block_size: int = 1,
    admission_tokens: float | None = None,
    max_running: int | None = None,
) -> int:
    """How many of the workload's requests the KV cache holds in service at once.

    The cache is allocated in blocks of `block_size` tokens: the prefix's whole blocks are held
    once, F_b = ⌊F/B⌋·B; each request in service holds the rest of its prompt's blocks,
    D_b = ⌈L/B⌉·B − F_b, and on average half its output plus half a block; admitting one more
    needs `admission_tokens` free (default: the newcomer's D_b and whole output). So

        slots = ⌊(C − F_b − A) / (D_b + Ō/2 + B/2)⌋ + 1,

    at least 1 and at most the engine's own cap on running requests."""
    b = max(int(block_size), 1)
    shared = math.floor(prefix_tokens / b) * b
    unique = math.ceil(prompt_tokens / b) * b - shared
    admission = unique + mean_output if admission_tokens is None else admission_tokens
    held = unique + mean_output / 2.0 + (b / 2.0 if b > 1 else 0.0)
    room = (kv_tokens - shared - admission) / held
    slots = max(math.floor(room) + 1, 1)
    return min(slots, max_running) if max_running else slots


@dataclass(frozen=True)
class Engine:
    """The engine as a load-dependent server (module docstring): `slots` in service at most,
    prefill `prefill_s` (P), unloaded decode step `step_s` (τ₁), `per_seq_s` (c) per further
    sequence in a decode batch, serving requests of mean output `mean_output` (Ō) tokens."""

    slots: int
    prefill_s: float
    step_s: float
    per_seq_s: float
    mean_output: float

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"an engine needs at least one slot, got {self.slots}")
        if min(self.prefill_s, self.step_s, self.per_seq_s) < 0:
            raise ValueError("prefill, step and per-sequence times must be non-negative")
        if not self.mean_output >= 1:
            raise ValueError(f"mean output must be at least one token, got {self.mean_output}")

    def _m(self, n: int) -> int:
        return min(max(int(n), 1), self.slots)

    def step(self, n: int) -> float:
        """τ(n): one decode step with n sequences in the batch (n capped at the slots)."""
        return self.step_s + (self._m(n) - 1) * self.per_seq_s

    def stalled_step(self, n: int) -> float:
        """θ(n): a decode step as one request sees it, with the prefills of the n − 1 others
        spread over their Ō − 1 decode steps."""
        m = self._m(n)
        return self.step(m) + (m - 1) * self.prefill_s / max(self.mean_output - 1.0, 1.0)

    def residence(self, n: int, output_tokens: float) -> float:
        """R(n): a request of `output_tokens` in service among n: P + (O − 1)·θ(n)."""
        return self.prefill_s + max(output_tokens - 1.0, 0.0) * self.stalled_step(n)

    def rate(self, n: int) -> float:
        """μ(n): completions per second with n in service (n capped at the slots)."""
        m = self._m(n)
        return m / self.residence(m, self.mean_output)

    @property
    def capacity(self) -> float:
        """μ(slots): the saturated throughput, requests/s."""
        return self.rate(self.slots)

    def with_per_seq(self, per_seq_s: float) -> Engine:
        return Engine(self.slots, self.prefill_s, self.step_s, per_seq_s, self.mean_output)


def per_seq_for_throughput(engine: Engine, capacity: float, *, mean_output: float) -> float:
    """The per-sequence step cost c that makes μ(slots) equal `capacity` for requests of
    `mean_output` tokens (a saturated throughput measured elsewhere, e.g. a capacity probe); 0
    when even c = 0 serves less (the floor's times already bound it), NaN without a capacity."""
    if not (math.isfinite(capacity) and capacity > 0):
        return NAN
    n = engine.slots
    residence = n / capacity  # R̄(n) = n·P + (Ō − 1)·τ(n) at μ(n) = capacity
    steps = max(mean_output - 1.0, 1.0)
    tau = (residence - n * engine.prefill_s) / steps
    if n == 1:
        return 0.0
    return max((tau - engine.step_s) / (n - 1), 0.0)


# --------------------------------------------------------------------------- the sample path


@dataclass(frozen=True)
class Evaluation:
    """The network's sample path on one trace: per request (trace order) when it was released
    (ready), when it took a slot, its first token, its completion, and how many were in service
    when it started (itself included)."""

    ready_s: FloatArray
    start_s: FloatArray
    first_token_s: FloatArray
    done_s: FloatArray
    in_service: IntArray

    @property
    def ttft_s(self) -> FloatArray:
        return self.first_token_s - self.ready_s

    @property
    def window_s(self) -> float:
        """W as the analysis defines it: the first send to the last output."""
        return float(np.max(self.done_s) - np.min(self.ready_s)) if self.done_s.size else NAN

    @property
    def throughput(self) -> float:
        """X = requests completed / W, as the analysis measures a run."""
        w = self.window_s
        return self.done_s.size / w if w > 0 else NAN


def run_network(
    release_s: FloatArray,
    parents: Sequence[Sequence[int]],
    tool_delay_s: FloatArray,
    *,
    prefill_s: FloatArray,
    steps: FloatArray,
    slots: int,
    step_s: Callable[[int], float],
) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
    """The fork-join network's sample path: (ready, start, done, in service at start) per request.

    Release: a request without predecessors is ready at release_s + tool_delay_s; one with
    predecessors at max(its last predecessor's completion, release_s) + tool_delay_s, as
    servelab.workload.release releases it. Service: ready requests take one of `slots` places
    first come first served (ties by row); in service, a request first prefills for prefill_s[i],
    then runs steps[i] decode steps, each of step_s(n) seconds with n the number in service at
    the time (every decoding request advances one step per step: a load-dependent
    processor-sharing server, so the survivors speed up as a batch drains). Events of one instant:
    completions, then releases and prefill ends, then starts."""
    n = len(parents)
    waiting_on = np.array([len(p) for p in parents], dtype=np.int64)
    children: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(parents):
        for p in ps:
            children[p].append(i)
    ready = np.full(n, NAN)
    start = np.full(n, NAN)
    done = np.full(n, NAN)
    in_service = np.zeros(n, dtype=np.int64)
    # timed events: (time, kind, row); kind 0 = ready, 1 = prefill done
    timed: list[tuple[float, int, int]] = [
        (float(release_s[i] + tool_delay_s[i]), 0, i) for i in range(n) if not parents[i]
    ]
    heapq.heapify(timed)
    decoding: list[tuple[float, int]] = []  # (virtual step count at which it completes, row)
    queue: list[tuple[float, int]] = []  # (ready time, row)
    now, clock, busy = 0.0, 0.0, 0  # clock: decode steps every decoding request has run

    def complete(i: int, t: float) -> None:
        done[i] = t
        for j in children[i]:
            waiting_on[j] -= 1
            if waiting_on[j] == 0:
                at = max(t, float(release_s[j])) + float(tool_delay_s[j])
                heapq.heappush(timed, (at, 0, j))

    while timed or decoding:
        step = step_s(busy) if busy else math.inf
        t_decode = now + (decoding[0][0] - clock) * step if decoding else math.inf
        t_timed = timed[0][0] if timed else math.inf
        t = min(t_decode, t_timed)
        if decoding:
            clock += (t - now) / step
        now = t
        if t_decode <= t_timed:  # a completion (first among events of this instant)
            target, i = heapq.heappop(decoding)
            clock = max(clock, target)
            busy -= 1
            complete(i, t)
        else:
            _, kind, i = heapq.heappop(timed)
            if kind == 0:
                ready[i] = t
                heapq.heappush(queue, (t, i))
            elif steps[i] > 0:
                heapq.heappush(decoding, (clock + float(steps[i]), i))
            else:  # nothing to decode: done with its prefill
                busy -= 1
                complete(i, t)
        settled = not (
            (timed and timed[0][0] <= t) or (decoding and (decoding[0][0] - clock) <= 0.0)
        )
        while settled and busy < slots and queue:
            _, k = heapq.heappop(queue)
            busy += 1
            start[k] = t
            in_service[k] = busy
            heapq.heappush(timed, (t + float(prefill_s[k]), 1, k))
    if not np.all(np.isfinite(done)):
        raise ValueError("the network left requests unserved: a predecessor never completes")
    return ready, start, done, in_service


def evaluate(trace: GraphTrace, engine: Engine) -> Evaluation:
    """The closed model on one trace: every request through `engine` (module docstring)."""
    ready, start, done, in_service = run_network(
        trace.arrival_s,
        trace.parents,
        trace.tool_delay_s,
        prefill_s=np.full(trace.n, engine.prefill_s),
        steps=np.maximum(trace.max_tokens.astype(np.float64) - 1.0, 0.0),
        slots=engine.slots,
        step_s=engine.stalled_step,
    )
    residual = np.array([0.5 * engine.step(int(m)) if m > 1 else 0.0 for m in in_service])
    first = start + engine.prefill_s + residual
    return Evaluation(ready, start, first, done, in_service)


def ttft_growth(sent_s: FloatArray, ttft_s: FloatArray) -> float:
    """How fast TTFT grows over a run: the least-squares slope of TTFT on send time (seconds of
    TTFT per second of run; scipy.stats.linregress). NaN for fewer than three points."""
    ok = np.isfinite(sent_s) & np.isfinite(ttft_s)
    if int(ok.sum()) < 3 or float(np.ptp(sent_s[ok])) == 0.0:
        return NAN
    return float(sps.linregress(sent_s[ok], ttft_s[ok]).slope)


# --------------------------------------------------------------------------- fork-join


def fork_join_growth(graph_rate: float, capacity: float, stage_sizes: Sequence[float]) -> float:
    """The fork-join approximation's wait growth a (module docstring): the root of
    X(1 + a) = λ Σ_k m_k (1 + a)^(−k); 0 when the engine keeps up (λ Σ m_k ≤ X). One stage gives
    the open fluid model's Λ/X − 1."""
    m = np.asarray(stage_sizes, dtype=np.float64)
    if not (graph_rate > 0 and capacity > 0 and m.size and np.all(m >= 0)):
        return NAN
    offered = graph_rate * float(m.sum())
    if offered <= capacity:
        return 0.0
    k = np.arange(m.size, dtype=np.float64)

    def excess(a: float) -> float:
        return capacity * (1.0 + a) - graph_rate * float(np.sum(m * (1.0 + a) ** (-k)))

    upper = offered / capacity - 1.0  # the open model's growth bounds the closed one
    if excess(upper) <= 0:  # one stage: the bound is the root
        return upper
    return float(optimize.brentq(excess, 0.0, upper, xtol=1e-12, rtol=1e-12))
