"""The paced client: a pacer process sends each request on time; the event loop reads the streams.

Why a second client. With one event loop doing both, a request that falls due while the loop is
reading a burst of chunks waits for the burst: the simulated engine (like the real ones) emits to
every running stream at the end of each iteration, so at 50 requests/s with 128-token streams
about 130 reads arrive together every iteration, and the httpx stack spends about 160 us of CPU on
each (docs/benchmarks/dispatcher.md). Here the time-critical part, waiting for the due time and
writing the request, runs in a pacer process (servelab.dispatch.pacer) that never reads a
stream, and the reading runs on this process's event loop on plain sockets, through httptools
(the binding of llhttp, Node.js's HTTP/1.1 parser, that uvicorn serves vLLM and SGLang with):
0.11 us per chunk where h11 took 5.6 us (docs/benchmarks/dispatcher.md).

A connection belongs to one side at a time, so nothing is shared:
- an idle keep-alive connection sits in the pacer's pool;
- the pacer takes one (or connects), writes the request and passes the socket here, with the
  request's `scheduled_s`/`sent_s` and when its last byte went to the socket (`written_s`, on the
  wire); the loop registers it for reading, arms the timeout and records the chunks (and writes
  the rest of a request the socket did not take whole; `written_s` is then when that ends);
- when the response ends the loop unregisters it and gives it back (or closes it).

Everything that ends a request (status, dependents' release) happens on the loop; a release
pushes the dependent into the pacer's schedule.

Reading, and when a chunk arrived. Every stream socket asks the kernel to stamp what it receives
(SO_TIMESTAMPNS): a chunk's time is when its bytes reached this machine's TCP stack, not when the
loop got round to reading them, so the loop's own delays are not in TTFT or ITL. That lets the
loop read in batches: the stream sockets sit in an epoll set of their own, which the loop watches;
when it turns readable less than `COALESCE_S` after the last batch, the next batch waits until
then. An engine emits to all its streams at the end of each iteration, and one wake-up then reads
many of them (on a virtual machine a wake-up costs tens of microseconds of CPU). A request's end
(`finished_s`, which releases its dependents) is its last bytes' kernel time too (never later than
the read that took them). Where the kernel gives no stamp, the read's own time is used.

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
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import h11
import httptools

from servelab.dispatch.pacer import PacerProcess, os_error
from servelab.dispatch.records import ChunkRecorder, RequestRecord

__all__ = [
    "KEEPALIVE_IDLE_S",
    "REQUEST_ID_HEADER",
    "PacedClient",
    "arrival_s",
    "request_bytes",
]

log = logging.getLogger(__name__)

# vLLM and SGLang serve through uvicorn, which closes a connection idle for 5 s: reuse one only well
# before that, so a request is never written into a connection the server is closing.
KEEPALIVE_IDLE_S = 2.0
RECV_BYTES = 1 << 16
# Reads come in batches at most this often; the kernel's receive stamps keep every chunk's time.
COALESCE_S = 1e-3
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux
_ANCILLARY_BYTES = socket.CMSG_SPACE(16)
_TIMESPEC = struct.Struct("qq")
STOP_TIMEOUT_S = 30.0
_ERROR_BODY_MAX = 300
# Every request carries its trace request id, so that an engine that logs or echoes it joins
# exactly with the request's record (docs/live.md, "Request ids").
REQUEST_ID_HEADER = "X-Request-Id"
_DISCONNECTED = "RemoteProtocolError: Server disconnected without sending a response."
_INCOMPLETE = "RemoteProtocolError: peer closed connection without sending complete message body"


def realtime_minus_monotonic(
    realtime: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.perf_counter,
    samples: int = 9,
) -> float:
    """CLOCK_REALTIME minus the run clock's CLOCK_MONOTONIC, from the tightest of `samples` reads.

    Each sample brackets a realtime read between two monotonic reads. A thread preempted inside
    one pair would put every kernel stamp of the run late by the preemption (on a loaded machine,
    hundreds of microseconds, later than the loop's own reads): the narrowest bracket is the one
    least disturbed, and its midpoint is the estimate.
    """
    best_width, best_offset = float("inf"), 0.0
    for _ in range(samples):
        before = monotonic()
        real = realtime()
        after = monotonic()
        if after - before < best_width:
            best_width, best_offset = after - before, real - (before + after) / 2
    return best_offset


def arrival_s(earlier_s: float, kernel_s: float | None, read_s: float) -> float:
    """When bytes just read from a response arrived, on the run clock: the kernel's receive stamp
    (`kernel_s`, None without one), bounded above by the read (bytes cannot arrive after they are
    read: the bound holds if the realtime offset is off by a few microseconds or the realtime
    clock is stepped forward during the run) and below by the same response's earlier bytes
    (`earlier_s`: a stream's bytes arrive in order, which holds if the realtime clock is stepped
    back during the run, so the response's chunk times never go backwards)."""
    stamp = read_s if kernel_s is None else min(kernel_s, read_s)
    return max(earlier_s, stamp)


def request_bytes(base_url: str, body: bytes, request_id: str) -> bytes:
    """The HTTP/1.1 bytes of one streamed completion request (built ahead by h11, whose header
    validation is not free), carrying `request_id` in its X-Request-Id header."""
    parts = urlsplit(base_url)
    request = h11.Request(
        method="POST",
        target=parts.path.rstrip("/") + "/v1/completions",
        headers=[
            ("host", parts.netloc),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("accept", "text/event-stream"),
            (REQUEST_ID_HEADER, request_id),
        ],
    )
    conn = h11.Connection(h11.CLIENT)
    return b"".join(conn.send(e) or b"" for e in (request, h11.Data(data=body), h11.EndOfMessage()))


class _Connection:
    """A connection while it serves one request (between requests the pacer keeps it), and the
    httptools parser's callbacks for its response."""

    __slots__ = (
        "complete",
        "connecting",
        "deadline",
        "error_body",
        "failed",
        "keep_alive",
        "now",
        "parser",
        "rec",
        "received",
        "recorder",
        "retry",
        "reused",
        "sock",
        "status",
        "writing",
    )

    def __init__(
        self, sock: socket.socket, rec: RequestRecord, *, reused: bool = False, retry: bool = False
    ) -> None:
        self.sock = sock
        self.rec = rec
        self.parser = httptools.HttpResponseParser(self)
        self.recorder: ChunkRecorder | None = None
        self.status = 0
        self.error_body = b""
        self.deadline: asyncio.TimerHandle | None = None
        self.received = 0  # bytes of the answer read so far
        self.now = 0.0  # when the bytes being parsed arrived
        self.complete = False  # the whole response has been read
        self.failed = False  # the stream was unusable (the record's error says why)
        self.keep_alive = False
        self.writing = False  # the loop is still writing the rest of the request
        self.reused = reused  # a keep-alive connection an earlier request used
        self.retry = retry  # the second send of a request a reused connection dropped
        self.connecting: asyncio.Task[None] | None = None  # a retry's connect under way

    # httptools callbacks (called inside feed_data)
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status == 200:
            self.recorder = ChunkRecorder(self.rec)

    def on_body(self, data: bytes) -> None:
        if self.failed:
            return
        if self.recorder is not None:
            if not self.recorder.feed(data, self.now):
                self.failed = True
        elif len(self.error_body) < _ERROR_BODY_MAX:
            self.error_body += data

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()

    def close(self) -> None:
        if self.connecting is not None and not self.connecting.done():
            return  # the connect under way closes the socket once it is cancelled
        with contextlib.suppress(OSError):
            self.sock.close()


class PacedClient:
    """Sends (pacer process) and streams (this event loop) completion requests on plain sockets.

    `requests` maps every request id that may be pushed to its HTTP bytes (`request_bytes`);
    `lookup` gives the record of a request id. `on_done(rec)` is called on the loop exactly once for every request
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
        requests: dict[str, bytes],
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
        self._bytes = requests
        self._lookup = lookup
        self._on_done = on_done
        self._on_crash = on_crash
        self._pacer: PacerProcess | None = None
        self._stopped: asyncio.Future[int] | None = None
        self._gone = False
        self._active: set[_Connection] = set()
        self._writes: set[asyncio.Task[None]] = set()
        self._epoll = select.epoll()  # the stream sockets being read
        self._reading: dict[int, _Connection] = {}
        self._last_batch = -1.0
        self._batch_timer: asyncio.TimerHandle | None = None
        self._real_origin = 0.0  # the kernel's clock (CLOCK_REALTIME) at the run clock's 0
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
        self._loop.add_reader(self._epoll.fileno(), self._on_readable)

    def go(self, clock_origin: float) -> None:
        assert self._pacer is not None
        # the kernel stamps received bytes on CLOCK_REALTIME, the run clock is perf_counter's
        # (CLOCK_MONOTONIC), and NTP disciplines them alike: their offset is read once
        self._real_origin = clock_origin + realtime_minus_monotonic()
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
        rec.written_s = sent_s + overhead_s  # the whole request is on the wire (unless partial)
        self.send_overheads.append(overhead_s)
        self.connections_opened += fresh
        conn = _Connection(sock, rec, reused=not fresh)
        self._started(conn, self._bytes[rid][written:])

    # ------------------------------------------------------------ event loop thread

    def _started(self, conn: _Connection, rest: bytes) -> None:
        rec = conn.rec
        assert rec is not None and rec.sent_s is not None
        self._active.add(conn)
        self._arm(conn)
        self._watch(conn)
        if rest:  # the socket's buffer was full: the loop writes the rest
            self.partial_writes += 1
            rec.written_s = None
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
        conn.writing = True
        try:
            await self._loop.sock_sendall(conn.sock, rest)
        except OSError as exc:
            if conn in self._active:
                self._fail(conn, os_error("WriteError", exc))
            return
        finally:
            conn.writing = False
        conn.rec.written_s = self._clock()

    def _watch(self, conn: _Connection) -> None:
        """Read the connection's answer, its bytes stamped by the kernel on arrival."""
        with contextlib.suppress(OSError):
            conn.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        fd = conn.sock.fileno()
        self._reading[fd] = conn
        self._epoll.register(fd, select.EPOLLIN)

    def _on_readable(self) -> None:
        """A stream socket is readable: read now, or with the next batch if one was just read."""
        wait = self._last_batch + COALESCE_S - self._clock()
        if wait <= 0.0:
            self._read_batch()
            return
        self._loop.remove_reader(self._epoll.fileno())
        self._batch_timer = self._loop.call_later(wait, self._batch_due)

    def _batch_due(self) -> None:
        self._batch_timer = None
        self._loop.add_reader(self._epoll.fileno(), self._on_readable)
        self._read_batch()

    def _read_batch(self) -> None:
        self._last_batch = self._clock()
        for fd, _ in self._epoll.poll(0, len(self._reading) or 1):
            conn = self._reading.get(fd)
            if conn is not None:
                self._readable(conn)

    def _readable(self, conn: _Connection) -> None:
        try:
            data, ancillary, _, _ = conn.sock.recvmsg(RECV_BYTES, _ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if self._unanswered_on_reuse(conn):
                self._retry_stale(conn)
            else:
                self._fail(conn, os_error("ReadError", exc))
            return
        if not data:
            if self._unanswered_on_reuse(conn):
                self._retry_stale(conn)
            else:
                self._fail(conn, _DISCONNECTED if conn.status == 0 else _INCOMPLETE)
            return
        conn.received += len(data)
        read_s = self._clock()
        kernel_s = None
        if ancillary:  # (SOL_SOCKET, SCM_TIMESTAMPNS, struct timespec)
            seconds, nanoseconds = _TIMESPEC.unpack_from(ancillary[0][2])
            kernel_s = seconds - self._real_origin + nanoseconds * 1e-9
        conn.now = arrival_s(conn.now, kernel_s, read_s)
        try:
            conn.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not conn.failed:
                self._fail(conn, f"RemoteProtocolError: {exc}")
                return
        if conn.failed:
            self._fail(conn, None)
        elif conn.complete:
            self._complete(conn)

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
        retry = _Connection(sock, rec, retry=True)
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
        self._watch(conn)
        await self._write_rest(conn, self._bytes[conn.rec.request_id])

    def _complete(self, conn: _Connection) -> None:
        rec = conn.rec
        assert rec is not None
        rec.finished_s = conn.now  # its last bytes' arrival: what releases its dependents
        if conn.recorder is not None:
            conn.recorder.end()
        else:
            body = conn.error_body.decode("utf-8", "replace")
            rec.status = "error"
            rec.error = f"HTTP {conn.status}: {body[:_ERROR_BODY_MAX]}"
        self._detach(conn)
        if conn.keep_alive and not conn.writing and self._stopped is None:
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
        fd = conn.sock.fileno()
        if self._reading.get(fd) is conn:
            del self._reading[fd]
            with contextlib.suppress(OSError, ValueError):  # already closed
                self._epoll.unregister(fd)

    def in_flight(self) -> int:
        return len(self._active)

    def close(self) -> None:
        """End the pacer process (its idle connections close with it)."""
        for task in list(self._writes):
            task.cancel()
        if self._batch_timer is not None:
            self._batch_timer.cancel()
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        if self._pacer is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._pacer.fileno())
            self._pacer.close()
