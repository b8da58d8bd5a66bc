"""The pacer: sends each request at its due time, from a process of its own.

Why a process. In the dispatcher's own process the pacer threads share the interpreter lock with
the event loop that reads every stream; when the loop's vCPU stalls while it holds the lock (on a
virtual machine the host preempts vCPUs for milliseconds), the pacers wait too. Measured at 50
requests/s, at the same moments: p99 lateness 0.6-2.2 ms for the pacer alone in a process,
1.6-3.9 ms for the same pacer inside the dispatcher's process (docs/benchmarks/dispatcher.md). So the pacer runs in a child process that does only
this: keep the schedule, take an idle keep-alive connection (or connect), write the request's
bytes, and pass the connected socket to the parent (SCM_RIGHTS over a Unix socket pair), which
reads the response. A finished connection the server keeps alive comes back the same way.

The parent/child protocol (pickled tuples, one SOCK_SEQPACKET message each):

    parent -> child   ("go", clock_origin)              the run's clock starts (perf_counter value)
                      ("push", [(due_s, request_id)..]) schedule requests (at most PUSH_BATCH)
                      ("idle", idle_since_s) + socket   a keep-alive connection to reuse
                      ("stop",)                         send nothing more; reply "stopped"
    child -> parent   ("ready",)                        started, requests loaded
                      ("sent", request_id, due_s, sent_s, overhead_s, written, new) + socket
                      ("failed", request_id, due_s, sent_s, error)
                      ("stopped", taken, cpu_s)           cpu_s: the child's CPU time
                      ("crashed", text)

The child's standard input brings, before anything else, a pickled dict: `address` (a
getaddrinfo entry), `requests` (request id -> the request's HTTP/1.1 bytes), `connect_timeout_s`,
`keepalive_idle_s`. It exits when told to stop or when the parent's end of the pair closes.

This file imports only the standard library: the child runs it as a script (no package imports).
"""

from __future__ import annotations

import array
import heapq
import logging
import os
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BACKUP_S", "PACER_THREADS", "SPIN_S", "Pacer", "PacerProcess", "os_error"]

log = logging.getLogger(__name__)

# The lead thread's timer wakes it this long before a request is due; it spins the rest (the
# machine's wake-up latency, not the timer's resolution, dominates).
SPIN_S = 1.5e-4
# A backup thread takes a request only once it is this late: the lead's vCPU has stalled.
BACKUP_S = 2.5e-4
PACER_THREADS = 2
# In the child: a pacer thread waiting for the interpreter lock waits at most this long.
SWITCH_INTERVAL_S = 5e-5
READY_TIMEOUT_S = 60.0
_PR_SET_TIMERSLACK = 29
_MESSAGE_BYTES = 1 << 16
PUSH_BATCH = 256  # (due, request id) pairs per message: about 15 KB pickled


class Pacer:
    """Calls `send(due, key)` for each pushed item at its due time, from threads of its own.

    Items are taken in due order (ties in push order), each exactly once. The lead thread sleeps on
    a condition variable with a timeout (a futex wait: microsecond resolution, unlike epoll's
    milliseconds) until `SPIN_S` before the earliest item is due, and is woken early when a push
    makes a new earliest item; then it spins to the due time, yielding the GIL at every turn.

    The other threads (`threads` in all, `PACER_THREADS` by default) are backups: on a virtual
    machine a vCPU can stall for milliseconds (the host runs something else), and a backup, likely
    on the other vCPU, takes an item once it is `BACKUP_S` late, as it takes the items of a burst
    the lead cannot send in time. They sleep until then, so only the lead spins: two spinning
    threads cost 0.64 ms of CPU per request, the lead alone about 0.3 ms, and the tail stays the
    backups' (docs/benchmarks/dispatcher.md).

    With `poll`, the lead is the thread that calls `run_lead()`, and it waits through
    `poll(timeout)` (None: until something happens) rather than on the condition variable: the
    pacer process's main thread, which waits for its parent's messages and for the next due time
    in one `select` (on a virtual machine every thread wake-up costs tens of microseconds of
    CPU, so one thread that does both wakes half as often). `poll` may push items or stop.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        send: Callable[[float, str], None],
        on_crash: Callable[[BaseException], None],
        name: str = "servelab-pacer",
        threads: int = 0,
        poll: Callable[[float | None], None] | None = None,
    ) -> None:
        self._clock = clock
        self._poll = poll
        self._send = send
        self._on_crash = on_crash
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self._stopped = False
        self.taken = 0  # items handed to `send` so far
        self.taken_late = 0  # of those, taken by a backup thread
        self._threads = [
            threading.Thread(target=self._run, args=(i == 0,), name=f"{name}-{i}", daemon=True)
            for i in range(1 if poll is not None else 0, threads or PACER_THREADS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def push(self, due: float, key: str) -> None:
        self.push_many([(due, key)])

    def push_many(self, items: Sequence[tuple[float, str]]) -> None:
        with self._cond:
            earliest = self._heap[0][0] if self._heap else None
            for due, key in items:
                self._seq += 1
                heapq.heappush(self._heap, (due, self._seq, key))
            if earliest is None or self._heap[0][0] < earliest:  # re-time the waits
                self._cond.notify_all()

    def stop(self) -> None:
        """Send nothing more; returns when the threads' sends under way have finished (with
        `poll`, the lead returns from `run_lead` at its next turn)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join()

    def run_lead(self) -> None:
        """The lead, in the calling thread, waiting through `poll`; returns once stopped."""
        assert self._poll is not None, "run_lead needs poll"
        _tighten_timer_slack()
        clock, cond, heap, poll = self._clock, self._cond, self._heap, self._poll
        try:
            while True:
                item = spin_until = timeout = None
                with cond:
                    if self._stopped:
                        return
                    if heap:
                        remaining = heap[0][0] - clock()
                        if remaining <= 0.0:
                            item = heapq.heappop(heap)
                            self.taken += 1
                            if heap and heap[0][0] <= clock():  # a burst: a backup helps
                                cond.notify()
                        elif remaining <= SPIN_S:
                            spin_until = heap[0][0]
                        else:
                            timeout = remaining - SPIN_S
                if item is not None:
                    self._send(item[0], item[2])
                elif spin_until is not None:
                    while clock() < spin_until:
                        time.sleep(0)  # releases the GIL for the backups
                else:
                    poll(timeout)
        except BaseException as exc:  # a bug here must end the run, not hang it
            log.exception("pacer lead failed")
            self._on_crash(exc)

    def _run(self, lead: bool) -> None:
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
                        if remaining <= (0.0 if lead else -BACKUP_S):
                            due, _, key = heapq.heappop(heap)
                            self.taken += 1
                            self.taken_late += not lead
                            if heap and heap[0][0] <= clock():  # a burst: another thread helps
                                cond.notify()
                            break
                        if not lead:
                            cond.wait(remaining + BACKUP_S)
                            continue
                        if remaining > SPIN_S:
                            cond.wait(remaining - SPIN_S)
                            continue
                        spin_until = heap[0][0]  # close: spin, outside the lock
                        break
                if spin_until is not None:
                    while clock() < spin_until:
                        time.sleep(0)  # releases the GIL for the other threads
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


# ---------------------------------------------------------------- the parent's handle


class PacerProcess:
    """The parent's side: starts the child, sends it commands, receives its messages.

    `recv()` is non-blocking once the run has started: it returns (message, socket or None), or
    None when nothing is waiting; EOFError when the child is gone.
    """

    def __init__(
        self,
        *,
        address: Any,
        requests: dict[str, bytes],
        connect_timeout_s: float,
        keepalive_idle_s: float,
    ) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ctrl = parent
        try:
            self._proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), str(child.fileno())],
                stdin=subprocess.PIPE,
                pass_fds=[child.fileno()],
            )
        finally:
            child.close()
        init = {
            "address": address,
            "requests": requests,
            "connect_timeout_s": float(connect_timeout_s),
            "keepalive_idle_s": float(keepalive_idle_s),
        }
        assert self._proc.stdin is not None
        try:
            pickle.dump(init, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.close()
        except BrokenPipeError as exc:
            self.close()
            raise RuntimeError(f"the pacer process exited at start ({self._proc.poll()})") from exc
        ready, _, _ = select.select([parent], [], [], READY_TIMEOUT_S)
        message = self._receive()[0] if ready else None
        if message != ("ready",):
            self.close()
            raise RuntimeError(f"the pacer process did not start (got {message!r})")
        parent.setblocking(False)

    def fileno(self) -> int:
        return self._ctrl.fileno()

    def _send(self, message: tuple[Any, ...], sock: socket.socket | None = None) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        fds = [sock.fileno()] if sock is not None else []
        # small messages into a buffer the child drains at once; wait if it is ever full
        for _ in range(10_000):  # bounded: ~10 s
            try:
                socket.send_fds(self._ctrl, [data], fds)
                return
            except BlockingIOError:
                select.select([], [self._ctrl], [], 0.001)
        raise RuntimeError("the pacer process stopped reading its commands")

    def go(self, clock_origin: float) -> None:
        self._send(("go", clock_origin))

    def push(self, items: Sequence[tuple[float, str]]) -> None:
        items = list(items)
        for start in range(0, len(items), PUSH_BATCH):  # each message well below _MESSAGE_BYTES
            self._send(("push", items[start : start + PUSH_BATCH]))

    def give_back(self, sock: socket.socket, idle_since: float) -> None:
        self._send(("idle", idle_since), sock)

    def stop(self) -> None:
        self._send(("stop",))

    def _receive(self) -> tuple[Any, socket.socket | None]:
        data, fds, _, _ = socket.recv_fds(self._ctrl, _MESSAGE_BYTES, 1)
        if not data:
            for fd in fds:
                os.close(fd)
            raise EOFError("the pacer process is gone")
        sock = socket.socket(fileno=fds[0]) if fds else None
        return pickle.loads(data), sock

    def recv(self) -> tuple[Any, socket.socket | None] | None:
        try:
            return self._receive()
        except (BlockingIOError, InterruptedError):
            return None

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._ctrl.close()


# ---------------------------------------------------------------- the child


class _Sender:
    """The child's send: take or open a connection, write the request, hand the socket over."""

    def __init__(self, ctrl: socket.socket, init: dict[str, Any], clock: Callable[[], float]):
        self._ctrl = ctrl
        self._clock = clock
        self._requests: dict[str, bytes] = init["requests"]
        self._address = init["address"]
        self._connect_timeout_s = float(init["connect_timeout_s"])
        self._keepalive_idle_s = float(init["keepalive_idle_s"])
        self._idle: list[tuple[float, socket.socket]] = []
        self._lock = threading.Lock()  # the idle pool and the control socket's writes

    def reply(self, message: tuple[Any, ...], sock: socket.socket | None = None) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            socket.send_fds(self._ctrl, [data], [sock.fileno()] if sock is not None else [])

    def idle(self, idle_since: float, sock: socket.socket) -> None:
        with self._lock:
            self._idle.append((idle_since, sock))

    def _checkout(self, now: float) -> tuple[socket.socket, bool]:
        """A connection to write on, and whether it is new."""
        while True:
            with self._lock:
                entry = self._idle.pop() if self._idle else None
            if entry is None:
                return self._connect(), True
            idle_since, sock = entry
            # too old (the server may be closing it) or readable while idle (closed or reset)
            if now - idle_since > self._keepalive_idle_s or _readable(sock):
                sock.close()
                continue
            return sock, False

    def _connect(self) -> socket.socket:
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
        return sock

    def send(self, due: float, request_id: str) -> None:
        sent = self._clock()
        try:
            sock, fresh = self._checkout(sent)
        except OSError as exc:
            self.reply(("failed", request_id, due, sent, os_error("ConnectError", exc)))
            return
        try:
            written = sock.send(self._requests[request_id])
        except (BlockingIOError, InterruptedError):
            written = 0
        except OSError as exc:
            sock.close()
            self.reply(("failed", request_id, due, sent, os_error("WriteError", exc)))
            return
        overhead = self._clock() - sent
        self.reply(("sent", request_id, due, sent, overhead, written, fresh), sock)
        sock.close()  # the parent has its own descriptor now

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _, sock in idle:
            sock.close()


def os_error(kind: str, exc: BaseException) -> str:
    """`Kind: message` of an OSError (httpx's wording: ConnectError, ReadError, WriteError)."""
    return f"{kind}: {exc}" if str(exc) else f"{kind}: {type(exc).__name__}"


def _readable(sock: socket.socket) -> bool:
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


def _recv_fds_nowait(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message and its descriptors, or BlockingIOError (Python 3.11's socket.recv_fds takes a
    `flags` argument and drops it: Lib/socket.py, recv_fds, calls recvmsg without it)."""
    fds = array.array("i")
    data, ancillary, _, _ = sock.recvmsg(
        _MESSAGE_BYTES, socket.CMSG_LEN(fds.itemsize), socket.MSG_DONTWAIT
    )
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds)


def child_main(fd: int) -> int:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    ctrl = socket.socket(fileno=fd)
    init = pickle.load(sys.stdin.buffer)
    origin = [0.0]

    def clock() -> float:
        return time.perf_counter() - origin[0]

    sender = _Sender(ctrl, init, clock)
    state = {"go": False, "stop": False, "gone": False}

    def handle(data: bytes, fds: list[int]) -> None:
        if not data:  # the parent is gone
            state["gone"] = state["stop"] = True
            return
        message = pickle.loads(data)
        kind = message[0]
        if kind == "push":
            pacer.push_many(message[1])
        elif kind == "idle":
            sender.idle(message[1], socket.socket(fileno=fds[0]))
        elif kind == "go":
            origin[0] = message[1]
            state["go"] = True
        elif kind == "stop":
            state["stop"] = True
        if state["stop"]:
            pacer.stop()

    def poll(timeout: float | None) -> None:
        """Wait for the parent's messages until `timeout`, and take in every one waiting."""
        ready, _, _ = select.select([ctrl], [], [], timeout)
        if not ready:
            return
        for _ in range(10_000):  # bounded: the rest is read at the next turn
            try:  # the socket stays blocking: replies wait when the parent's buffer is full
                data, fds = _recv_fds_nowait(ctrl)
            except (BlockingIOError, InterruptedError):
                return
            handle(data, fds)
            if state["gone"]:
                return

    pacer = Pacer(clock, sender.send, lambda exc: sender.reply(("crashed", repr(exc))), poll=poll)
    sender.reply(("ready",))
    try:
        while not state["go"] and not state["stop"]:  # requests are pushed before the clock
            data, fds, _, _ = socket.recv_fds(ctrl, _MESSAGE_BYTES, 1)
            handle(data, fds)
        if state["go"] and not state["stop"]:
            pacer.start()  # the backups
            pacer.run_lead()
        pacer.stop()
        if not state["gone"]:
            sender.reply(("stopped", pacer.taken, time.process_time()))
        return 0
    finally:
        pacer.stop()
        sender.close()


if __name__ == "__main__":
    sys.exit(child_main(int(sys.argv[1])))
