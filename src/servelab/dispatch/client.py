"""The streaming dispatcher: replays a trace against an OpenAI-compatible server in real time.

Run protocol (the same as the simulator's; docs/live.md, "The dispatcher"):

1. Poll `GET /health` until it answers 200 (bounded by `health_timeout_s`).
2. t = 0 (the run's start): send the warm-up requests (role `warmup`, graph_id -1, max_tokens
   16, flagged `warmup`), the k-th at k x `warmup_spacing_s` (0, the default: all at once). When
   all have completed, the trace starts at offset t0.
3. Each trace request is sent at its scheduled time, t0 + its trace time. Requests without
   predecessors are scheduled at their graph's arrival; the others when the last predecessor
   finished (whatever its status) plus their tool delay. That logic is
   `servelab.workload.release.ReleaseTracker`, driven here on the real clock.
4. Every request is streamed; every chunk that carries output is timestamped on arrival. A request
   that fails (HTTP error, malformed stream, connection reset, the server gone) is recorded with
   status `error` and the reason; one with no complete answer within `request_timeout_s` with
   status `timeout`. Nothing is dropped, and a failed request still releases its dependents.
   A request written on a reused keep-alive connection that closes before any answer was never
   answered (the server closed the connection idle): it is sent again on another connection
   (`stale_retries` in the result; servelab.dispatch.paced says which server does this).

Clock: `time.perf_counter()` relative to the run start. `scheduled_s` is when the trace says the
request should go; `sent_s` is when the dispatcher hands it to the HTTP client (the logical
dispatch time, as vLLM's benchmark client and inference-perf stamp it), so the lag
`sent_s - scheduled_s` is the scheduler's own delay; `written_s` is when the request's last byte
was written to the socket (on the wire), so `written_s - scheduled_s` is the lag a server can see.
Both are in run.json (`dispatcher_lag_s`, `wire_lag_s`); `written_s - sent_s` is also summarised
as `send_overhead_s`. Every request carries an X-Request-Id header equal to its request id
(docs/live.md, "Request ids").

Two clients (`client=`, the config's `dispatch.client`): "paced" (servelab.dispatch.paced, the
default) sends from a pacer process of its own and reads on the event loop through h11, so a burst
of chunks never delays a send; "httpx" does both on one event loop through httpx. Both share
everything else here (the schedule's logic, the book-keeping) and the request records and
`ChunkRecorder` of servelab.dispatch.records.

Timing precision (httpx client): the scheduler sleeps until `SPIN_S` before a request is due, then
yields to the event loop (asyncio.sleep(0)) until the due time, so other streams are served
meanwhile and the wake-up is not bound to epoll's millisecond timeout granularity. The paced
client's pacer has its own (pacer.SPIN_S).

Tokens per chunk (a chunk is not a token): from the cumulative `usage.completion_tokens` the server
attaches to each chunk when it does (vLLM with `continuous_usage_stats`); otherwise by tokenizing
each chunk's text after the run (SGLang sends usage only at the end), with the total checked
against the final usage and mismatches counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import json
import logging
import math
import resource
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import uvloop

from servelab.dispatch.actions import TimedAction, run_timed_action
from servelab.dispatch.paced import REQUEST_ID_HEADER, PacedClient, request_bytes
from servelab.dispatch.records import (
    ERROR_TEXT_MAX,
    ChunkRecorder,
    RequestRecord,
    RequestSpec,
    describe_error,
)
from servelab.grid.settings import DispatchSettings
from servelab.workload.release import ReleaseTracker, TraceRequest

__all__ = [
    "CLIENTS",
    "SPIN_S",
    "WARMUP_MAX_TOKENS",
    "DispatchError",
    "DispatchResult",
    "Dispatcher",
    "fill_token_counts",
    "overhead_summary",
    "pool_size",
    "wait_healthy",
]

log = logging.getLogger(__name__)

SPIN_S = 0.002
# Sends of a request again after a reused keep-alive connection closed without an answer.
STALE_RETRIES = 2
# "paced": a pacer process sends, the event loop reads (servelab.dispatch.paced; the default).
# "httpx": one event loop does both through httpx (the client the sends used to go through).
CLIENTS = ("paced", "httpx")
WARMUP_MAX_TOKENS = 16


class DispatchError(RuntimeError):
    """The run could not be dispatched at all (e.g. the server never became healthy)."""


@dataclass
class DispatchResult:
    records: list[RequestRecord]
    start_unix_s: float
    end_unix_s: float
    duration_s: float
    trace_start_s: float
    interrupted: bool
    interrupt_reason: str | None
    pool_size: int
    client_cpu_s: float
    chunk_token_sources: dict[str, int]
    chunk_token_mismatches: int
    send_overhead_s: dict[str, float | None]
    send_overhead_samples: list[float] = field(default_factory=list, repr=False)
    connections_opened: int | None = None  # the paced client counts them; httpx does not say
    # Requests sent again because a reused keep-alive connection closed before any answer.
    stale_retries: int = 0
    # time.perf_counter() at the run clock's 0 (CLOCK_MONOTONIC, shared by the machine's
    # processes): a server on the same machine can place its own times on the run clock
    clock_origin_s: float | None = None


def overhead_summary(values: Sequence[float]) -> dict[str, float | None]:
    """Median, p99 and max of the send overheads (None each when there are none)."""
    if not values:
        return {"median": None, "p99": None, "max": None}
    arr = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(arr)),
        "p99": float(np.percentile(arr, 99)),
        "max": float(arr.max()),
    }


def pool_size(
    *, n_requests: int, offered_load_rps: float, request_timeout_s: float, warmup_requests: int
) -> int:
    """Connections to allow: enough for every request the load can have in flight at once.

    Little's law bounds the requests in flight by rate x the longest a request may last (the
    timeout); never more than the run's requests, never more than the open-file limit allows.
    A request that has to wait for a connection shows up in its lag.
    """
    in_flight = math.ceil(max(offered_load_rps, 0.0) * request_timeout_s) + 1
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    fd_budget = max(16, (soft if soft != resource.RLIM_INFINITY else 65536) - 128)
    return max(1, min(max(in_flight, warmup_requests, 16), n_requests + warmup_requests, fd_budget))


async def wait_healthy(
    client: httpx.AsyncClient, timeout_s: float, interval_s: float = 0.5
) -> float:
    """Poll GET /health until it answers 200; return the seconds waited. Bounded by `timeout_s`."""
    start = time.perf_counter()
    deadline = start + timeout_s
    last = "no answer"
    attempts = 0
    while True:
        attempts += 1
        try:
            resp = await client.get("/health", timeout=min(5.0, max(0.1, timeout_s)))
            if resp.status_code == 200:
                return time.perf_counter() - start
            last = f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.perf_counter() + interval_s > deadline:
            raise DispatchError(
                f"{str(client.base_url).rstrip('/')}/health did not answer 200 within "
                f"{timeout_s:g} s ({attempts} polls; last: {last})"
            )
        await asyncio.sleep(interval_s)


class ClientPool:
    """Keep-alive HTTP connections in small httpx pools, each request on the least-loaded one.

    httpcore's connection pool re-examines every pooled connection (and checks each idle one's
    socket) whenever a request starts or ends, so its cost grows with the square of the pool's
    size; hundreds of streams in one pool cost milliseconds per request. Shards of `SHARD_SIZE`
    connections keep that bounded while connections are still reused.
    """

    SHARD_SIZE = 8

    def __init__(self, base_url: str, size: int, timeout: httpx.Timeout) -> None:
        shards = max(1, math.ceil(size / self.SHARD_SIZE))
        limits = httpx.Limits(
            max_connections=self.SHARD_SIZE, max_keepalive_connections=self.SHARD_SIZE
        )
        context = ssl.create_default_context()  # one for all shards (only https would use it)
        self.clients = [
            httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout, verify=context)
            for _ in range(shards)
        ]
        self.in_flight = [0] * shards

    def acquire(self) -> int:
        load = self.in_flight
        index = load.index(min(load))
        load[index] += 1
        return index

    def release(self, index: int) -> None:
        self.in_flight[index] -= 1

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


class Dispatcher:
    """Sends warm-up and trace requests on the real clock and records every chunk.

    `trace` holds the trace rows as TraceRequest (scheduling) and `prompts` maps request id to the
    prompt to send. `count_tokens` turns chunk texts into token counts for servers that do not put
    usage on every chunk.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        trace: Sequence[TraceRequest],
        prompts: dict[str, str | Sequence[int]],
        warmup: Sequence[RequestSpec] = (),
        warmup_spacing_s: float = 0.0,
        request_timeout_s: float = 300.0,
        health_timeout_s: float = DispatchSettings.health_timeout_s,
        ignore_eos: bool = True,
        pool: int = 64,
        progress_interval_s: float = 10.0,
        count_tokens: Callable[[list[str]], list[int]] | None = None,
        actions: Sequence[TimedAction] = (),
        clock_origin: float | None = None,
        trace_start_s: float | None = None,
        control: Any = None,
        await_go: bool = False,
        defer_token_counts: bool = False,
        client: str = DispatchSettings.client,
    ) -> None:
        if client not in CLIENTS:
            raise ValueError(f"dispatch.client must be one of {', '.join(CLIENTS)}, not {client!r}")
        self.client = client
        self.base_url = base_url.rstrip("/")
        # Worker mode (see run_parallel): the run's clock origin (a time.perf_counter() value,
        # system-wide on Linux) and trace start are given, warm-up and health are done elsewhere,
        # `control` (a multiprocessing connection) may bring ("stop", reason). With `await_go`
        # the clock comes over `control` too: the worker says ("ready", None) once it can send
        # (its pacer process up), then takes ("go", clock origin, trace start).
        self.clock_origin = clock_origin
        self.given_trace_start_s = trace_start_s
        self.control = control
        self.await_go = await_go
        self.defer_token_counts = defer_token_counts
        self.model = model
        self.tracker = ReleaseTracker(trace)
        missing = [r.request_id for r in trace if r.request_id not in prompts]
        if missing:
            raise ValueError(f"no prompt for request(s) {', '.join(missing[:5])}")
        self.trace = list(trace)
        self.prompts = prompts
        self.warmup = list(warmup)
        if warmup_spacing_s < 0:
            raise ValueError(f"warmup_spacing_s: must be >= 0, got {warmup_spacing_s}")
        self.warmup_spacing_s = float(warmup_spacing_s)
        self.request_timeout_s = float(request_timeout_s)
        self.health_timeout_s = float(health_timeout_s)
        self.ignore_eos = ignore_eos
        self.pool = int(pool)
        self.progress_interval_s = float(progress_interval_s)
        self.count_tokens = count_tokens
        self.actions = sorted(actions, key=lambda a: a.at_s)
        self._records: dict[str, RequestRecord] = {}
        self._bodies: dict[str, bytes] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self._t0 = 0.0
        self._trace_t0 = 0.0
        self._waker: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop_reason: str | None = None
        self._actions_started: set[TimedAction] = set()
        self._send_overheads: list[float] = []
        self._stale_retries = 0  # httpx client: requests sent again (a stale keep-alive connection)
        self._clients: ClientPool  # httpx client: set when the run starts (arun)
        self._paced: PacedClient | None = None  # the paced client, set by arun
        self._wire: dict[str, bytes] = {}  # paced client: each request's HTTP bytes
        self._warm_done = 0
        self._trace_done = 0
        self._launched = 0
        self._done = 0
        self._errors = 0

    # ----------------------------------------------------------------- clock

    def clock(self) -> float:
        """Seconds since the run start."""
        return time.perf_counter() - self._t0

    # ----------------------------------------------------------------- public entry

    def run(self) -> DispatchResult:
        if self.client == "paced":
            # uvloop (libuv) dispatches each readable socket for less CPU than asyncio's own loop;
            # its timers' millisecond resolution is no matter here: the pacer process keeps the
            # schedule, the loop only reads (docs/benchmarks/dispatcher.md)
            return uvloop.run(self.arun())
        return asyncio.run(self.arun())

    async def arun(self) -> DispatchResult:
        timeout = httpx.Timeout(
            connect=min(30.0, self.request_timeout_s), read=None, write=30.0, pool=None
        )
        if not self._records:
            self._prepare()
        # every record and request lives to the end of the run: keep them out of the garbage
        # collector's generations while it runs, which it would otherwise walk again and again
        gc.freeze()
        loop = asyncio.get_running_loop()
        if self.client == "paced":
            self._paced = PacedClient(
                loop=loop,
                base_url=self.base_url,
                clock=self.clock,
                request_timeout_s=self.request_timeout_s,
                connect_timeout_s=min(30.0, self.request_timeout_s),
                requests=self._wire,
                lookup=self._records.__getitem__,
                on_done=self._paced_done,
                on_crash=self._pacer_crashed,
            )
            self._clients = ClientPool(self.base_url, 1, timeout)  # health polls only
        else:
            self._clients = ClientPool(self.base_url, self.pool, timeout)
        try:
            cpu0 = time.process_time()
            if self._paced is not None:
                await self._paced.start()  # loads every request into the pacer process
            if self.await_go:
                await self._await_go()
            if self.clock_origin is None:
                await wait_healthy(self._clients.clients[0], self.health_timeout_s)
                self._t0 = time.perf_counter()
                start_unix = time.time()
            else:
                self._t0 = self.clock_origin
                start_unix = time.time() - self.clock()
            if self._paced is not None:
                self._paced.go(self._t0)
            if self.control is not None:
                loop.add_reader(self.control.fileno(), self._on_control)
            progress = asyncio.create_task(self._progress())
            action_tasks = [asyncio.create_task(self._timed(a)) for a in self.actions]
            try:
                if self.given_trace_start_s is None:
                    await self._run_warmup()
                    self._trace_t0 = self.clock()
                else:
                    self._trace_t0 = self.given_trace_start_s
                if self._stop_reason is None:
                    await self._run_trace()
            finally:
                await self._halt_pacer()
                progress.cancel()
                for action, task in zip(self.actions, action_tasks, strict=True):
                    if action not in self._actions_started:
                        task.cancel()  # not due yet: never runs
                # an action under way (a restart) completes before the run ends
                for task in [progress, *action_tasks]:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            duration = self.clock()
            end_unix = start_unix + duration
            cpu = time.process_time() - cpu0
            if self._paced is not None:
                cpu += self._paced.pacer_cpu_s  # the client's CPU includes its pacer process
        finally:
            gc.unfreeze()
            if self.control is not None:
                loop.remove_reader(self.control.fileno())
            if self._paced is not None:
                self._paced.close()
            await self._clients.aclose()
        self._mark_unsent()
        if self.defer_token_counts:
            sources: dict[str, int] = {}
            mismatches = 0
        else:
            sources, mismatches = fill_token_counts(self._records.values(), self.count_tokens)
        ordered = [self._records[s.request_id] for s in self.warmup] + [
            self._records[r.request_id] for r in self.trace
        ]
        log.info(
            "dispatch done in %.1f s: %d requests, %d ok, %d failed%s",
            duration,
            len(ordered),
            sum(1 for r in ordered if r.status == "ok"),
            sum(1 for r in ordered if r.status != "ok"),
            f"; interrupted: {self._stop_reason}" if self._stop_reason else "",
        )
        overheads = self._paced.send_overheads if self._paced is not None else self._send_overheads
        return DispatchResult(
            records=ordered,
            start_unix_s=start_unix,
            end_unix_s=end_unix,
            duration_s=duration,
            trace_start_s=self._trace_t0,
            interrupted=self._stop_reason is not None,
            interrupt_reason=self._stop_reason,
            pool_size=self.pool,
            client_cpu_s=cpu,
            chunk_token_sources=sources,
            chunk_token_mismatches=mismatches,
            send_overhead_s=overhead_summary(overheads),
            send_overhead_samples=overheads,
            connections_opened=(
                self._paced.connections_opened if self._paced is not None else None
            ),
            stale_retries=(
                self._paced.stale_retries if self._paced is not None else self._stale_retries
            ),
            clock_origin_s=self._t0,
        )

    async def _await_go(self) -> None:
        """Worker mode: ready only now that every request can go out on time, then the clock.
        (A pacer started after the clock would make the worker late for its first requests.)"""
        self.control.send(("ready", None))
        kind, origin, trace_start = await asyncio.to_thread(self.control.recv)
        if kind != "go":
            raise DispatchError(f"dispatch worker: expected the clock, got {kind!r}")
        self.clock_origin = origin
        self.given_trace_start_s = trace_start

    def _on_control(self) -> None:
        """A message from the supervising process (worker mode): ("stop", reason)."""
        try:
            kind, reason = self.control.recv()
        except (EOFError, OSError):
            kind, reason = "stop", "supervisor gone"
        if kind == "stop" and self._stop_reason is None:
            self._stop_reason = str(reason)
            self._wake()

    # ----------------------------------------------------------------- preparation

    def _body(self, prompt: str | Sequence[int], max_tokens: int) -> bytes:
        payload = {
            "model": self.model,
            "prompt": prompt if isinstance(prompt, str) else list(prompt),
            "max_tokens": int(max_tokens),
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "ignore_eos": self.ignore_eos,
            "temperature": 0.0,
        }
        return json.dumps(payload, separators=(",", ":")).encode()

    def _prepare(self) -> None:
        """Build every record and request body before the clock starts (off the hot path)."""
        for spec in self.warmup:
            self._records[spec.request_id] = RequestRecord(
                spec.request_id, spec.graph_id, spec.role, True, spec.max_tokens
            )
            self._bodies[spec.request_id] = self._body(spec.prompt, spec.max_tokens)
            self._build_wire(spec.request_id)
        for r in self.trace:
            if r.request_id in self._records:
                raise ValueError(f"request id {r.request_id} appears twice")
            self._records[r.request_id] = RequestRecord(
                r.request_id, r.graph_id, r.role, False, r.max_tokens
            )
            self._bodies[r.request_id] = self._body(self.prompts[r.request_id], r.max_tokens)
            self._build_wire(r.request_id)

    def _build_wire(self, rid: str) -> None:
        if self.client == "paced":
            self._wire[rid] = request_bytes(self.base_url, self._bodies[rid], rid)

    # ----------------------------------------------------------------- phases

    async def _run_warmup(self) -> None:
        if not self.warmup:
            return
        log.info("sending %d warm-up requests", len(self.warmup))
        spacing = self.warmup_spacing_s
        if self._paced is not None:
            self._paced.push([(k * spacing, spec.request_id) for k, spec in enumerate(self.warmup)])
            while self._warm_done < len(self.warmup) and self._stop_reason is None:
                await self._wait_wake(None)
        else:
            tasks = []
            for k, spec in enumerate(self.warmup):
                rec = self._records[spec.request_id]
                rec.scheduled_s = k * spacing
                tasks.append(asyncio.create_task(self._send_warmup_at(rec)))
            await asyncio.gather(*tasks)
        ok = sum(1 for s in self.warmup if self._records[s.request_id].status == "ok")
        log.info("warm-up done at %.3f s: %d/%d ok", self.clock(), ok, len(self.warmup))

    async def _send_warmup_at(self, rec: RequestRecord) -> None:
        """Send a warm-up at its scheduled time (at once when that has passed)."""
        assert rec.scheduled_s is not None
        delay = rec.scheduled_s - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)
        await self._send(rec)

    async def _run_trace(self) -> None:
        self._push([(self._trace_t0 + t_s, rid) for t_s, rid in self.tracker.initial()])
        total = len(self.trace)
        log.info("trace starts at %.3f s: %d requests", self._trace_t0, total)
        if self._paced is not None:  # the pacer sends; the loop waits for every answer
            while self._trace_done < total and self._stop_reason is None:
                await self._wait_wake(None)
            return
        heap = self._heap
        while self._launched < total and self._stop_reason is None:
            if not heap:
                await self._wait_wake(None)
                continue
            due = heap[0][0]
            remaining = due - self.clock()
            if remaining > SPIN_S:
                await self._wait_wake(remaining - SPIN_S)
                continue
            if remaining > 0:
                await asyncio.sleep(0)
                continue
            _, _, rid = heapq.heappop(heap)
            rec = self._records[rid]
            rec.scheduled_s = due
            self._launched += 1
            task = asyncio.create_task(self._send(rec, trace=True))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._stop_reason is None:
            while self._tasks:
                await asyncio.gather(*list(self._tasks))
        else:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _push(self, items: list[tuple[float, str]]) -> None:
        """Schedule (due, request id) items (one message to the paced client's pacer)."""
        if not items:
            return
        if self._paced is not None:
            self._paced.push(items)
            return
        for due, rid in items:
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, rid))
        self._wake()

    def _wake(self) -> None:
        if self._waker is not None and not self._waker.done():
            self._waker.set_result(None)

    async def _wait_wake(self, delay: float | None) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waker = fut
        handle = None
        if delay is not None:
            handle = loop.call_later(delay, lambda: None if fut.done() else fut.set_result(None))
        try:
            await fut
        finally:
            if handle is not None:
                handle.cancel()
            self._waker = None

    async def _timed(self, action: TimedAction) -> None:
        await run_timed_action(
            action, clock=self.clock, stop=self._stop, started=self._actions_started
        )

    def _stop(self, reason: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
        self._wake()

    async def _progress(self) -> None:
        total = len(self.trace) + len(self.warmup)
        while True:
            await asyncio.sleep(self.progress_interval_s)
            log.info(
                "t=%.0f s: %d/%d sent, %d done, %d in flight, %d failed",
                self.clock(),
                self._paced.taken if self._paced is not None else self._launched + len(self.warmup),
                total,
                self._done,
                self._paced.in_flight() if self._paced is not None else len(self._tasks),
                self._errors,
            )

    # ----------------------------------------------------------------- one request

    async def _send(self, rec: RequestRecord, trace: bool = False) -> None:
        shard = self._clients.acquire()
        try:
            await self._stream(self._clients.clients[shard], rec)
        except asyncio.CancelledError:
            rec.status = "error"
            rec.error = f"run interrupted: {self._stop_reason or 'cancelled'}"
            rec.finished_s = self.clock()
            if self._stop_reason is None:
                raise
        finally:
            self._clients.release(shard)
            self._finished(rec, trace)

    def _finished(self, rec: RequestRecord, trace: bool) -> None:
        """Book-keeping when a request has ended, whatever its status; releases its dependents."""
        if rec.finished_s is None:
            rec.finished_s = self.clock()
        self._done += 1
        if rec.status != "ok":
            self._errors += 1
        if trace and self._stop_reason is None:
            released = self.tracker.finish(rec.request_id, rec.finished_s - self._trace_t0)
            self._push([(self._trace_t0 + t_s, dep) for t_s, dep in released])

    # ----------------------------------------------------------------- the paced client

    def _paced_done(self, rec: RequestRecord) -> None:
        """Loop thread: a paced request has ended."""
        self._finished(rec, not rec.warmup)
        if rec.warmup:
            self._warm_done += 1
            if self._warm_done == len(self.warmup):
                self._wake()
        else:
            self._trace_done += 1
            if self._trace_done == len(self.trace):
                self._wake()

    def _pacer_crashed(self, exc: BaseException) -> None:
        """The pacer failed: the run stops as interrupted, with every request recorded."""
        log.error("%s: stopping the run", exc)
        self._stop(str(exc))

    async def _halt_pacer(self) -> None:
        """Stop sending; end what is still streaming with the interruption's reason."""
        if self._paced is not None:
            await self._paced.stop(f"run interrupted: {self._stop_reason or 'cancelled'}")

    async def _stream(self, client: httpx.AsyncClient, rec: RequestRecord) -> None:
        rec.sent_s = sent = self.clock()
        overhead: list[float] = []  # the last attempt's (a stale connection's retry pays both)
        connected: list[bool] = []  # a new connection was opened for this attempt

        async def trace_hook(name: str, info: dict[str, Any]) -> None:
            if name == "http11.send_request_headers.started":
                overhead[:] = [self.clock() - sent]
            elif name == "http11.send_request_body.complete":
                rec.written_s = self.clock()  # the whole request is on the wire
            elif name == "connection.connect_tcp.started":
                connected.append(True)

        def build() -> httpx.Request:
            return client.build_request(
                "POST",
                "/v1/completions",
                content=self._bodies[rec.request_id],
                headers={"content-type": "application/json", REQUEST_ID_HEADER: rec.request_id},
                extensions={"trace": trace_hook},
            )

        try:
            async with asyncio.timeout(self.request_timeout_s):
                for attempt in range(STALE_RETRIES + 1):
                    connected.clear()
                    try:
                        response = await client.send(build(), stream=True)
                        break
                    except (httpx.RemoteProtocolError, httpx.ReadError):
                        # no response on a reused keep-alive connection: the server closed it
                        # idle (llama-server closes every connection after a streamed response;
                        # servelab.dispatch.paced's docstring has the source)
                        if connected or attempt == STALE_RETRIES:
                            raise
                        self._stale_retries += 1
                try:
                    if response.status_code != 200:
                        body = (await response.aread()).decode("utf-8", "replace")
                        rec.error = f"HTTP {response.status_code}: {body[:ERROR_TEXT_MAX]}"
                        return
                    await self._read_events(response, rec)
                finally:
                    await response.aclose()
        except TimeoutError:
            rec.status = "timeout"
            rec.error = f"no complete response within {self.request_timeout_s:g} s"
        except (httpx.HTTPError, OSError) as exc:
            rec.status = "error"
            rec.error = describe_error(exc)
        finally:
            rec.finished_s = self.clock()
            self._send_overheads.extend(overhead)

    async def _read_events(self, response: httpx.Response, rec: RequestRecord) -> None:
        stream = ChunkRecorder(rec)
        clock = self.clock
        async for raw in response.aiter_raw():
            if not stream.feed(raw, clock()):
                return
        stream.end()

    # ----------------------------------------------------------------- after the run

    def _mark_unsent(self) -> None:
        """Requests never sent (the run was interrupted) are recorded, with no sent_s."""
        for r in self.trace:
            rec = self._records[r.request_id]
            if rec.scheduled_s is None:
                # never released or never due: the earliest it could have been scheduled
                rec.scheduled_s = self._trace_t0 + r.arrival_s + r.tool_delay_s
                rec.status = "error"
                rec.error = f"not sent: run interrupted ({self._stop_reason})"
        for spec in self.warmup:
            rec = self._records[spec.request_id]
            if rec.scheduled_s is None:
                rec.scheduled_s = 0.0
                rec.error = rec.error or "not sent"


def fill_token_counts(
    records: Iterable[RequestRecord], count_tokens: Callable[[list[str]], list[int]] | None
) -> tuple[dict[str, int], int]:
    """Replace unknown per-chunk token counts by tokenizing the chunks' text; return how many
    requests were counted each way and how many ok requests' sums disagree with their usage."""
    records = list(records)
    sources = {"usage": 0, "tokenizer": 0}
    pending: list[RequestRecord] = []
    for rec in records:
        if not rec.chunk_tokens:
            continue
        if any(t is None for t in rec.chunk_tokens):
            pending.append(rec)
            sources["tokenizer"] += 1
        else:
            sources["usage"] += 1
    if pending:
        if count_tokens is None:
            raise DispatchError(
                "the server sent chunks without usage and no tokenizer was given to count them"
            )
        texts = [
            t
            for rec in pending
            for t, n in zip(rec.chunk_texts or [], rec.chunk_tokens, strict=True)
            if n is None
        ]
        counts = iter(count_tokens(texts))
        for rec in pending:
            rec.chunk_tokens = [next(counts) if n is None else n for n in rec.chunk_tokens]
    mismatches = 0
    for rec in records:
        rec.chunk_texts = None
        if (
            rec.chunk_tokens
            and rec.output_tokens is not None
            and rec.status == "ok"
            and sum(rec.chunk_tokens) != rec.output_tokens  # type: ignore[arg-type]
        ):
            mismatches += 1
    return sources, mismatches
