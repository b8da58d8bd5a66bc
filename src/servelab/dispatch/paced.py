"""The paced client: a thread of its own sends each request on time; the event loop reads the streams.

Why a second client. With one event loop doing both, a request that falls due while the loop is
reading a burst of chunks waits for the burst: the simulated engine (like the real ones) emits to
every running stream at the end of each iteration, so at 50 requests/s with 128-token streams
about 130 reads arrive together every iteration, and the httpx stack spends about 160 us of CPU on
each (docs/benchmarks/dispatcher.md). Here the time-critical part, waiting for the due time and
writing the request, runs in a pacer thread that never reads a stream, and the reading runs on the
event loop through h11 (the HTTP/1.1 parser httpx itself uses, via httpcore) on plain sockets.

Ownership passes cleanly between the two threads, so no connection is touched by both at once:
- an idle keep-alive connection sits in a lock-protected pool, registered with nothing;
- the pacer takes one (or connects), writes the request and hands it to the loop
  (`call_soon_threadsafe`), which registers it for reading, arms the timeout and records chunks;
- when the response ends the loop unregisters it and returns it to the pool (or closes it).

A thread waiting for the GIL waits up to the interpreter's switch interval (5 ms by default) while
the loop thread runs Python code; during a paced run it is lowered to `SWITCH_INTERVAL_S`, so the
pacer gets the interpreter within about that long once its timer fires. Everything that finishes a
request (status, dependents' release) happens on the loop thread; the pacer only stamps `sent_s`
and writes.

HTTP only (`http://`): the in-cluster and local endpoints are plain HTTP; use the httpx client for
`https://`.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import h11

from servelab.dispatch.client import ChunkRecorder, RequestRecord

__all__ = [
    "KEEPALIVE_IDLE_S",
    "PACER_THREADS",
    "SPIN_S",
    "SWITCH_INTERVAL_S",
    "PacedClient",
    "Pacer",
    "request_events",
]

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 5e-5
# The pacer's timer wakes it this long before a request is due; it spins the rest (the machine's
# wake-up latency, not the timer, dominates: docs/benchmarks/dispatcher.md).
SPIN_S = 5e-4
PACER_THREADS = 2
_PR_SET_TIMERSLACK = 29
# vLLM and SGLang serve through uvicorn, which closes a connection idle for 5 s: reuse one only well
# before that, so a request is never written into a connection the server is closing.
KEEPALIVE_IDLE_S = 2.0
RECV_BYTES = 1 << 16
_ERROR_BODY_MAX = 300
_END = h11.EndOfMessage()


class Pacer:
    """Calls `send(due, key)` for each pushed item at its due time, from threads of its own.

    Items are taken in due order (ties in push order), each exactly once. A thread sleeps on a
    condition variable with a timeout (a futex wait: microsecond resolution, unlike epoll's
    milliseconds) until `SPIN_S` before the earliest item is due, and is woken early when a push
    makes a new earliest item; then it spins to the due time, yielding the GIL at every turn.

    `threads` threads race for each item (`PACER_THREADS` by default): on a virtual machine a vCPU
    can stall for milliseconds (the host runs something else), and a second thread, likely on the
    other vCPU, then sends in its place. Measured: the pacer's p99 lateness fell from 2.1-3.0 ms
    with one thread to 0.3-1.3 ms with two, at the same moments (docs/benchmarks/dispatcher.md).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        send: Callable[[float, str], None],
        on_crash: Callable[[BaseException], None],
        name: str = "servelab-pacer",
        threads: int = 0,
    ) -> None:
        self._clock = clock
        self._send = send
        self._on_crash = on_crash
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self._stopped = False
        self.taken = 0  # items handed to `send` so far
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(threads or PACER_THREADS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def push(self, due: float, key: str) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, key))
            if self._heap[0][1] == self._seq:  # a new earliest item: re-time the wait
                self._cond.notify_all()

    def stop(self) -> None:
        """Send nothing more; returns when a send under way has finished."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()

    def _run(self) -> None:
        _tighten_timer_slack()
        clock, cond, heap = self._clock, self._cond, self._heap
        try:
            while True:
                spin_until = None
                with cond:
                    while True:
                        if self._stopped:
                            return
                        if not heap:
                            cond.wait()
                            continue
                        remaining = heap[0][0] - clock()
                        if remaining <= 0.0:
                            due, _, key = heapq.heappop(heap)
                            self.taken += 1
                            if heap:  # the next item may be due at once: let another thread look
                                cond.notify()
                            break
                        if remaining > SPIN_S:
                            cond.wait(remaining - SPIN_S)
                            continue
                        spin_until = heap[0][0]  # close: spin, outside the lock
                        break
                if spin_until is not None:
                    while clock() < spin_until:
                        time.sleep(0)  # releases the GIL: the loop thread keeps reading
                    continue
                self._send(due, key)
        except BaseException as exc:  # a bug here must end the run, not hang it
            log.exception("pacer thread failed")
            self._on_crash(exc)


def _tighten_timer_slack() -> None:
    """Ask Linux for 1 ns of timer slack in this thread (the default, 50 us, delays every wake-up)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: keep the default
        pass


def request_events(base_url: str, body: bytes) -> tuple[h11.Request, h11.Data]:
    """The h11 events of one completion request, built ahead (header validation is not free)."""
    netloc = urlsplit(base_url).netloc
    request = h11.Request(
        method="POST",
        target=urlsplit(base_url).path.rstrip("/") + "/v1/completions",
        headers=[
            ("host", netloc),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("accept", "text/event-stream"),
        ],
    )
    return request, h11.Data(data=body)


def _os_error(kind: str, exc: BaseException) -> str:
    return f"{kind}: {exc}" if str(exc) else f"{kind}: {type(exc).__name__}"


class _Connection:
    """One keep-alive HTTP/1.1 connection and the request it is serving."""

    __slots__ = (
        "deadline",
        "error_body",
        "h11",
        "idle_since",
        "rec",
        "recorder",
        "sock",
        "status",
        "trace",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.h11 = h11.Connection(h11.CLIENT)
        self.rec: RequestRecord | None = None
        self.recorder: ChunkRecorder | None = None
        self.status = 0
        self.error_body = b""
        self.deadline: asyncio.TimerHandle | None = None
        self.idle_since = 0.0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class PacedClient:
    """Sends (pacer thread) and streams (event loop) completion requests on plain sockets.

    `on_done(rec)` is called on the loop thread exactly once for every request given to `send`,
    whatever happened to it; the record's `status`/`error` say what.
    """

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        base_url: str,
        clock: Callable[[], float],
        request_timeout_s: float,
        connect_timeout_s: float,
        on_done: Callable[[RequestRecord], None],
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(
                f"dispatch.client 'paced' speaks plain http:// only, not {base_url!r}; "
                "use dispatch.client 'httpx'"
            )
        self._host = parts.hostname
        self._port = parts.port or 80
        self._address: Any = None  # resolved on the first connect, then kept
        self._loop = loop
        self._clock = clock
        self._timeout_s = float(request_timeout_s)
        self._connect_timeout_s = float(connect_timeout_s)
        self._on_done = on_done
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._active: set[_Connection] = set()  # loop thread only
        self._writes: set[asyncio.Task[None]] = set()
        self.send_overheads: list[float] = []
        self.connections_opened = 0
        self.partial_writes = 0  # requests the socket did not take whole (the loop wrote the rest)

    # ------------------------------------------------------------ pacer thread

    def send(self, rec: RequestRecord, events: Sequence[Any]) -> None:
        """Write `rec`'s request now (its `sent_s` is stamped) and hand it to the loop."""
        try:
            conn = self._checkout()
        except OSError as exc:
            self._loop.call_soon_threadsafe(
                self._not_started, rec, None, _os_error("ConnectError", exc)
            )
            return
        conn.rec = rec
        try:
            data = b"".join([conn.h11.send(e) or b"" for e in events]) + (
                conn.h11.send(_END) or b""
            )
            try:
                written = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                written = 0
        except (OSError, h11.LocalProtocolError) as exc:
            self._loop.call_soon_threadsafe(
                self._not_started, rec, conn, _os_error("WriteError", exc)
            )
            return
        self.send_overheads.append(self._clock() - rec.sent_s)  # type: ignore[operator]
        self._loop.call_soon_threadsafe(self._started, conn, data[written:])

    def _checkout(self) -> _Connection:
        now = self._clock()
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect()
            # too old (the server may be closing it) or readable while idle (closed or reset)
            if now - conn.idle_since > KEEPALIVE_IDLE_S or _readable(conn.sock):
                conn.close()
                continue
            return conn

    def _connect(self) -> _Connection:
        if self._address is None:
            infos = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
            self._address = infos[0]
        family, kind, proto, _, address = self._address
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(self._connect_timeout_s)
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        with self._lock:  # pacer threads may connect at once
            self.connections_opened += 1
        return _Connection(sock)

    # ------------------------------------------------------------ event loop thread

    def _not_started(self, rec: RequestRecord, conn: _Connection | None, error: str) -> None:
        if conn is not None:
            conn.close()
        rec.status = "error"
        rec.error = error
        self._on_done(rec)

    def _started(self, conn: _Connection, rest: bytes) -> None:
        rec = conn.rec
        assert rec is not None and rec.sent_s is not None
        self._active.add(conn)
        conn.deadline = self._loop.call_later(
            max(0.0, rec.sent_s + self._timeout_s - self._clock()), self._timed_out, conn
        )
        self._loop.add_reader(conn.sock.fileno(), self._readable, conn)
        if rest:  # the socket's buffer was full: the loop writes the rest
            self.partial_writes += 1
            task = self._loop.create_task(self._write_rest(conn, rest))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _write_rest(self, conn: _Connection, rest: bytes) -> None:
        try:
            await self._loop.sock_sendall(conn.sock, rest)
        except OSError as exc:
            if conn in self._active:
                self._fail(conn, _os_error("WriteError", exc))

    def _readable(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(conn, _os_error("ReadError", exc))
            return
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
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
            conn.rec, conn.recorder, conn.status, conn.error_body = None, None, 0, b""
            conn.idle_since = self._clock()
            with self._lock:
                self._idle.append(conn)
        else:
            conn.close()
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
        with contextlib.suppress(OSError, ValueError):  # already closed
            self._loop.remove_reader(conn.sock.fileno())

    def abort(self, reason: str) -> None:
        """End every request still streaming with `reason` (call after the pacer has stopped)."""
        for conn in list(self._active):
            self._fail(conn, reason)

    def in_flight(self) -> int:
        return len(self._active)

    def close(self) -> None:
        for task in list(self._writes):
            task.cancel()
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _readable(sock: socket.socket) -> bool:
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)
