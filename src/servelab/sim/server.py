"""The live simulated engine: an OpenAI-compatible HTTP server running an engine model in real time.

An engine model (servelab.sim's vLLM-like and SGLang-like schedulers, or `ConstantModel`,
servelab.sim.constant) is a clock-independent state machine with one interface
(`servelab.sim.base.EngineModel`): `add_request`, `abort`, `has_work`, `step(now) -> Iteration`,
`metrics()`. This server drives it on the real clock through its engine loop
(`servelab.sim.server_loop.EngineLoop`): the loop asks the model for the next iteration, sleeps
for that iteration's duration, then pushes the tokens it emitted to the waiting streams. Requests
that arrive during an iteration join at the next one, as in the real engines.

The HTTP side, request parsing, the answers in each engine's OpenAI dialect and fault injection
are `servelab.sim.server_http`; this module routes requests and ties the two together. Endpoints,
imitating vLLM 0.6.3 and SGLang 0.4.1 (upstream sources in docs/engines.md, "Upstream sources"):

- `POST /v1/completions`: `prompt` as text (tokenized with the workload tokenizer; BOS prepended as
  the engines do, so usage reports L + 1) or token ids; `max_tokens`, `ignore_eos` (the simulated
  engine never samples EOS: every request generates exactly `max_tokens`), `stream` (SSE `data:`
  events ending `data: [DONE]`), `stream_options.include_usage` with each engine's quirks (its
  `EngineSpec.openai`, `servelab.engines.spec.OpenAIDialect`): vLLM attaches cumulative usage to
  every chunk (`continuous_usage_stats` defaults to true) and ends with a usage-only chunk;
  SGLang sends one final usage chunk; SGLang's non-final chunks carry `finish_reason: ""`, vLLM's
  `null`.
- `GET /health`, `GET /v1/models`, `GET /metrics` (Prometheus exposition from prometheus_client,
  under the engine's own metric names, label `model_name`).
- `GET /servelab/instance`: this process's identity (instance id, node id, pid), for node
  identity and reclamation detection; `GET /servelab/stats`: engine-loop timing (the achieved
  interval between back-to-back iterations: the true inter-token latency of a ConstantModel);
  `GET /servelab/arrivals`: each request's X-Request-Id and when its last byte was read
  (`time.perf_counter()`, CLOCK_MONOTONIC, which every process on the machine shares).

Fault injection (for the dispatcher's fault tests and the local backend; `FaultConfig`): crash at
a time, HTTP 500 with a probability, a stalled engine from a time on, a malformed SSE chunk or a
connection reset with a probability.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import h11
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from servelab.engines.metrics import ENGINE_METRICS
from servelab.engines.registry import engine_names, engine_spec
from servelab.sim.base import EngineModel
from servelab.sim.constant import ConstantModel
from servelab.sim.server_http import (
    MAX_BODY,
    FaultConfig,
    HttpError,
    OpenAIAnswers,
    Stream,
    fault_decision,
    new_request_id,
    parse_completion,
    read_request,
    reset_connection,
    respond,
    respond_json,
    start_stream,
)
from servelab.sim.server_loop import EngineLoop

__all__ = [
    "ConstantModel",
    "EngineModel",
    "FaultConfig",
    "ServerThread",
    "SimServer",
    "fault_decision",
]

log = logging.getLogger(__name__)

_MAX_ARRIVALS = 1_000_000  # a server up for days keeps at most this many (about 100 MB)


# --------------------------------------------------------------------------- metrics


class _ModelCollector:
    """Exposes the model's current metric values at scrape time (counters end in `_total`)."""

    def __init__(self, server: SimServer) -> None:
        self._server = server

    def collect(self) -> Any:
        labels = ["model_name"]
        values = [self._server.served_model_name]
        types = ENGINE_METRICS.get(self._server.engine, {})
        for name, value in sorted(self._server.model.metrics().items()):
            if types.get(name, "counter" if name.endswith("_total") else "gauge") == "counter":
                family: Any = CounterMetricFamily(name[: -len("_total")], name, labels=labels)
            else:
                family = GaugeMetricFamily(name, name, labels=labels)
            family.add_metric(values, float(value))
            yield family


# --------------------------------------------------------------------------- the server


class SimServer:
    """An OpenAI-compatible server around one engine model, on the real clock.

    `tokenize` turns prompt text into token ids without special tokens (the model prepends BOS,
    as the engines do; `prompt_token_offset` is then 1, so usage reports L + 1). `on_crash` runs
    when an injected crash fires, after every connection has been reset and the listener closed
    (the command-line server exits the process there; in-process tests keep running).
    """

    def __init__(
        self,
        model: EngineModel,
        *,
        engine: str,
        served_model_name: str,
        tokenize: Callable[[str], list[int]] | None = None,
        token_text: str = " the",
        max_model_len: int | None = None,
        stream_interval: int = 1,
        faults: FaultConfig | None = None,
        node_id: str | None = None,
        on_crash: Callable[[], None] | None = None,
        prompt_token_offset: int = 0,
    ) -> None:
        if engine not in engine_names():
            raise ValueError(
                f"unknown engine {engine!r}; expected one of {', '.join(engine_names())}"
            )
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        self.model = model
        self.engine = engine
        self.dialect = engine_spec(engine).openai
        self.served_model_name = served_model_name
        self.tokenize = tokenize
        self.token_text = token_text
        self.max_model_len = max_model_len
        self.stream_interval = stream_interval
        self.answers = OpenAIAnswers(
            self.dialect,
            served_model_name=served_model_name,
            token_text=token_text,
            stream_interval=stream_interval,
        )
        self.faults = faults or FaultConfig()
        self.instance_id = uuid.uuid4().hex
        self.node_id = node_id or self.instance_id
        self.on_crash = on_crash
        self.prompt_token_offset = int(prompt_token_offset)
        self.started_unix_s = time.time()
        self._t0 = time.perf_counter()
        self._streams: dict[str, Stream] = {}
        self._writers: set[asyncio.StreamWriter] = set()
        self.engine_loop = EngineLoop(
            model, now=self.now, deliver=self._deliver, halted=lambda: self.crashed
        )
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._request_index = 0
        self.crashed = False
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_ModelCollector(self))
        self.requests_total = 0
        # X-Request-Id -> when the request's last byte had been read (time.perf_counter(), the
        # machine's CLOCK_MONOTONIC): the dispatcher's lag as the server sees it (benchmarks)
        self.arrivals: dict[str, float] = {}

    # ----------------------------------------------------------------- lifecycle

    def now(self) -> float:
        """Seconds since the server started (the model's clock)."""
        return time.perf_counter() - self._t0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on (host, port) and start the engine loop; returns the bound port."""
        self._server = await asyncio.start_server(self._handle_connection, host, port, backlog=1024)
        bound = self._server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.engine_loop.run(), name="engine-loop"))
        if self.faults.crash_at_s is not None:
            self._tasks.append(loop.create_task(self._fault_at(self.faults.crash_at_s, self.crash)))
        if self.faults.stall_at_s is not None:
            self._tasks.append(loop.create_task(self._fault_at(self.faults.stall_at_s, self.stall)))
        log.info("%s-like simulated engine listening on %s:%d", self.engine, host, bound)
        return int(bound)

    async def close(self) -> None:
        """Stop listening, end every connection and the engine loop."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _fault_at(self, at_s: float, action: Callable[[], None]) -> None:
        await asyncio.sleep(max(0.0, at_s - self.now()))
        action()

    def stall(self) -> None:
        """Injected fault: the engine stops stepping; connections and /health stay up."""
        log.warning("injected fault: engine stalled at %.3f s", self.now())
        self.engine_loop.stall()

    def crash(self) -> None:
        """Injected fault: every connection is reset and the listener closes at once."""
        log.error("injected fault: server crashing at %.3f s", self.now())
        self.crashed = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            reset_connection(writer)
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.on_crash is not None:
            self.on_crash()

    def _deliver(self, req_id: str, n_tokens: int, finished: bool) -> None:
        """The engine loop's tokens for one request, to its stream if it still has one."""
        stream = self._streams.get(req_id)
        if stream is not None and self.answers.deliver(stream, n_tokens, finished):
            self.model.abort(req_id)  # the stream's connection was reset

    # ----------------------------------------------------------------- connections

    async def _handle_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self.crashed:
            reset_connection(writer)
            return
        self._writers.add(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_BODY)
        try:
            while not self.crashed:
                request, body = await read_request(conn, reader)
                if request is None:
                    break
                self._note_arrival(request)
                await self._dispatch(conn, reader, writer, request, body)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    break
                if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                    conn.start_next_cycle()
                else:
                    break
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            if not writer.is_closing():
                writer.close()

    async def _dispatch(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: h11.Request,
        body: bytes,
    ) -> None:
        method = request.method.decode()
        target = request.target.decode().split("?", 1)[0]
        me = self.instance_id
        try:
            if target == "/v1/completions":
                if method != "POST":
                    raise HttpError(405, f"method {method} not allowed", "MethodNotAllowed")
                await self._completions(conn, reader, writer, body)
            elif method != "GET":
                raise HttpError(405, f"method {method} not allowed", "MethodNotAllowed")
            elif target == "/health":
                respond(conn, writer, me, 200, b"", b"application/json")
            elif target == "/v1/models":
                respond_json(conn, writer, me, 200, self._models())
            elif target == "/metrics":
                body = generate_latest(self._registry)
                respond(conn, writer, me, 200, body, CONTENT_TYPE_LATEST.encode())
            elif target == "/servelab/instance":
                respond_json(conn, writer, me, 200, self.identity())
            elif target == "/servelab/stats":
                respond_json(conn, writer, me, 200, self.stats())
            elif target == "/servelab/arrivals":
                respond_json(conn, writer, me, 200, self.arrivals)
            else:
                raise HttpError(404, f"no route {target}", "NotFoundError")
        except HttpError as exc:
            if conn.our_state is h11.SEND_RESPONSE:
                respond_json(conn, writer, me, exc.status, exc.error_body())

    def _note_arrival(self, request: h11.Request) -> None:
        for name, value in request.headers:
            if name == b"x-request-id":
                if len(self.arrivals) < _MAX_ARRIVALS:
                    self.arrivals[value.decode("latin-1")] = time.perf_counter()
                return

    def identity(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "engine": self.engine,
            "started_unix_s": self.started_unix_s,
        }

    def stats(self) -> dict[str, Any]:
        loop = self.engine_loop
        return {
            "iterations": loop.iterations,
            "busy_intervals": loop.busy_intervals,
            "busy_interval_s": loop.busy_interval_s,
            "mean_interval_s": (
                loop.busy_interval_s / loop.busy_intervals if loop.busy_intervals else None
            ),
            "mean_overrun_s": loop.iteration_overrun_s / loop.iterations
            if loop.iterations
            else None,
            "requests_total": self.requests_total,
            "in_flight": len(self._streams),
        }

    def _models(self) -> dict[str, Any]:
        return self.answers.models(
            created=int(self.started_unix_s), owned_by=self.engine, max_model_len=self.max_model_len
        )

    # ----------------------------------------------------------------- completions

    async def _completions(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        body: bytes,
    ) -> None:
        index = self._request_index
        self._request_index += 1
        self.requests_total += 1
        seed = self.faults.seed
        if fault_decision(seed, index, "http500", self.faults.http500_rate):
            raise HttpError(500, "injected fault: internal server error", "InternalServerError")
        req = parse_completion(
            body, dialect=self.dialect, tokenize=self.tokenize, max_model_len=self.max_model_len
        )
        req_id = new_request_id(self.dialect)
        loop = asyncio.get_running_loop()
        st = Stream(
            req_id=req_id,
            conn=conn,
            writer=writer,
            stream=req.stream,
            include_usage=req.include_usage,
            continuous_usage=req.continuous_usage,
            prompt_tokens=len(req.prompt_ids) + self.prompt_token_offset,
            max_tokens=req.max_tokens,
            created=int(time.time()),
            malformed=req.stream
            and fault_decision(seed, index, "malformed", self.faults.malformed_rate),
            reset=fault_decision(seed, index, "reset", self.faults.reset_rate),
            done=loop.create_future(),
        )
        assert st.done is not None  # set just above
        if req.stream:
            start_stream(conn, writer, self.instance_id)
        self._streams[req_id] = st
        self.model.add_request(req_id, req.prompt_ids, req.max_tokens, self.now())
        self.engine_loop.wake.set()
        disconnect = loop.create_task(reader.read(1))
        either: set[asyncio.Future[Any]] = {st.done, disconnect}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not st.done.done():  # the client went away (or the server is closing)
                self.model.abort(req_id)
                st.done.cancel()
            self._streams.pop(req_id, None)
            forget = getattr(self.model, "forget", None)
            if forget is not None:
                with contextlib.suppress(KeyError, ValueError):
                    forget(req_id)
            if not disconnect.done():
                disconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await disconnect  # also retrieves a reset's exception
        if st.error == "reset" or not st.done.done() or st.done.cancelled():
            raise ConnectionResetError(f"request {req_id} ended early")
        if not req.stream:
            respond_json(conn, writer, self.instance_id, 200, self.answers.full_response(st))


class ServerThread:
    """Run a SimServer on its own event loop in a background thread (tests, benchmarks).

    `factory` builds the server inside that thread. Use as a context manager; `base_url` is set
    once it listens. `call(fn)` runs `fn(server)` on the server's loop (thread-safe) and returns
    its result, e.g. `thread.call(lambda s: s.crash())`.
    """

    def __init__(self, factory: Callable[[], SimServer], host: str = "127.0.0.1", port: int = 0):
        self._factory = factory
        self._host = host
        self._port = port
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="sim-server", daemon=True)
        self.server: SimServer | None = None
        self.base_url = ""

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                self.server = self._factory()
                port = await self.server.start(self._host, self._port)
                self.base_url = f"http://{self._host}:{port}"
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            await self._stop.wait()
            await self.server.close()

        asyncio.run(main())

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("sim server thread did not start within 30 s")
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn: Callable[[SimServer], Any], timeout_s: float = 10.0) -> Any:
        assert self._loop is not None and self.server is not None
        server = self.server

        async def run() -> Any:
            return fn(server)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout_s)

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
