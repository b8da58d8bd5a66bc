"""Virtual-time discrete-event runner: one engine model serving one trace, as the live dispatcher would.

Run protocol (the same as the live dispatcher's, docs/simulator.md "Run protocol and artifacts"):
1. At t = 0 the client sends the warm-up requests all at once (flagged, role "warmup", graph -1).
2. When all have completed, the trace starts at t0: every trace request's scheduled time is t0 plus
   its time in the trace; requests without predecessors at their graph's arrival, the others when
   `ReleaseTracker` releases them (planner completion + tool delay; aggregator after all workers).
3. Each request streams: one chunk per `stream_interval` output tokens (vLLM: one per token), a chunk
   arriving at the end of the iteration that produced its last token.
4. A request not finished `request_timeout_s` after it was sent gets status "timeout" and is aborted
   in the engine; as with any completion, its dependants are released.
Faults: a node reclamation at `stop_at_s` stops the run there (in-flight requests error, nothing
later is sent); an engine crash at `crash_at_s` errors every in-flight and later request.

The engine only sees a request at its next iteration boundary (add_request happens at the send time;
the running iteration is not interrupted). Between iterations the clock jumps to the next event.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from servelab.engines.registry import engine_spec
from servelab.sim.base import EngineModel
from servelab.workload.release import ReleaseTracker, TraceRequest

__all__ = ["RequestRecord", "RunOutcome", "WarmupRequest", "run_trace"]

_SEND, _TIMEOUT, _STOP, _CRASH = 0, 1, 2, 3


@dataclass(frozen=True)
class WarmupRequest:
    request_id: str
    prompt_token_ids: np.ndarray
    max_tokens: int


@dataclass
class RequestRecord:
    """One row of requests.parquet (times in seconds from run start)."""

    request_id: str
    graph_id: int
    role: str
    warmup: bool
    scheduled_s: float
    max_tokens: int
    sent_s: float | None = None
    chunk_times_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    chunk_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    status: str = "error"
    error: str | None = None
    done: bool = False


@dataclass
class RunOutcome:
    records: list[RequestRecord]  # warm-ups first, then trace requests in send order
    trace_start_s: float
    end_s: float
    interrupted: bool
    crashed: bool
    iterations: int
    samples: list[tuple[float, dict[str, float]]]  # (t_s, engine metrics) every telemetry step


def _chunks(times: np.ndarray, interval: int, finished: bool) -> tuple[np.ndarray, np.ndarray]:
    """Group token times into stream chunks of `interval` tokens (a final partial chunk on finish)."""
    n = times.shape[0]
    if interval <= 1 or n == 0:
        return times.astype(np.float64, copy=False), np.ones(n, dtype=np.int32)
    ends = np.arange(interval, n + 1, interval)
    if finished and (ends.size == 0 or ends[-1] != n):
        ends = np.append(ends, n)
    chunk_times = times[ends - 1]
    tokens = np.diff(np.concatenate(([0], ends))).astype(np.int32)
    return chunk_times, tokens


def run_trace(
    model: EngineModel,
    trace: Sequence[TraceRequest],
    prompts: Mapping[str, np.ndarray],
    *,
    warmups: Sequence[WarmupRequest],
    request_timeout_s: float,
    stream_interval: int,
    telemetry_step_s: float,
    stop_at_s: float | None = None,
    crash_at_s: float | None = None,
    crash_at_trace_start: bool = False,
) -> RunOutcome:
    """Serve `trace` (and the warm-ups before it) on `model` in virtual time; see module doc."""
    tracker = ReleaseTracker(trace)
    # tokens per streamed chunk: the engine's own when it fixes it (vLLM 0.6.3: one), else asked
    interval = engine_spec(model.engine).stream_interval or stream_interval
    records: dict[str, RequestRecord] = {}
    order: list[str] = []
    events: list[tuple[float, int, int, str]] = []  # (time, seq, kind, request id)
    seq = 0

    def push(t: float, kind: int, rid: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, rid))

    active: set[str] = set()
    warm_left = len(warmups)
    trace_start: float | None = None
    crashed = False
    interrupted = False
    now = 0.0
    iterations = 0
    samples: list[tuple[float, dict[str, float]]] = []
    next_sample = 0.0

    def sample_until(t: float) -> None:
        """Record metrics at every telemetry time before `t` (state constant since `now`)."""
        nonlocal next_sample
        if next_sample < t:
            snap = model.metrics()
            while next_sample < t:
                samples.append((next_sample, snap))
                next_sample = round(next_sample + telemetry_step_s, 9)

    def start_trace(t0: float) -> None:
        nonlocal trace_start
        trace_start = t0
        if crash_at_trace_start:
            push(t0, _CRASH, "")
        for t, rid in tracker.initial():
            push(t0 + t, _SEND, rid)

    def complete(rid: str, t: float) -> None:
        """A request is done (any status): release dependants, start the trace after warm-up."""
        nonlocal warm_left
        rec = records[rid]
        rec.done = True
        active.discard(rid)
        if rec.warmup:
            warm_left -= 1
            if warm_left == 0:
                start_trace(t)
            return
        assert trace_start is not None
        for t_rel, dep in tracker.finish(rid, t - trace_start):
            push(trace_start + t_rel, _SEND, dep)

    def collect(rid: str, t: float, finished: bool, status: str, error: str | None) -> None:
        rec = records[rid]
        times = model.token_times(rid)
        if not finished:
            times = times[times <= t]
        rec.chunk_times_s, rec.chunk_tokens = _chunks(times, interval, finished)
        rec.status = status
        rec.error = error
        if finished:
            rec.prompt_tokens = model.prompt_tokens(rid)
            rec.output_tokens = model.output_tokens(rid)
        model.forget(rid)
        complete(rid, t)

    def send(rid: str, t: float) -> None:
        rec = records[rid]
        rec.sent_s = t
        if crashed:
            rec.status, rec.error = "error", "connection refused: the engine is not running"
            complete(rid, t)
            return
        model.add_request(rid, prompts[rid], rec.max_tokens, t)
        active.add(rid)
        push(t + request_timeout_s, _TIMEOUT, rid)

    def handle(t: float, kind: int, rid: str) -> bool:
        """Process one event; False stops the run."""
        nonlocal crashed
        if kind == _SEND:
            if rid not in records:
                tr = tracker.request(rid)
                records[rid] = RequestRecord(
                    request_id=rid,
                    graph_id=tr.graph_id,
                    role=tr.role,
                    warmup=False,
                    scheduled_s=t,
                    max_tokens=tr.max_tokens,
                )
                order.append(rid)
            send(rid, t)
        elif kind == _TIMEOUT:
            if rid in active:
                model.abort(rid)
                collect(rid, t, False, "timeout", f"no completion within {request_timeout_s:g} s")
        elif kind == _CRASH:
            crashed = True
            for a in sorted(active, key=lambda x: records[x].sent_s or 0.0):
                model.abort(a)
                collect(a, t, False, "error", "engine crashed: connection reset")
        elif kind == _STOP:
            return False
        return True

    # warm-ups at t = 0
    for w in warmups:
        records[w.request_id] = RequestRecord(
            request_id=w.request_id,
            graph_id=-1,
            role="warmup",
            warmup=True,
            scheduled_s=0.0,
            max_tokens=w.max_tokens,
        )
        order.append(w.request_id)
    prompts = dict(prompts)
    for w in warmups:
        prompts[w.request_id] = w.prompt_token_ids
        push(0.0, _SEND, w.request_id)
    if not warmups:
        start_trace(0.0)
    if stop_at_s is not None:
        push(float(stop_at_s), _STOP, "")
    if crash_at_s is not None:
        push(float(crash_at_s), _CRASH, "")

    running = True
    while running:
        # events due now
        while events and events[0][0] <= now:
            t, _, kind, rid = heapq.heappop(events)
            if not handle(max(t, now) if kind != _SEND else t, kind, rid):
                running = False
                interrupted = True
                break
        if not running:
            break
        if trace_start is not None and tracker.done and not active:
            break
        if not crashed and model.has_work():
            # what a scrape during this iteration sees: the state the previous step left
            snap = model.metrics() if next_sample < now + 60.0 else None
            it = model.step(now)
            iterations += 1
            end = it.end_s
            if snap is not None:
                while next_sample < end:
                    samples.append((next_sample, snap))
                    next_sample = round(next_sample + telemetry_step_s, 9)
            # events during the iteration (sends queue up; timeouts cut streams) before its results
            while events and events[0][0] < end:
                t, _, kind, rid = heapq.heappop(events)
                if not handle(t, kind, rid):
                    running = False
                    interrupted = True
                    now = t
                    break
            if not running:
                break
            for rid in it.rejected:
                if rid in active:
                    err = model.error(rid) or "rejected by the engine"
                    collect(rid, end, False, "error", err)
            for rid in it.finished:
                if rid in active:
                    collect(rid, end, True, "ok", None)
            now = end
        elif events:
            t = events[0][0]
            sample_until(t)
            now = t
        else:
            break
    sample_until(now + 1e-9)
    out = [records[r] for r in order]
    for rec in out:
        if not rec.done and rec.sent_s is not None:
            rec.status = "error"
            rec.error = (
                f"run interrupted at {now:.3f} s: node reclaimed"
                if interrupted
                else "no completion before the run ended"
            )
            if rec.request_id in active:
                times = model.token_times(rec.request_id)
                times = times[times <= now]
                rec.chunk_times_s, rec.chunk_tokens = _chunks(times, interval, False)
    return RunOutcome(
        records=out,
        trace_start_s=trace_start if trace_start is not None else now,
        end_s=now,
        interrupted=interrupted,
        crashed=crashed,
        iterations=iterations,
        samples=samples,
    )
