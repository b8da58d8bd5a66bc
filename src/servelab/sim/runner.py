"""Virtual-time discrete-event runner: one engine model serving one trace, as the live dispatcher would.

Run protocol (the same as the live dispatcher's, docs/simulator.md "Run protocol and artifacts"):
1. From t = 0 the client sends the warm-up requests (flagged, role "warmup", graph -1), the k-th at
   k x `warmup_spacing_s` (0: all at once).
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


class _Run:
    """One run's state in virtual time and the steps that advance it (servelab's; `run_trace`
    builds one, schedules its first events, runs it and returns its outcome)."""

    def __init__(
        self,
        model: EngineModel,
        trace: Sequence[TraceRequest],
        prompts: Mapping[str, np.ndarray],
        *,
        warmups: Sequence[WarmupRequest],
        request_timeout_s: float,
        stream_interval: int,
        telemetry_step_s: float,
        crash_at_trace_start: bool,
    ) -> None:
        self.model = model
        self.tracker = ReleaseTracker(trace)
        # tokens per streamed chunk: the engine's own when it fixes it (vLLM 0.6.3: one), else asked
        self.interval = engine_spec(model.engine).stream_interval or stream_interval
        self.prompts = dict(prompts)
        self.request_timeout_s = request_timeout_s
        self.telemetry_step_s = telemetry_step_s
        self.crash_at_trace_start = crash_at_trace_start
        self.records: dict[str, RequestRecord] = {}
        self.order: list[str] = []
        self.events: list[tuple[float, int, int, str]] = []  # (time, seq, kind, request id)
        self.seq = 0
        self.active: set[str] = set()
        self.warm_left = len(warmups)
        self.trace_start: float | None = None
        self.crashed = False
        self.interrupted = False
        self.now = 0.0
        self.iterations = 0
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.next_sample = 0.0

    # ----------------------------------------------------------------- events and telemetry

    def push(self, t: float, kind: int, rid: str) -> None:
        """Queue an event; events at equal times keep the order they were pushed in."""
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, rid))

    def _record_samples(self, snap: dict[str, float], t: float) -> None:
        """Record `snap` at every telemetry time before `t`."""
        while self.next_sample < t:
            self.samples.append((self.next_sample, snap))
            self.next_sample = round(self.next_sample + self.telemetry_step_s, 9)

    def sample_until(self, t: float) -> None:
        """Record metrics at every telemetry time before `t` (state constant since `now`)."""
        if self.next_sample < t:
            self._record_samples(self.model.metrics(), t)

    # ----------------------------------------------------------------- schedule

    def schedule(
        self,
        warmups: Sequence[WarmupRequest],
        stop_at_s: float | None,
        crash_at_s: float | None,
        warmup_spacing_s: float = 0.0,
    ) -> None:
        """The first events: warm-ups from t = 0, `warmup_spacing_s` apart (or the trace at once
        without any), then the injected node reclamation and engine crash."""
        for k, w in enumerate(warmups):
            self.records[w.request_id] = RequestRecord(
                request_id=w.request_id,
                graph_id=-1,
                role="warmup",
                warmup=True,
                scheduled_s=k * warmup_spacing_s,
                max_tokens=w.max_tokens,
            )
            self.order.append(w.request_id)
        for k, w in enumerate(warmups):
            self.prompts[w.request_id] = w.prompt_token_ids
            self.push(k * warmup_spacing_s, _SEND, w.request_id)
        if not warmups:
            self.start_trace(0.0)
        if stop_at_s is not None:
            self.push(float(stop_at_s), _STOP, "")
        if crash_at_s is not None:
            self.push(float(crash_at_s), _CRASH, "")

    def start_trace(self, t0: float) -> None:
        """The trace starts at `t0`: its first requests (and an injected crash) are queued."""
        self.trace_start = t0
        if self.crash_at_trace_start:
            self.push(t0, _CRASH, "")
        for t, rid in self.tracker.initial():
            self.push(t0 + t, _SEND, rid)

    # ----------------------------------------------------------------- requests

    def complete(self, rid: str, t: float) -> None:
        """A request is done (any status): release dependants, start the trace after warm-up."""
        rec = self.records[rid]
        rec.done = True
        self.active.discard(rid)
        if rec.warmup:
            self.warm_left -= 1
            if self.warm_left == 0:
                self.start_trace(t)
            return
        assert self.trace_start is not None
        for t_rel, dep in self.tracker.finish(rid, t - self.trace_start):
            self.push(self.trace_start + t_rel, _SEND, dep)

    def collect(self, rid: str, t: float, finished: bool, status: str, error: str | None) -> None:
        """Record a request's chunks (up to `t` unless `finished`) and status, then complete it."""
        rec = self.records[rid]
        times = self.model.token_times(rid)
        if not finished:
            times = times[times <= t]
        rec.chunk_times_s, rec.chunk_tokens = _chunks(times, self.interval, finished)
        rec.status = status
        rec.error = error
        if finished:
            rec.prompt_tokens = self.model.prompt_tokens(rid)
            rec.output_tokens = self.model.output_tokens(rid)
        self.model.forget(rid)
        self.complete(rid, t)

    def send(self, rid: str, t: float) -> None:
        """Send a request at `t`: to the engine, with its timeout, or refused after a crash."""
        rec = self.records[rid]
        rec.sent_s = t
        if self.crashed:
            rec.status, rec.error = "error", "connection refused: the engine is not running"
            self.complete(rid, t)
            return
        self.model.add_request(rid, self.prompts[rid], rec.max_tokens, t)
        self.active.add(rid)
        self.push(t + self.request_timeout_s, _TIMEOUT, rid)

    def _trace_record(self, rid: str, t: float) -> None:
        """The record of a trace request scheduled at `t`, made at its first send."""
        if rid not in self.records:
            tr = self.tracker.request(rid)
            self.records[rid] = RequestRecord(
                request_id=rid,
                graph_id=tr.graph_id,
                role=tr.role,
                warmup=False,
                scheduled_s=t,
                max_tokens=tr.max_tokens,
            )
            self.order.append(rid)

    def handle(self, t: float, kind: int, rid: str) -> bool:
        """Process one event; False stops the run."""
        if kind == _SEND:
            self._trace_record(rid, t)
            self.send(rid, t)
        elif kind == _TIMEOUT:
            if rid in self.active:
                self.model.abort(rid)
                self.collect(
                    rid, t, False, "timeout", f"no completion within {self.request_timeout_s:g} s"
                )
        elif kind == _CRASH:
            self.crashed = True
            for a in sorted(self.active, key=lambda x: self.records[x].sent_s or 0.0):
                self.model.abort(a)
                self.collect(a, t, False, "error", "engine crashed: connection reset")
        elif kind == _STOP:
            return False
        return True

    # ----------------------------------------------------------------- the loop

    def _handle_due(self) -> bool:
        """Process the events due now; False when one stopped the run."""
        while self.events and self.events[0][0] <= self.now:
            t, _, kind, rid = heapq.heappop(self.events)
            if not self.handle(max(t, self.now) if kind != _SEND else t, kind, rid):
                self.interrupted = True
                return False
        return True

    def _iterate(self) -> bool:
        """One engine iteration from `now`: telemetry, the events during it, then its results.
        False when an event during it stopped the run."""
        # what a scrape during this iteration sees: the state the previous step left
        snap = self.model.metrics() if self.next_sample < self.now + 60.0 else None
        it = self.model.step(self.now)
        self.iterations += 1
        end = it.end_s
        if snap is not None:
            self._record_samples(snap, end)
        # events during the iteration (sends queue up; timeouts cut streams) before its results
        while self.events and self.events[0][0] < end:
            t, _, kind, rid = heapq.heappop(self.events)
            if not self.handle(t, kind, rid):
                self.interrupted = True
                self.now = t
                return False
        for rid in it.rejected:
            if rid in self.active:
                err = self.model.error(rid) or "rejected by the engine"
                self.collect(rid, end, False, "error", err)
        for rid in it.finished:
            if rid in self.active:
                self.collect(rid, end, True, "ok", None)
        self.now = end
        return True

    def run(self) -> None:
        """Advance until the trace is done, the run is stopped or nothing is left to happen:
        the clock jumps from iteration to iteration, or to the next event while the engine
        idles."""
        while self._handle_due():
            if self.trace_start is not None and self.tracker.done and not self.active:
                break
            if not self.crashed and self.model.has_work():
                if not self._iterate():
                    break
            elif self.events:
                t = self.events[0][0]
                self.sample_until(t)
                self.now = t
            else:
                break

    def outcome(self) -> RunOutcome:
        """The last telemetry, every record (unfinished ones closed as errors) and the outcome."""
        now = self.now
        self.sample_until(now + 1e-9)
        # The window's closing sample, as a live backend pulls it (servelab.telemetry.prometheus,
        # closing_unix_s): the first telemetry time at or after the end sees the finished run.
        if not self.samples or self.samples[-1][0] < now:
            self.samples.append((self.next_sample, self.model.metrics()))
            self.next_sample = round(self.next_sample + self.telemetry_step_s, 9)
        out = [self.records[r] for r in self.order]
        for rec in out:
            if not rec.done and rec.sent_s is not None:
                rec.status = "error"
                rec.error = (
                    f"run interrupted at {now:.3f} s: node reclaimed"
                    if self.interrupted
                    else "no completion before the run ended"
                )
                if rec.request_id in self.active:
                    times = self.model.token_times(rec.request_id)
                    times = times[times <= now]
                    rec.chunk_times_s, rec.chunk_tokens = _chunks(times, self.interval, False)
        return RunOutcome(
            records=out,
            trace_start_s=self.trace_start if self.trace_start is not None else now,
            end_s=now,
            interrupted=self.interrupted,
            crashed=self.crashed,
            iterations=self.iterations,
            samples=self.samples,
        )


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
    warmup_spacing_s: float = 0.0,
) -> RunOutcome:
    """Serve `trace` (and the warm-ups before it) on `model` in virtual time; see module doc."""
    run = _Run(
        model,
        trace,
        prompts,
        warmups=warmups,
        request_timeout_s=request_timeout_s,
        stream_interval=stream_interval,
        telemetry_step_s=telemetry_step_s,
        crash_at_trace_start=crash_at_trace_start,
    )
    run.schedule(warmups, stop_at_s, crash_at_s, warmup_spacing_s)
    run.run()
    return run.outcome()
