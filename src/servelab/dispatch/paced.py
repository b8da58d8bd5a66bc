"""The paced client: a pacer process sends each request on time; the event loop reads the streams.

Why a second client. With one event loop doing both, a request that falls due while the loop is
reading a burst of chunks waits for the burst: the simulated engine (like the real ones) emits to
every running stream at the end of each iteration, so at 50 requests/s with 128-token streams
about 130 reads arrive together every iteration, and the httpx stack spends about 160 us of CPU on
each (docs/benchmarks/dispatcher.md). Here the time-critical part, waiting for the due time and
writing the request, runs in a pacer process (servelab.dispatch.pacer) that never reads a
stream, and the reading runs on this process's event loop through h11 (the HTTP/1.1 parser httpx
itself uses, via httpcore) on plain sockets.

A connection belongs to one side at a time, so nothing is shared:
- an idle keep-alive connection sits in the pacer's pool;
- the pacer takes one (or connects), writes the request and passes the socket here, with the
  request's `scheduled_s`/`sent_s`; the loop registers it for reading, arms the timeout and
  records the chunks (and writes the rest of a request the socket did not take whole);
- when the response ends the loop unregisters it and gives it back (or closes it).

Everything that ends a request (status, dependents' release) happens on the loop; a release
pushes the dependent into the pacer's schedule.

A server may close a keep-alive connection just after a complete response although it announced
keep-alive. llama.cpp's llama-server closes every connection after a streamed response: its chunked
content provider returns false after `sink.done()` (llama.cpp 0c1e570 (vendored in
llama-cpp-python 0.3.36), tools/server/server-http.cpp, process_handler_response), which
cpp-httplib takes for a cancelled write, so the keep-alive loop ends and the socket is drained for
100 ms and closed (same tree, vendor/cpp-httplib/httplib.cpp, write_content_chunked,
process_server_socket_core, drain_and_close_socket). A dependent released by that response can
be written into the connection before the close is seen. A request written on a reused
connection that ends before a single byte of answer was never answered, so it is sent once more
on a new connection (`stale_retries` counts them); its `sent_s` stays the first send, so the
retry's time is part of its TTFT.

HTTP only (`http://`): the in-cluster and local endpoints are plain HTTP; use the httpx client for
`https://`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import h11

from servelab.dispatch.pacer import PacerProcess, os_error
from servelab.dispatch.records import ChunkRecorder, RequestRecord

__all__ = [
    "KEEPALIVE_IDLE_S",
    "PacedClient",
    "request_bytes",
    "request_events",
]

log = logging.getLogger(__name__)

# vLLM and SGLang serve through uvicorn, which closes a connection idle for 5 s: reuse one only well
# before that, so a request is never written into a connection the server is closing.
KEEPALIVE_IDLE_S = 2.0
RECV_BYTES = 1 << 16
STOP_TIMEOUT_S = 30.0
_ERROR_BODY_MAX = 300
_END = h11.EndOfMessage()


def request_events(base_url: str, body: bytes) -> tuple[h11.Request, h11.Data]:
    """The h11 events of one completion request, built ahead (header validation is not free)."""
    parts = urlsplit(base_url)
    request = h11.Request(
        method="POST",
        target=parts.path.rstrip("/") + "/v1/completions",
        headers=[
            ("host", parts.netloc),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("accept", "text/event-stream"),
        ],
    )
    return request, h11.Data(data=body)


class _Connection:
    """A connection while it serves one request (between requests the pacer keeps it)."""

    __slots__ = (
        "connecting",
        "deadline",
        "error_body",
        "h11",
        "rec",
        "received",
        "recorder",
        "retry",
        "reused",
        "sock",
        "status",
    )

    def __init__(self, sock: socket.socket, *, reused: bool = False, retry: bool = False) -> None:
        self.sock = sock
        self.h11 = h11.Connection(h11.CLIENT)
        self.rec: RequestRecord | None = None
        self.recorder: ChunkRecorder | None = None
        self.status = 0
        self.error_body = b""
        self.deadline: asyncio.TimerHandle | None = None
        self.received = 0  # bytes of the answer read so far
        self.reused = reused  # a keep-alive connection an earlier request used
        self.retry = retry  # the second send of a request a reused connection dropped
        self.connecting: asyncio.Task[None] | None = None  # a retry's connect under way

    def close(self) -> None:
        if self.connecting is not None and not self.connecting.done():
            return  # the connect under way closes the socket once it is cancelled
        with contextlib.suppress(OSError):
            self.sock.close()


def request_bytes(events: Sequence[Any]) -> bytes:
    """The bytes h11 writes for a request's events (what the pacer sends)."""
    conn = h11.Connection(h11.CLIENT)
    return b"".join(conn.send(e) or b"" for e in [*events, _END])


class PacedClient:
    """Sends (pacer process) and streams (this event loop) completion requests on plain sockets.

    `requests` maps every request id that may be pushed to its h11 events; `lookup` gives the
    record of a request id. `on_done(rec)` is called on the loop exactly once for every request
    the pacer takes, whatever happened to it; the record's `status`/`error` say what.
    """

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        base_url: str,
        clock: Callable[[], float],
        request_timeout_s: float,
        connect_timeout_s: float,
        requests: dict[str, Sequence[Any]],
        lookup: Callable[[str], RequestRecord],
        on_done: Callable[[RequestRecord], None],
        on_crash: Callable[[BaseException], None],
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(
                f"dispatch.client 'paced' speaks plain http:// only, not {base_url!r}; "
                "use dispatch.client 'httpx'"
            )
        self._loop = loop
        self._clock = clock
        self._timeout_s = float(request_timeout_s)
        self._connect_timeout_s = float(connect_timeout_s)
        self._host, self._port = parts.hostname, parts.port or 80
        self._address: tuple[Any, ...] | None = None  # getaddrinfo entry, set by start()
        self._events = requests
        self._bytes = {rid: request_bytes(events) for rid, events in requests.items()}
        self._lookup = lookup
        self._on_done = on_done
        self._on_crash = on_crash
        self._pacer: PacerProcess | None = None
        self._stopped: asyncio.Future[int] | None = None
        self._gone = False
        self._active: set[_Connection] = set()
        self._writes: set[asyncio.Task[None]] = set()
        self.send_overheads: list[float] = []
        self.connections_opened = 0
        self.partial_writes = 0  # requests the socket did not take whole (the loop wrote the rest)
        self.taken = 0  # requests the pacer has sent (or failed to)
        self.stale_retries = 0  # requests sent again: a reused connection closed unanswered
        self.pacer_cpu_s = 0.0  # the pacer process's CPU time, reported when it stops

    # ------------------------------------------------------------ the pacer process

    async def start(self) -> None:
        """Start the pacer process (before the clock starts: it loads every request)."""
        infos = await self._loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
        self._address = infos[0]
        self._pacer = await asyncio.to_thread(
            PacerProcess,
            address=infos[0],
            requests=self._bytes,
            connect_timeout_s=self._connect_timeout_s,
            keepalive_idle_s=KEEPALIVE_IDLE_S,
        )
        self._loop.add_reader(self._pacer.fileno(), self._on_message)

    def go(self, clock_origin: float) -> None:
        assert self._pacer is not None
        self._pacer.go(clock_origin)

    def push(self, items: Sequence[tuple[float, str]]) -> None:
        """Schedule (due, request id) items."""
        assert self._pacer is not None
        self._pacer.push(items)

    async def stop(self, reason: str) -> None:
        """Stop sending, take in what the pacer sent meanwhile, end what is still streaming with
        `reason` (nothing is left in flight when it returns)."""
        if self._pacer is None:
            return
        if self._stopped is None:
            self._stopped = self._loop.create_future()
            try:
                if self._gone:
                    raise RuntimeError("the pacer process is gone")
                self._pacer.stop()
            except (RuntimeError, OSError):
                self._stopped.set_result(-1)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._stopped), STOP_TIMEOUT_S)
        for conn in list(self._active):
            self._fail(conn, reason)

    def _on_message(self) -> None:
        assert self._pacer is not None
        for _ in range(1000):  # bounded: the rest waits for the next callback
            try:
                got = self._pacer.recv()
            except EOFError as exc:
                self._pacer_gone(exc)
                return
            if got is None:
                return
            message, sock = got
            kind = message[0]
            if kind == "sent":
                _, rid, due, sent_s, overhead_s, written, fresh = message
                assert sock is not None
                self._sent(rid, due, sent_s, overhead_s, written, bool(fresh), sock)
            elif kind == "failed":
                _, rid, due, sent_s, error = message
                self.taken += 1
                rec = self._lookup(rid)
                rec.scheduled_s, rec.sent_s = due, sent_s
                rec.status, rec.error = "error", error
                self._on_done(rec)
            elif kind == "stopped":
                self.pacer_cpu_s = float(message[2])
                if self._stopped is not None and not self._stopped.done():
                    self._stopped.set_result(int(message[1]))
            elif kind == "crashed":
                self._on_crash(RuntimeError(f"the pacer failed: {message[1]}"))

    def _pacer_gone(self, exc: BaseException) -> None:
        assert self._pacer is not None
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._pacer.fileno())
        self._gone = True
        if self._stopped is not None:
            if not self._stopped.done():
                self._stopped.set_result(-1)
            return
        self._on_crash(RuntimeError(f"the pacer process exited unexpectedly ({exc})"))

    def _sent(
        self,
        rid: str,
        due: float,
        sent_s: float,
        overhead_s: float,
        written: int,
        fresh: bool,
        sock: socket.socket,
    ) -> None:
        self.taken += 1
        rec = self._lookup(rid)
        rec.scheduled_s, rec.sent_s = due, sent_s
        self.send_overheads.append(overhead_s)
        self.connections_opened += fresh
        conn = self._connection(sock, rec, reused=not fresh)
        self._started(conn, self._bytes[rid][written:])

    def _connection(
        self, sock: socket.socket, rec: RequestRecord, *, reused: bool = False, retry: bool = False
    ) -> _Connection:
        conn = _Connection(sock, reused=reused, retry=retry)
        for event in self._events[rec.request_id]:  # our h11 state: the request has gone out
            conn.h11.send(event)
        conn.h11.send(_END)
        conn.rec = rec
        return conn

    # ------------------------------------------------------------ event loop thread

    def _started(self, conn: _Connection, rest: bytes) -> None:
        rec = conn.rec
        assert rec is not None and rec.sent_s is not None
        self._active.add(conn)
        self._arm(conn)
        self._loop.add_reader(conn.sock.fileno(), self._readable, conn)
        if rest:  # the socket's buffer was full: the loop writes the rest
            self.partial_writes += 1
            task = self._loop.create_task(self._write_rest(conn, rest))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    def _arm(self, conn: _Connection) -> None:
        """The request's deadline: `request_timeout_s` after it was first sent."""
        rec = conn.rec
        assert rec is not None and rec.sent_s is not None
        conn.deadline = self._loop.call_later(
            max(0.0, rec.sent_s + self._timeout_s - self._clock()), self._timed_out, conn
        )

    async def _write_rest(self, conn: _Connection, rest: bytes) -> None:
        try:
            await self._loop.sock_sendall(conn.sock, rest)
        except OSError as exc:
            if conn in self._active:
                self._fail(conn, os_error("WriteError", exc))

    def _readable(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if self._unanswered_on_reuse(conn):
                self._retry_stale(conn)
            else:
                self._fail(conn, os_error("ReadError", exc))
            return
        if not data and self._unanswered_on_reuse(conn):
            self._retry_stale(conn)
            return
        conn.received += len(data)
        now = self._clock()
        rec = conn.rec
        assert rec is not None
        h = conn.h11
        try:
            h.receive_data(data)
            while True:
                event = h.next_event()
                kind = type(event)
                if kind is h11.Data:
                    if conn.recorder is not None:
                        if not conn.recorder.feed(event.data, now):  # type: ignore[union-attr]
                            self._fail(conn, None)
                            return
                    elif len(conn.error_body) < _ERROR_BODY_MAX:
                        conn.error_body += event.data  # type: ignore[union-attr]
                elif event is h11.NEED_DATA:
                    return
                elif kind is h11.Response:
                    conn.status = event.status_code  # type: ignore[union-attr]
                    if conn.status == 200:
                        conn.recorder = ChunkRecorder(rec)
                elif kind is h11.EndOfMessage:
                    self._complete(conn)
                    return
                elif kind is h11.ConnectionClosed:
                    self._fail(
                        conn, "RemoteProtocolError: Server disconnected without sending a response."
                    )
                    return
                # InformationalResponse (1xx): nothing to record
        except h11.RemoteProtocolError as exc:
            self._fail(conn, f"RemoteProtocolError: {exc}")

    def _unanswered_on_reuse(self, conn: _Connection) -> bool:
        """The connection ends before any answer, and it was reused (the server closed it idle)."""
        return conn.reused and not conn.retry and conn.received == 0 and self._stopped is None

    def _retry_stale(self, conn: _Connection) -> None:
        """Send the request once more, on a new connection (the deadline stays the first send's)."""
        rec = conn.rec
        assert rec is not None and self._address is not None
        self._detach(conn)
        conn.close()
        self.stale_retries += 1
        family, kind, proto, _, _ = self._address
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        retry = self._connection(sock, rec, retry=True)
        self._active.add(retry)  # a stop or the deadline ends it like any request in flight
        self._arm(retry)
        retry.connecting = task = self._loop.create_task(self._reconnect(retry))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        log.debug("request %s: the reused connection closed unanswered; sent again", rec.request_id)

    async def _reconnect(self, conn: _Connection) -> None:
        assert self._address is not None and conn.rec is not None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await self._loop.sock_connect(conn.sock, self._address[4])
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except asyncio.CancelledError:  # the request ended meanwhile (deadline, stop)
            conn.sock.close()
            raise
        except (OSError, TimeoutError) as exc:
            conn.connecting = None
            if conn in self._active:
                self._fail(conn, os_error("ConnectError", exc))
            return
        conn.connecting = None
        if conn not in self._active:  # ended just as the connect completed
            conn.close()
            return
        self.connections_opened += 1
        self._loop.add_reader(conn.sock.fileno(), self._readable, conn)
        await self._write_rest(conn, self._bytes[conn.rec.request_id])

    def _complete(self, conn: _Connection) -> None:
        rec = conn.rec
        assert rec is not None
        if conn.recorder is not None:
            conn.recorder.end()
        else:
            body = conn.error_body.decode("utf-8", "replace")
            rec.status = "error"
            rec.error = f"HTTP {conn.status}: {body[:_ERROR_BODY_MAX]}"
        self._detach(conn)
        h = conn.h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE and self._stopped is None:
            with contextlib.suppress(RuntimeError, OSError):  # a pacer gone: just close it
                assert self._pacer is not None
                self._pacer.give_back(conn.sock, self._clock())
        conn.close()  # the pacer has its own descriptor of a connection given back
        self._on_done(rec)

    def _fail(self, conn: _Connection, error: str | None) -> None:
        """End the request with an error (None: the recorder has set it) and drop the connection."""
        rec = conn.rec
        assert rec is not None
        self._detach(conn)
        conn.close()
        rec.status = "error"
        if error is not None:
            rec.error = error
        self._on_done(rec)

    def _timed_out(self, conn: _Connection) -> None:
        rec = conn.rec
        assert rec is not None
        self._detach(conn)
        conn.close()
        rec.status = "timeout"
        rec.error = f"no complete response within {self._timeout_s:g} s"
        self._on_done(rec)

    def _detach(self, conn: _Connection) -> None:
        self._active.discard(conn)
        if conn.deadline is not None:
            conn.deadline.cancel()
            conn.deadline = None
        if conn.connecting is not None:  # a retry still connecting: it never sends
            conn.connecting.cancel()
        with contextlib.suppress(OSError, ValueError):  # already closed
            self._loop.remove_reader(conn.sock.fileno())

    def in_flight(self) -> int:
        return len(self._active)

    def close(self) -> None:
        """End the pacer process (its idle connections close with it)."""
        for task in list(self._writes):
            task.cancel()
        if self._pacer is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._pacer.fileno())
            self._pacer.close()
