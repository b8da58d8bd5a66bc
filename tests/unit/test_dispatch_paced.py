"""The paced client's own mechanisms: the pacer's ordering, connection reuse and its limits, a
request larger than the socket buffer, stale keep-alive connections, plain-http only.

(The dispatch protocol and fault handling are tested with both clients in test_dispatch_faults.)
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from servelab.dispatch import Dispatcher, TimedAction
from servelab.dispatch import paced as paced_module
from servelab.dispatch.pacer import (
    BACKUP_S,
    PUSH_BATCH,
    Pacer,
    PacerProcess,
    _recv_fds_nowait,
)
from servelab.dispatch.records import RequestSpec
from servelab.sim.server import ConstantModel, ServerThread, SimServer
from servelab.workload.release import TraceRequest


def run_pacer(
    pushes: list[tuple[float, str]], late: list[tuple[float, float, str]] = (), threads: int = 1
):
    """Push items, optionally more at given times; return (key, due, sent) in send order."""
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0  # noqa: E731
    sent: list[tuple[str, float, float]] = []
    done = threading.Event()
    total = len(pushes) + len(late)

    def send(due: float, key: str) -> None:
        sent.append((key, due, clock()))
        if len(sent) == total:
            done.set()

    pacer = Pacer(clock, send, on_crash=lambda exc: done.set(), threads=threads)
    for due, key in pushes:
        pacer.push(due, key)
    pacer.start()
    for at, due, key in late:
        time.sleep(max(0.0, at - clock()))
        pacer.push(due, key)
    assert done.wait(5.0)
    pacer.stop()
    return sent


def test_pacer_sends_in_due_order_never_early() -> None:
    sent = run_pacer([(0.06, "c"), (0.02, "a"), (0.04, "b"), (0.04, "b2")])
    assert [k for k, _, _ in sent] == ["a", "b", "b2", "c"]  # ties in push order
    assert all(at >= due for _, due, at in sent)


def test_racing_pacer_threads_send_each_item_once_never_early() -> None:
    pushes = [(0.002 * (i // 3), f"k{i}") for i in range(150)]  # in threes, 2 ms apart
    sent = run_pacer(pushes, threads=2)
    keys = [k for k, _, _ in sent]
    assert sorted(keys) == sorted(k for _, k in pushes)  # every item, exactly once
    assert all(at >= due for _, due, at in sent)


@pytest.mark.parametrize("threads", [1, 2])
def test_an_earlier_push_retimes_the_wait(threads: int) -> None:
    # the pacer is waiting for "late" (1 s) when "early" (0.1 s) arrives: early goes first, on time
    sent = run_pacer([(1.0, "late")], late=[(0.05, 0.1, "early")], threads=threads)
    assert [k for k, _, _ in sent] == ["early", "late"]
    early = sent[0]
    assert 0.1 <= early[2] < 0.5


def test_pacer_stop_returns_without_sending_future_items() -> None:
    sent: list[str] = []
    pacer = Pacer(time.perf_counter, lambda due, key: sent.append(key), on_crash=print, threads=2)
    pacer.push(time.perf_counter() + 60.0, "never")
    pacer.start()
    t0 = time.monotonic()
    pacer.stop()
    assert time.monotonic() - t0 < 1.0
    assert sent == []


def test_a_failing_send_reports_the_crash() -> None:
    crashed: list[BaseException] = []
    event = threading.Event()

    def send(due: float, key: str) -> None:
        raise RuntimeError(f"boom on {key}")

    pacer = Pacer(time.perf_counter, send, on_crash=lambda exc: (crashed.append(exc), event.set()))
    pacer.push(0.0, "x")
    pacer.start()
    assert event.wait(5.0)
    pacer.stop()
    assert "boom on x" in str(crashed[0])


def test_pacer_push_many_retimes_for_a_new_earliest_item() -> None:
    t0 = time.perf_counter()
    sent: list[str] = []
    done = threading.Event()

    def send(due: float, key: str) -> None:
        sent.append(key)
        if len(sent) == 3:
            done.set()

    pacer = Pacer(lambda: time.perf_counter() - t0, send, on_crash=print, threads=1)
    pacer.push_many([(1.0, "c")])
    pacer.start()
    time.sleep(0.05)
    pacer.push_many([(0.2, "b"), (0.1, "a")])  # both before the waited-for item
    assert done.wait(5.0)
    pacer.stop()
    assert sent == ["a", "b", "c"]


def test_pacer_process_reports_every_request_it_takes() -> None:
    """More requests than one push message holds, to a port nobody listens on: every one comes
    back, once, as failed with the connection error; stop is acknowledged."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = socket.getaddrinfo("127.0.0.1", port, type=socket.SOCK_STREAM)[0]
    n = 2 * PUSH_BATCH + 50
    requests = {f"r{i}": b"POST / HTTP/1.1\r\n\r\n" for i in range(n)}
    pacer = PacerProcess(
        address=address, requests=requests, connect_timeout_s=1.0, keepalive_idle_s=2.0
    )
    got: list[tuple] = []
    try:
        pacer.go(time.perf_counter())
        pacer.push([(0.0, f"r{i}") for i in range(n)])
        deadline = time.monotonic() + 30.0
        while len(got) < n and time.monotonic() < deadline:
            select.select([pacer], [], [], 0.5)
            while (item := pacer.recv()) is not None:
                got.append(item[0])
        pacer.stop()
        stopped = None
        while stopped is None and time.monotonic() < deadline:
            select.select([pacer], [], [], 0.5)
            item = pacer.recv()
            if item is not None and item[0][0] == "stopped":
                stopped = item[0]
    finally:
        pacer.close()
    assert sorted(m[1] for m in got) == sorted(requests)
    assert all(m[0] == "failed" and m[4].startswith("ConnectError: ") for m in got)
    assert stopped is not None and stopped[1] == n and stopped[2] > 0.0  # taken, CPU seconds


def sim_server() -> ServerThread:
    return ServerThread(
        lambda: SimServer(ConstantModel("vllm", itl_s=0.002), engine="vllm", served_model_name="m")
    )


def trace_at(times: list[float], max_tokens: int = 3) -> list[TraceRequest]:
    return [
        TraceRequest(f"r{i:03d}", i, "planner", t, (), 0.0, max_tokens) for i, t in enumerate(times)
    ]


def dispatcher(
    url: str, trace: list[TraceRequest], prompt=(7, 8, 9), warmup: list[RequestSpec] = ()
) -> Dispatcher:
    return Dispatcher(
        base_url=url,
        model="m",
        trace=trace,
        prompts={r.request_id: prompt for r in trace},
        warmup=warmup,
        health_timeout_s=5.0,
        request_timeout_s=10.0,
        progress_interval_s=1e6,
        client="paced",
    )


def test_keep_alive_connections_are_reused() -> None:
    trace = trace_at(
        [0.1 * i for i in range(20)]
    )  # one at a time: each ends (~10 ms) before the next
    with sim_server() as srv:
        d = dispatcher(srv.base_url, trace)
        result = d.run()
    assert [r.status for r in result.records] == ["ok"] * 20
    assert d._paced.connections_opened <= 2  # 20 requests: connections were reused (1 unless slow)
    assert len(result.send_overhead_samples) == 20


def test_connections_idle_too_long_are_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paced_module, "KEEPALIVE_IDLE_S", 0.02)
    trace = trace_at([0.1 * i for i in range(5)])
    with sim_server() as srv:
        d = dispatcher(srv.base_url, trace)
        result = d.run()
    assert all(r.status == "ok" for r in result.records)
    assert d._paced.connections_opened == 5


def test_a_request_larger_than_the_socket_buffer_is_written_whole() -> None:
    # The server reads nothing for a while, through a small receive buffer, so the pacer's one
    # non-blocking send cannot take a body larger than the most the kernel lets a socket queue
    # (tcp_wmem's maximum): the loop must write the rest. The server reports the prompt's
    # length, which it knows only if it read the whole body.
    most = _most_a_socket_queues()
    n_ids = max(900_000, 2 * most // 7)  # an id is 7-8 bytes of JSON
    if n_ids > 5_000_000:  # 40 MB of JSON, and a Python list of its ids, per side
        pytest.skip(f"tcp_wmem's maximum is {most} bytes: the body that beats it is too large")
    huge = list(range(100_000, 100_000 + n_ids))
    server = ClosingServer(linger_s=0.0, hold_s=0.5, receive_buffer=65536)
    try:
        d = dispatcher(server.url, trace_at([0.0], max_tokens=1), prompt=huge)
        result = d.run()
    finally:
        server.close()
    (rec,) = result.records
    assert rec.status == "ok", rec.error
    assert d._paced.partial_writes == 1
    assert rec.prompt_tokens == n_ids  # every id arrived


def _most_a_socket_queues() -> int:
    """tcp_wmem's maximum: the largest send buffer TCP autotuning grows a socket to."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 4 * 1024 * 1024  # the kernel's default


class ClosingServer:
    """Answers each request with a one-token stream, then closes the connection after `linger_s`
    without saying so (like a server's keep-alive timeout). It waits `hold_s` before reading a
    request, with a receive buffer of `receive_buffer` bytes if given, and reports the prompt's
    length from the body it read."""

    def __init__(
        self, linger_s: float, hold_s: float = 0.0, receive_buffer: int | None = None
    ) -> None:
        self.linger_s = linger_s
        self.hold_s = hold_s
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:  # before listen: the window is offered in the handshake
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(10.0)
        for _ in range(50):  # bounded
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    @staticmethod
    def _stream(prompt_tokens: int) -> bytes:
        usage = f'"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":1}}'
        return f'data: {{"choices":[{{"text":"x"}}],{usage}}}\n\ndata: [DONE]\n\n'.encode()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5.0)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            if head.startswith(b"GET /health"):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            else:
                time.sleep(self.hold_s)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                parts = [body]
                received = len(body)
                while received < length:  # bounded by the socket's timeout
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        return
                    parts.append(chunk)
                    received += len(chunk)
                stream = self._stream(len(json.loads(b"".join(parts))["prompt"]))
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"content-length: %d\r\n\r\n" % len(stream) + stream
                )
            time.sleep(self.linger_s)

    def close(self) -> None:
        self.listener.close()


def test_a_keep_alive_connection_the_server_closed_is_not_reused() -> None:
    server = ClosingServer(linger_s=0.05)
    try:
        trace = trace_at([0.3 * i for i in range(3)], max_tokens=1)
        d = dispatcher(server.url, trace)
        result = d.run()
    finally:
        server.close()
    assert [r.status for r in result.records] == ["ok"] * 3, [r.error for r in result.records]
    assert all(r.chunk_tokens == [1] for r in result.records)
    assert d._paced.connections_opened == 3  # each idle connection was found closed


def test_a_pacer_process_that_dies_interrupts_the_run_with_everything_recorded() -> None:
    trace = trace_at([0.0, 0.05], max_tokens=3)
    trace.append(TraceRequest("long", 2, "planner", 0.1, (), 0.0, 2000))  # ~4 s: in flight
    trace += [TraceRequest(f"later{i}", 10 + i, "planner", 2.0 + i, (), 0.0, 3) for i in range(2)]
    with sim_server() as srv:
        d = dispatcher(srv.base_url, trace)
        kill = TimedAction(0.5, lambda: d._paced._pacer._proc.kill(), "kill the pacer")
        d.actions = [kill]
        t0 = time.monotonic()
        result = d.run()
        assert time.monotonic() - t0 < 3.0  # stopped at once, not after the long request
    by_id = {r.request_id: r for r in result.records}
    assert result.interrupted
    assert "pacer process exited unexpectedly" in result.interrupt_reason
    assert [by_id[k].status for k in ("r000", "r001")] == ["ok", "ok"]
    assert by_id["long"].status == "error" and by_id["long"].error.startswith("run interrupted")
    assert all(by_id[f"later{i}"].sent_s is None for i in range(2))
    assert len(result.records) == len(trace)


def test_https_is_refused_naming_the_setting() -> None:
    d = Dispatcher(
        base_url="https://127.0.0.1:1",
        model="m",
        trace=trace_at([0.0]),
        prompts={"r000": [1]},
        health_timeout_s=0.2,
        client="paced",
    )
    with pytest.raises(ValueError, match=r"dispatch\.client 'paced' speaks plain http"):
        d.run()


def test_unknown_client_is_refused() -> None:
    with pytest.raises(ValueError, match=r"dispatch\.client must be one of paced, httpx"):
        Dispatcher(
            base_url="http://127.0.0.1:1",
            model="m",
            trace=trace_at([0.0]),
            prompts={"r000": [1]},
            client="aiohttp",
        )


def test_a_backup_sends_only_what_the_stalled_lead_leaves_late() -> None:
    """The lead stalls in its send of "a"; "b" falls due meanwhile and the backup takes it, once
    it is BACKUP_S late, not before."""
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0  # noqa: E731
    sent: dict[str, tuple[float, str]] = {}
    release = threading.Event()
    done = threading.Event()

    def send(due: float, key: str) -> None:
        sent[key] = (clock(), threading.current_thread().name)
        if key == "a":
            release.wait(5.0)  # a stalled lead
        if len(sent) == 2:
            done.set()

    pacer = Pacer(clock, send, on_crash=print, threads=2)
    pacer.push_many([(0.05, "a"), (0.10, "b")])
    pacer.start()
    assert done.wait(5.0)
    release.set()
    pacer.stop()
    at_b, thread_b = sent["b"]
    assert thread_b != sent["a"][1]  # not the lead, which was still in a's send
    assert 0.10 + BACKUP_S <= at_b < 0.10 + BACKUP_S + 0.05
    assert pacer.taken_late == 1


def test_the_lead_in_the_calling_thread_waits_through_poll() -> None:
    """With `poll`, run_lead sends from the calling thread; a push made inside poll re-times it,
    and a stop made inside poll ends it."""
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0  # noqa: E731
    sent: list[tuple[str, float, float, str]] = []
    polls: list[float | None] = []

    def poll(timeout: float | None) -> None:
        polls.append(timeout)
        if len(polls) == 1:
            pacer.push_many([(0.03, "early")])  # a message arrives while waiting for "late"
        elif len(sent) == 2:
            pacer.stop()
        else:
            time.sleep(min(timeout or 0.01, 0.01))

    def send(due: float, key: str) -> None:
        sent.append((key, due, clock(), threading.current_thread().name))

    pacer = Pacer(clock, send, on_crash=print, threads=1, poll=poll)
    pacer.push_many([(0.2, "late")])
    pacer.start()  # no thread: the lead is the caller
    pacer.run_lead()
    assert [k for k, *_ in sent] == ["early", "late"]
    assert all(at >= due for _, due, at, _ in sent)
    assert {name for *_, name in sent} == {threading.current_thread().name}
    assert polls[0] is not None and polls[0] > 0.1  # it waited for "late" before the push


def test_recv_fds_nowait_does_not_block() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        with pytest.raises(BlockingIOError):
            _recv_fds_nowait(a)
        r, w = socket.socketpair()
        with r, w:
            socket.send_fds(b, [b"idle"], [r.fileno()])
            data, fds = _recv_fds_nowait(a)
        assert data == b"idle" and len(fds) == 1
        os.close(fds[0])


def test_every_request_carries_its_id_and_its_wire_time() -> None:
    """Both clients: the server sees each request's trace id in X-Request-Id (warm-ups too); each
    record's written_s follows its sent_s, and the server read the request after it was taken and
    close to when it was written (on loopback `send` may return after the server has read it)."""
    for client in ("paced", "httpx"):
        with sim_server() as srv:
            trace = [TraceRequest(f"r{i}", i, "planner", 0.01 * i, (), 0.0, 4) for i in range(8)]
            warm = [RequestSpec("warmup-00", -1, "warmup", True, 4, [1, 2, 3])]
            result = Dispatcher(
                base_url=srv.base_url,
                model="m",
                trace=trace,
                prompts={r.request_id: [1, 2, 3] for r in trace},
                warmup=warm,
                request_timeout_s=10,
                client=client,
                count_tokens=lambda texts: [1] * len(texts),
            ).run()
            arrivals = srv.call(lambda server: dict(server.arrivals))
        ids = [r.request_id for r in result.records]
        assert sorted(arrivals) == sorted(ids), client
        for rec in result.records:
            assert rec.status == "ok", (client, rec.error)
            read = arrivals[rec.request_id] - result.clock_origin_s
            assert rec.sent_s <= rec.written_s and rec.sent_s <= read, (client, rec)
            assert abs(rec.written_s - read) < 0.05, (client, rec)


def test_chunk_times_are_the_kernels_not_when_the_loop_read_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two streams 30 ms apart from a 100 ms engine, with reads batched at most every 60 ms
    (COALESCE_S raised from 1 ms): the loop reads many chunks 30-60 ms after they came, yet every
    chunk's time is when it arrived, so each stream's chunks stay 100 ms apart (to the server's own
    jitter: a few ms, more for the odd iteration on a machine busy with other tests, hence the
    median and the 90th percentile rather than the maximum).
    (A batch window longer than the engine's own interval would read two chunks of one stream at
    once, under one stamp: hence 1 ms.)"""
    monkeypatch.setattr(paced_module, "COALESCE_S", 0.06)
    trace = trace_at([0.0, 0.03], max_tokens=10)
    server = ServerThread(
        lambda: SimServer(ConstantModel("vllm", itl_s=0.1), engine="vllm", served_model_name="m")
    )
    with server as srv:
        result = dispatcher(srv.base_url, trace).run()
    assert all(r.status == "ok" for r in result.records)
    gaps = np.concatenate([np.diff(r.chunk_times_s[1:]) for r in result.records])
    assert len(gaps) >= 12
    # read times would scatter the gaps by the batching's 20-60 ms, most of them
    error = np.abs(gaps - 0.1)
    assert np.median(error) < 0.005 and np.percentile(error, 90) < 0.015, gaps


def test_the_clock_offset_comes_from_the_least_disturbed_read() -> None:
    """Three bracketed reads of the realtime clock; in the first the thread was preempted for
    300 us between the realtime read and the closing monotonic read. A single read (the old way)
    would put every kernel stamp 150 us late; the narrowest bracket gives the true offset."""
    true_offset = 1_000.0
    monotonic = iter([0.0, 0.0003, 1.0, 1.000002, 2.0, 2.000004])  # before, after each read
    reals = iter([0.0 + true_offset, 1.000001 + true_offset, 2.000002 + true_offset])
    offset = paced_module.realtime_minus_monotonic(
        realtime=reals.__next__, monotonic=monotonic.__next__, samples=3
    )
    assert offset == pytest.approx(true_offset, abs=1e-9)
    loose = paced_module.realtime_minus_monotonic(
        realtime=lambda: 5.0 + true_offset, monotonic=iter([5.0, 5.0003]).__next__, samples=1
    )
    assert loose == pytest.approx(true_offset - 0.00015, abs=1e-9)


def test_a_kernel_stamp_is_never_later_than_its_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the realtime offset wrong by 0.5 s (every stamp would land half a second in the
    future), each request still ends no later than the loop read its last bytes: a dependent
    is never held for a time that has not come, and the trace starts after its warm-ups end."""
    right = paced_module.realtime_minus_monotonic()
    monkeypatch.setattr(paced_module, "realtime_minus_monotonic", lambda: right - 0.5)
    trace = [
        TraceRequest("r0", 0, "planner", 0.0, (), 0.0, 3),
        TraceRequest("r1", 0, "worker", 0.0, ("r0",), 0.0, 3),
    ]
    warm = [RequestSpec("warmup-00", -1, "warmup", True, 3, [1, 2, 3])]
    with sim_server() as srv:
        result = dispatcher(srv.base_url, trace, warmup=warm).run()
    by_id = {r.request_id: r for r in result.records}
    assert all(r.status == "ok" for r in result.records), result.records
    assert result.trace_start_s >= by_id["warmup-00"].finished_s
    # unclamped, every end would come 0.5 s after its bytes did, and r1 would wait for r0's
    assert by_id["r0"].finished_s - result.trace_start_s < 0.25
    assert by_id["r1"].scheduled_s - result.trace_start_s < 0.25


def test_a_responses_arrival_times_never_go_backwards() -> None:
    """A kernel stamp is taken as the bytes' arrival, bounded above by their read and below by
    the same response's earlier bytes: a realtime clock stepped back mid-run (a stamp earlier
    than the bytes before it) cannot put a chunk before the one it followed."""
    assert paced_module.arrival_s(1.0, 1.2, 1.3) == 1.2  # the stamp, between its bounds
    assert paced_module.arrival_s(1.0, 1.5, 1.3) == 1.3  # a stamp after its read: the read
    assert paced_module.arrival_s(1.0, None, 1.3) == 1.3  # no stamp: the read
    assert paced_module.arrival_s(1.25, 1.2, 1.3) == 1.25  # stepped back: the earlier bytes'
    times = [0.0]
    for kernel_s, read_s in [(1.0, 1.1), (1.3, 1.4), (1.25, 1.5), (1.6, 1.7)]:
        times.append(paced_module.arrival_s(times[-1], kernel_s, read_s))
    assert times[1:] == [1.0, 1.3, 1.3, 1.6]
