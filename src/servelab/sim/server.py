"""The live simulated engine: an OpenAI-compatible HTTP server running an engine model in real time.

An engine model (servelab.sim's vLLM-like and SGLang-like schedulers, or `ConstantModel` here) is a
clock-independent state machine with one interface (`servelab.sim.base.EngineModel`): `add_request`,
`abort`, `has_work`, `step(now) -> Iteration`, `metrics()`. This server drives it on the real clock: the engine loop asks the model for the next
iteration, sleeps for that iteration's duration, then pushes the tokens it emitted to the waiting
streams. Requests that arrive during an iteration join at the next one, as in the real engines.

HTTP is HTTP/1.1 over asyncio streams with h11 doing the protocol (keep-alive, chunked transfer
encoding); no web framework. Endpoints, imitating vLLM 0.6.3 and SGLang 0.4.1
(upstream sources in docs/engines.md, "Upstream sources"):

- `POST /v1/completions`: `prompt` as text (tokenized with the workload tokenizer; BOS prepended as
  the engines do, so usage reports L + 1) or token ids; `max_tokens`, `ignore_eos` (the simulated
  engine never samples EOS: every request generates exactly `max_tokens`), `stream` (SSE `data:`
  events ending `data: [DONE]`), `stream_options.include_usage` with each engine's quirks: vLLM
  attaches cumulative usage to every chunk (`continuous_usage_stats` defaults to true) and ends
  with a usage-only chunk; SGLang sends one final usage chunk; SGLang's non-final chunks carry
  `finish_reason: ""`, vLLM's `null`.
- `GET /health`, `GET /v1/models`, `GET /metrics` (Prometheus exposition from prometheus_client,
  under the engine's own metric names, label `model_name`).
- `GET /servelab/instance`: this process's identity (instance id, node id, pid), for node
  identity and reclamation detection; `GET /servelab/stats`: engine-loop timing (the achieved
  interval between back-to-back iterations: the true inter-token latency of a ConstantModel);
  `GET /servelab/arrivals`: each request's X-Request-Id and when its last byte was read
  (`time.perf_counter()`, CLOCK_MONOTONIC, which every process on the machine shares).

Fault injection (for the dispatcher's fault tests and the local backend): crash at a time, HTTP 500
with a probability, a stalled engine from a time on, a malformed SSE chunk or a connection reset
with a probability. Each probabilistic decision is a pure function of (seed, request index, kind),
so the number of faulted requests among N is exact whatever their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import h11
import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from servelab.engines.metrics import ENGINE_METRICS, METRIC_MAP
from servelab.engines.registry import engine_names, product_of
from servelab.sim.base import DECODING, FINISHED, EngineModel, Iteration, Req

__all__ = [
    "ConstantModel",
    "EngineModel",
    "FaultConfig",
    "ServerThread",
    "SimServer",
    "fault_decision",
]

log = logging.getLogger(__name__)

_MAX_BODY = 64 * 1024 * 1024
_MAX_ARRIVALS = 1_000_000  # a server up for days keeps at most this many (about 100 MB)
_RESYNC_S = 0.05  # an engine loop further behind its plan than this restarts from "now"
_SERVER_HEADER = b"uvicorn"  # both engines' OpenAI servers run on uvicorn


# --------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class FaultConfig:
    """Injected faults. Times are seconds from server start; rates are per completion request."""

    crash_at_s: float | None = None
    http500_rate: float = 0.0
    stall_at_s: float | None = None
    malformed_rate: float = 0.0
    reset_rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("http500_rate", "malformed_rate", "reset_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"fault {name} must be within [0, 1], got {value}")
        for name in ("crash_at_s", "stall_at_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"fault {name} must be >= 0, got {value}")


def fault_decision(seed: int, index: int, kind: str, rate: float) -> bool:
    """Whether the `index`-th completion request (from 0) suffers fault `kind` at `rate`.

    A pure function of its arguments (a SHA-256 draw), so tests can count faults exactly.
    """
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    digest = hashlib.sha256(f"{seed}:{index}:{kind}".encode()).digest()
    draw = int.from_bytes(digest[:8], "big") / 2.0**64
    return draw < rate


# --------------------------------------------------------------------------- a constant-cost model


class ConstantModel(EngineModel):
    """A trivial engine model for tests and the dispatcher benchmark: every iteration lasts exactly
    `itl_s` and gives one token to every request in the engine (new requests included: their
    first token comes at the end of the first iteration they join), with unlimited batching.

    Its true inter-token latency is therefore the server's achieved iteration length, which the
    dispatcher benchmark compares its measured ITL against. Metrics are exported under the
    engine's own names (engines.METRIC_MAP) with simple values. The prompt is taken as given (no
    BOS), and every request is decoding from the iteration it joins.
    """

    def __init__(self, engine: str, *, itl_s: float = 0.02) -> None:
        if engine not in engine_names():
            raise ValueError(f"unknown engine {engine!r}")
        if itl_s <= 0:
            raise ValueError(f"itl_s must be positive, got {itl_s}")
        self.engine = engine
        self.itl_s = itl_s
        self.bos_token_id = None
        self.reqs: dict[str, Req] = {}
        self._uid = 0
        self._times: dict[str, list[float]] = {}
        self._waiting: dict[str, Req] = {}
        self._running: dict[str, Req] = {}
        self._prompt_total = 0
        self._generation_total = 0

    def add_request(
        self, req_id: str, prompt_token_ids: Sequence[int] | np.ndarray, max_tokens: int, now: float
    ) -> None:
        if req_id in self._waiting or req_id in self._running:
            raise ValueError(f"request {req_id} added twice")
        self.reqs.pop(req_id, None)  # a finished request's id may come again
        ids = self._prompt_ids(req_id, prompt_token_ids, max_tokens)
        self._waiting[req_id] = self._new_request(req_id, ids, int(max_tokens), now)
        self._times[req_id] = []

    def abort(self, req_id: str) -> None:
        self._waiting.pop(req_id, None)
        self._running.pop(req_id, None)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def step(self, now: float) -> Iteration:
        for rid, r in self._waiting.items():
            self._prompt_total += r.prompt_len
            r.state = DECODING
            self._running[rid] = r
        self._waiting.clear()
        emitted = tuple(self._running)
        finished = []
        for rid in emitted:
            r = self._running[rid]
            r.out += 1
            self._times[rid].append(now + self.itl_s)
            if r.out >= r.max_tokens:
                r.state = FINISHED
                del self._running[rid]
                finished.append(rid)
        self._generation_total += len(emitted)
        return Iteration(
            start_s=now,
            duration_s=self.itl_s,
            kind="decode",
            batch_size=len(emitted),
            prefill_tokens=0,
            computed_tokens=0,
            cached_tokens=0,
            decode_tokens=len(emitted),
            emitted=emitted,
            finished=tuple(finished),
        )

    def token_times(self, req_id: str) -> np.ndarray:
        return np.asarray(self._times[req_id], dtype=np.float64)

    def output_tokens(self, req_id: str) -> int:
        return self.reqs[req_id].out

    def forget(self, req_id: str) -> None:
        self.reqs.pop(req_id, None)
        self._times.pop(req_id, None)

    def metrics(self) -> dict[str, float]:
        values = {
            "kv_cache_usage": min(1.0, len(self._running) / 256.0),
            "requests_running": float(len(self._running)),
            "requests_waiting": float(len(self._waiting)),
            "preemptions_total": 0.0,
            "prompt_tokens_total": float(self._prompt_total),
            "generation_tokens_total": float(self._generation_total),
            "prefix_cache_hit_rate": 0.0,
        }
        return {
            source: values[canonical]
            for canonical, source in METRIC_MAP[self.engine].items()
            if source is not None and canonical in values
        }


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


# --------------------------------------------------------------------------- streams


class _HttpError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass
class _Stream:
    """One in-flight completion: its connection, options and progress."""

    req_id: str
    conn: h11.Connection
    writer: asyncio.StreamWriter
    stream: bool
    include_usage: bool
    continuous_usage: bool
    prompt_tokens: int
    max_tokens: int
    created: int
    malformed: bool = False
    reset: bool = False
    generated: int = 0
    pending: int = 0
    chunks_sent: int = 0
    done: asyncio.Future[None] | None = None
    error: str | None = None
    text_parts: list[str] = field(default_factory=list)


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
        self.product = product_of(engine)
        self.served_model_name = served_model_name
        self.tokenize = tokenize
        self.token_text = token_text
        self.max_model_len = max_model_len
        self.stream_interval = stream_interval
        self.faults = faults or FaultConfig()
        self.instance_id = uuid.uuid4().hex
        self.node_id = node_id or self.instance_id
        self.on_crash = on_crash
        self.prompt_token_offset = int(prompt_token_offset)
        self.started_unix_s = time.time()
        self._t0 = time.perf_counter()
        self._streams: dict[str, _Stream] = {}
        self._writers: set[asyncio.StreamWriter] = set()
        self._wake = asyncio.Event()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._request_index = 0
        self._stalled = False
        self.crashed = False
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_ModelCollector(self))  # type: ignore[arg-type]
        # engine-loop statistics (true ITL: the achieved length of decode-emitting iterations)
        self.iterations = 0
        self.iteration_overrun_s = 0.0
        self.busy_intervals = 0
        self.busy_interval_s = 0.0
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
        self._tasks.append(loop.create_task(self._engine_loop(), name="engine-loop"))
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
        self._stalled = True

    def crash(self) -> None:
        """Injected fault: every connection is reset and the listener closes at once."""
        log.error("injected fault: server crashing at %.3f s", self.now())
        self.crashed = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            _reset(writer)
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.on_crash is not None:
            self.on_crash()

    # ----------------------------------------------------------------- engine loop

    async def _engine_loop(self) -> None:
        """Step the model back to back on the real clock.

        While busy, each iteration starts at the previous one's planned end (sleep overshoot does
        not accumulate); after idling, or when more than `_RESYNC_S` behind, at the current time.
        """
        planned_end: float | None = None
        prev_end: float | None = None  # end of the previous iteration while busy
        while True:
            if self._stalled or not self.model.has_work():
                self._wake.clear()
                planned_end = prev_end = None
                if self._stalled:
                    await asyncio.Event().wait()  # forever (cancelled at close)
                if not self.model.has_work():
                    await self._wake.wait()
                continue
            now = self.now()
            start = (
                planned_end if planned_end is not None and now - planned_end < _RESYNC_S else now
            )
            it = self.model.step(start)
            duration = it.duration_s
            emitted = it.emitted
            finished = (*it.finished, *it.rejected)  # a refused prompt ends with no output
            if duration <= 0 and not emitted and not finished:
                planned_end = prev_end = None
                await asyncio.sleep(0.001)  # nothing could be scheduled: do not spin
                continue
            planned_end = start + duration
            # always yield, even when late, so requests keep being read and chunks written
            await asyncio.sleep(max(0.0, planned_end - self.now()))
            end = self.now()
            self.iterations += 1
            self.iteration_overrun_s += max(0.0, end - planned_end)
            if prev_end is not None:  # back-to-back iterations: the achieved emission interval
                self.busy_intervals += 1
                self.busy_interval_s += end - prev_end
            prev_end = end
            if self._stalled or self.crashed:
                continue
            finished_set = set(finished)
            for rid in emitted:  # one token each
                stream = self._streams.get(rid)
                if stream is not None:
                    self._emit(stream, 1, rid in finished_set)
            for rid in finished_set.difference(emitted):
                stream = self._streams.get(rid)
                if stream is not None:
                    self._emit(stream, 0, True)

    # ----------------------------------------------------------------- connections

    async def _handle_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self.crashed:
            _reset(writer)
            return
        self._writers.add(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_BODY)
        try:
            while not self.crashed:
                request, body = await self._read_request(conn, reader)
                if request is None:
                    break
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

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader
    ) -> tuple[h11.Request | None, bytes]:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                if not data and request is None:
                    return None, b""
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > _MAX_BODY:
                    raise h11.RemoteProtocolError("request body too large")
            elif isinstance(event, h11.EndOfMessage):
                if request is not None:
                    self._note_arrival(request)
                return request, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

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
        try:
            if target == "/v1/completions":
                if method != "POST":
                    raise _HttpError(405, f"method {method} not allowed", "MethodNotAllowed")
                await self._completions(conn, reader, writer, body)
            elif method != "GET":
                raise _HttpError(405, f"method {method} not allowed", "MethodNotAllowed")
            elif target == "/health":
                self._respond(conn, writer, 200, b"", b"application/json")
            elif target == "/v1/models":
                self._respond_json(conn, writer, 200, self._models())
            elif target == "/metrics":
                self._respond(
                    conn, writer, 200, generate_latest(self._registry), CONTENT_TYPE_LATEST.encode()
                )
            elif target == "/servelab/instance":
                self._respond_json(conn, writer, 200, self.identity())
            elif target == "/servelab/stats":
                self._respond_json(conn, writer, 200, self.stats())
            elif target == "/servelab/arrivals":
                self._respond_json(conn, writer, 200, self.arrivals)
            else:
                raise _HttpError(404, f"no route {target}", "NotFoundError")
        except _HttpError as exc:
            if conn.our_state is h11.SEND_RESPONSE:
                self._respond_json(
                    conn,
                    writer,
                    exc.status,
                    {
                        "object": "error",
                        "message": exc.message,
                        "type": exc.kind,
                        "code": exc.status,
                    },
                )

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
        return {
            "iterations": self.iterations,
            "busy_intervals": self.busy_intervals,
            "busy_interval_s": self.busy_interval_s,
            "mean_interval_s": (
                self.busy_interval_s / self.busy_intervals if self.busy_intervals else None
            ),
            "mean_overrun_s": self.iteration_overrun_s / self.iterations
            if self.iterations
            else None,
            "requests_total": self.requests_total,
            "in_flight": len(self._streams),
        }

    def _models(self) -> dict[str, Any]:
        card: dict[str, Any] = {
            "id": self.served_model_name,
            "object": "model",
            "created": int(self.started_unix_s),
            "owned_by": self.engine,
            "root": self.served_model_name,
        }
        if self.product == "vllm":
            card["max_model_len"] = self.max_model_len
        return {"object": "list", "data": [card]}

    # ----------------------------------------------------------------- HTTP output

    def _headers(self, content_type: bytes, extra: Sequence[tuple[bytes, bytes]] = ()) -> list:
        return [
            (b"server", _SERVER_HEADER),
            (b"content-type", content_type),
            (b"x-servelab-instance", self.instance_id.encode()),
            *extra,
        ]

    def _respond(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: bytes,
    ) -> None:
        headers = self._headers(content_type, [(b"content-length", str(len(body)).encode())])
        data = conn.send(h11.Response(status_code=status, headers=headers))
        data += conn.send(h11.Data(data=body)) if body else b""
        data += conn.send(h11.EndOfMessage())
        writer.write(data)

    def _respond_json(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, obj: Any
    ) -> None:
        self._respond(conn, writer, status, json.dumps(obj).encode(), b"application/json")

    # ----------------------------------------------------------------- completions

    def _parse_completion(self, body: bytes) -> tuple[list[int], int, bool, dict[str, Any]]:
        try:
            payload = json.loads(body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _HttpError(400, f"request body is not valid JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise _HttpError(400, "request body must be a JSON object")
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if self.tokenize is None:
                raise _HttpError(
                    400, "this server accepts prompts as token ids only (no tokenizer)"
                )
            ids = self.tokenize(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            ids = [int(t) for t in prompt]
        else:
            raise _HttpError(400, "'prompt' must be a string or a non-empty list of token ids")
        max_tokens = payload.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _HttpError(400, f"'max_tokens' must be a positive integer, got {max_tokens!r}")
        if self.max_model_len is not None and len(ids) + max_tokens > self.max_model_len:
            raise _HttpError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion.",
            )
        stream = bool(payload.get("stream", False))
        options = payload.get("stream_options")
        if options is not None:
            if not isinstance(options, dict):
                raise _HttpError(400, "'stream_options' must be an object")
            if not stream and self.product == "vllm":
                raise _HttpError(400, "Stream options can only be defined when `stream=True`.")
        return ids, max_tokens, stream, options or {}

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
            raise _HttpError(500, "injected fault: internal server error", "InternalServerError")
        ids, max_tokens, stream, options = self._parse_completion(body)
        if self.product == "vllm":
            include_usage = bool(options.get("include_usage", True)) if options else False
            continuous = include_usage and bool(options.get("continuous_usage_stats", True))
            req_id = f"cmpl-{uuid.uuid4().hex}"
        else:
            include_usage = bool(options.get("include_usage", False))
            continuous = False
            req_id = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        st = _Stream(
            req_id=req_id,
            conn=conn,
            writer=writer,
            stream=stream,
            include_usage=include_usage,
            continuous_usage=continuous,
            prompt_tokens=len(ids) + self.prompt_token_offset,
            max_tokens=max_tokens,
            created=int(time.time()),
            malformed=stream
            and fault_decision(seed, index, "malformed", self.faults.malformed_rate),
            reset=fault_decision(seed, index, "reset", self.faults.reset_rate),
            done=loop.create_future(),
        )
        if stream:
            headers = self._headers(b"text/event-stream; charset=utf-8")
            writer.write(conn.send(h11.Response(status_code=200, headers=headers)))
        self._streams[req_id] = st
        self.model.add_request(req_id, ids, max_tokens, self.now())
        self._wake.set()
        disconnect = loop.create_task(reader.read(1))
        try:
            await asyncio.wait({st.done, disconnect}, return_when=asyncio.FIRST_COMPLETED)
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
        if not stream:
            self._respond_json(conn, writer, 200, self._full_response(st))

    def _emit(self, st: _Stream, n_tokens: int, finished: bool) -> None:
        """Deliver `n_tokens` new tokens (and the end, if `finished`) to one stream."""
        st.generated += n_tokens
        if not st.stream:
            if finished and st.done is not None and not st.done.done():
                st.done.set_result(None)
            return
        st.pending += n_tokens
        if st.pending < self.stream_interval and not finished:
            return
        if st.writer.is_closing():
            return
        data = self._chunk(st, st.pending, finished)
        st.pending = 0
        st.chunks_sent += 1
        if st.malformed and st.chunks_sent == min(2, st.max_tokens):
            data = b'data: {"id": "' + st.req_id.encode() + b'", "choices": [{"text": \n\n'
        if finished:
            if st.include_usage:
                data += self._usage_chunk(st)
            data += b"data: [DONE]\n\n"
        out = st.conn.send(h11.Data(data=data))
        if finished:
            out += st.conn.send(h11.EndOfMessage())
        st.writer.write(out)
        if st.reset and st.chunks_sent >= min(2, st.max_tokens):
            _reset(st.writer)
            st.error = "reset"
            if st.done is not None and not st.done.done():
                st.done.set_result(None)
            self.model.abort(st.req_id)
            return
        if finished and st.done is not None and not st.done.done():
            st.done.set_result(None)

    def _usage(self, st: _Stream) -> dict[str, int]:
        return {
            "prompt_tokens": st.prompt_tokens,
            "total_tokens": st.prompt_tokens + st.generated,
            "completion_tokens": st.generated,
        }

    def _chunk(self, st: _Stream, n_tokens: int, finished: bool) -> bytes:
        text = self.token_text * n_tokens
        if self.product == "vllm":
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length" if finished else None,
                "stop_reason": None,
            }
            obj: dict[str, Any] = {
                "id": st.req_id,
                "object": "text_completion",
                "created": st.created,
                "model": self.served_model_name,
                "choices": [choice],
                "usage": self._usage(st) if st.continuous_usage else None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length" if finished else "",
                "matched_stop": None,
            }
            obj = {
                "id": st.req_id,
                "object": "text_completion",
                "created": st.created,
                "model": self.served_model_name,
                "choices": [choice],
                "usage": None,
            }
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    def _usage_chunk(self, st: _Stream) -> bytes:
        ident = st.req_id if self.product == "vllm" else uuid.uuid4().hex
        obj = {
            "id": ident,
            "object": "text_completion",
            "created": st.created,
            "model": self.served_model_name,
            "choices": [],
            "usage": self._usage(st),
        }
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    def _full_response(self, st: _Stream) -> dict[str, Any]:
        return {
            "id": st.req_id,
            "object": "text_completion",
            "created": st.created,
            "model": self.served_model_name,
            "choices": [
                {
                    "index": 0,
                    "text": self.token_text * st.generated,
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": self._usage(st),
        }


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a TCP RST (SO_LINGER 0), like a crashed process's sockets."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


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
