"""The dispatcher against the live sim server: faults, timeouts, graph release, warm-up, chunks.

Each fault scenario checks every request's status and reason, exact counts (fault decisions are a
pure function of the server's request index) and the run status the success check gives.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence

import pytest

from servelab.artifacts.runrecord import build_run_record
from servelab.dispatch import (
    CLIENTS,
    Dispatcher,
    DispatchError,
    RequestSpec,
    TimedAction,
    pool_size,
)
from servelab.dispatch.run import requests_table
from servelab.sim.server import ConstantModel, FaultConfig, ServerThread, SimServer, fault_decision
from servelab.workload.release import TraceRequest


@pytest.fixture(params=CLIENTS)
def client(request: pytest.FixtureRequest) -> str:
    """Every dispatcher test runs with both clients: the paced one and httpx."""
    return request.param


def server(engine: str = "vllm", *, itl_s: float = 0.004, **kwargs) -> ServerThread:
    return ServerThread(
        lambda: SimServer(
            ConstantModel(engine, itl_s=itl_s),
            engine=engine,
            served_model_name="m",
            prompt_token_offset=1,
            **kwargs,
        )
    )


def independent(
    times: Sequence[float], max_tokens: int = 6, prefix: str = "r"
) -> list[TraceRequest]:
    return [
        TraceRequest(f"{prefix}{i:03d}", i, "planner", t, (), 0.0, max_tokens)
        for i, t in enumerate(times)
    ]


def count_words(texts: list[str]) -> list[int]:
    return [t.count(" the") for t in texts]


def dispatch(srv: ServerThread, trace: list[TraceRequest], **kwargs) -> Dispatcher:
    kwargs.setdefault("request_timeout_s", 10.0)
    d = Dispatcher(
        base_url=srv.base_url,
        model="m",
        trace=trace,
        prompts={r.request_id: [7, 8, 9] for r in trace},
        health_timeout_s=5.0,
        pool=64,
        progress_interval_s=1e6,
        count_tokens=count_words,
        **kwargs,
    )
    return d


def status_of(result) -> dict[str, str]:
    return {r.request_id: r.status for r in result.records}


def run_status(result, threshold: float = 0.95) -> str:
    table = requests_table(result.records, "a/e/c/r")
    record = build_run_record(
        arm="a",
        engine="e",
        condition="c",
        rep="r",
        seed=0,
        trace_sha256="",
        backend="local",
        deployment_id="d",
        resolved_config={"chunked_prefill": False, "chunk_size": None},
        start_unix_s=result.start_unix_s,
        end_unix_s=result.end_unix_s,
        offered_load_rps=1.0,
        requests=table,
        success_threshold=threshold,
        attempt=1,
        node={},
        interrupted=result.interrupted,
    )
    return record["status"]


@pytest.mark.parametrize(
    ("kind", "option", "needle"),
    [
        ("http500", "http500_rate", "HTTP 500: "),
        ("malformed", "malformed_rate", "malformed SSE event"),
        ("reset", "reset_rate", "Connection reset by peer"),
    ],
)
def test_probabilistic_faults_exact_counts(
    kind: str, option: str, needle: str, client: str
) -> None:
    n, rate, seed = 30, 0.3, 11
    expected = sum(fault_decision(seed, i, kind, rate) for i in range(n))
    assert 0 < expected < n
    with server(faults=FaultConfig(seed=seed, **{option: rate})) as srv:
        result = dispatch(srv, independent([0.01 * i for i in range(n)]), client=client).run()
    failed = [r for r in result.records if r.status != "ok"]
    assert len(result.records) == n
    assert len(failed) == expected
    assert all(r.status == "error" and needle in (r.error or "") for r in failed), [
        r.error for r in failed
    ]
    assert all(
        r.error is None and sum(r.chunk_tokens) == 6 for r in result.records if r.status == "ok"
    )
    assert run_status(result) == "failed"
    assert run_status(result, threshold=(n - expected) / n) == "ok"


def test_stalled_stream_times_out(client: str) -> None:
    early = [0.0, 0.02, 0.04]
    late = [0.6, 0.62]
    with server() as srv:
        stall = TimedAction(0.4, lambda: srv.call(lambda s: s.stall()), "stall", stop_run=False)
        result = dispatch(
            srv, independent(early + late), request_timeout_s=0.5, actions=[stall], client=client
        ).run()
    statuses = [r.status for r in result.records]
    assert statuses == ["ok"] * 3 + ["timeout"] * 2
    assert all(r.error == "no complete response within 0.5 s" for r in result.records[3:])
    assert run_status(result) == "failed"


def test_server_crash_fails_in_flight_and_later_requests(client: str) -> None:
    trace = independent([0.0, 0.02], max_tokens=4)
    trace.append(TraceRequest("long", 2, "planner", 0.05, (), 0.0, 500))  # ~2 s: in flight
    trace += independent([0.7, 0.75], max_tokens=4, prefix="after")
    with server() as srv:
        crash = TimedAction(0.4, lambda: srv.call(lambda s: s.crash()), "crash", stop_run=False)
        result = dispatch(srv, trace, actions=[crash], client=client).run()
    by_id = {r.request_id: r for r in result.records}
    assert [by_id[k].status for k in ("r000", "r001")] == ["ok", "ok"]
    assert by_id["long"].status == "error"
    assert by_id["long"].chunk_times_s  # it had started streaming before the crash
    assert all(
        by_id[k].status == "error" and "Connect" in by_id[k].error for k in ("after000", "after001")
    )
    assert not result.interrupted
    assert run_status(result) == "failed"


def graph(delay: float = 0.05) -> list[TraceRequest]:
    return [
        TraceRequest("p", 0, "planner", 0.0, (), 0.0, 4),
        TraceRequest("w1", 0, "worker", 0.0, ("p",), delay, 4),
        TraceRequest("w2", 0, "worker", 0.0, ("p",), 2 * delay, 4),
        TraceRequest("a", 0, "aggregator", 0.0, ("w1", "w2"), 0.0, 8),
    ]


def test_failed_requests_still_release_their_dependents(client: str) -> None:
    with server(faults=FaultConfig(http500_rate=1.0)) as srv:
        result = dispatch(srv, graph(), client=client).run()
    by_id = {r.request_id: r for r in result.records}
    assert all(r.status == "error" and r.error.startswith("HTTP 500") for r in result.records)
    assert all(r.sent_s is not None for r in result.records)  # every dependent was sent
    assert by_id["w1"].scheduled_s >= by_id["p"].sent_s + 0.05
    assert by_id["w2"].scheduled_s >= by_id["p"].sent_s + 0.10
    assert by_id["a"].scheduled_s >= max(by_id["w1"].sent_s, by_id["w2"].sent_s)


def test_release_times_warmup_and_lag(client: str) -> None:
    warmup = [RequestSpec(f"warmup-{i}", -1, "warmup", True, 16, [1, 2]) for i in range(3)]
    with server() as srv:
        result = dispatch(srv, graph(), warmup=warmup, client=client).run()
    by_id = {r.request_id: r for r in result.records}
    warm = [by_id[f"warmup-{i}"] for i in range(3)]
    assert all(
        w.warmup
        and w.role == "warmup"
        and w.graph_id == -1
        and w.scheduled_s == 0.0
        and w.max_tokens == 16
        and w.status == "ok"
        for w in warm
    )
    # the trace starts when every warm-up has completed
    assert result.trace_start_s >= max(w.chunk_times_s[-1] for w in warm)
    assert by_id["p"].scheduled_s == pytest.approx(result.trace_start_s)
    # dependents: scheduled at the predecessor's completion plus the tool delay (the paced
    # client's completion is its last bytes' kernel time: the last chunk's own, to rounding)
    p_end = by_id["p"].chunk_times_s[-1]
    eps = 1e-9
    assert 0.05 - eps <= by_id["w1"].scheduled_s - p_end < 0.05 + 0.05
    assert 0.10 - eps <= by_id["w2"].scheduled_s - p_end < 0.10 + 0.05
    last_worker = max(by_id["w1"].chunk_times_s[-1], by_id["w2"].chunk_times_s[-1])
    assert -eps <= by_id["a"].scheduled_s - last_worker < 0.05
    lags = [r.sent_s - r.scheduled_s for r in result.records]
    assert min(lags) >= 0.0
    assert [r.request_id for r in result.records] == [w.request_id for w in warm] + [
        "p",
        "w1",
        "w2",
        "a",
    ]


def test_warm_ups_are_sent_their_spacing_apart(
    client: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With `warmup_spacing_s` the k-th warm-up is due at k x the spacing, and sent then (a
    burst of connections reaches llama-server's HTTP pool only as far as it had idle threads:
    servelab.sim.llamacpp, `_accept`)."""
    warmup = [RequestSpec(f"warmup-{i}", -1, "warmup", True, 4, [1, 2]) for i in range(4)]
    with server() as srv, caplog.at_level(logging.INFO, logger="servelab.dispatch.client"):
        result = dispatch(srv, graph(), warmup=warmup, warmup_spacing_s=0.05, client=client).run()
    # the warm-up phase ends once, after every warm-up, whichever client sent them
    assert sum("warm-up done" in r.getMessage() for r in caplog.records) == 1
    warm = [r for r in result.records if r.warmup]
    assert [w.scheduled_s for w in warm] == pytest.approx([0.0, 0.05, 0.10, 0.15])
    sent = [w.sent_s for w in warm]
    assert all(0.0 <= s - w.scheduled_s < 0.04 for s, w in zip(sent, warm, strict=True))
    assert all(b - a > 0.02 for a, b in itertools.pairwise(sent))
    assert all(w.status == "ok" for w in warm)
    with pytest.raises(ValueError, match="warmup_spacing_s"):
        dispatch(srv, graph(), warmup=warmup, warmup_spacing_s=-1.0, client=client)


@pytest.mark.parametrize(
    ("engine", "interval", "chunks", "source"),
    [
        ("vllm", 3, [1] * 8, "usage"),  # vLLM streams one token per chunk, usage on every chunk
        ("sglang", 3, [3, 3, 2], "tokenizer"),  # SGLang coalesces; counted from the text
    ],
)
def test_tokens_per_chunk(
    engine: str, interval: int, chunks: list[int], source: str, client: str
) -> None:
    srv_interval = 1 if engine == "vllm" else interval
    with server(engine, stream_interval=srv_interval) as srv:
        result = dispatch(srv, independent([0.0, 0.01], max_tokens=8), client=client).run()
    for rec in result.records:
        assert rec.status == "ok"
        assert rec.chunk_tokens == chunks
        assert len(rec.chunk_times_s) == len(chunks)
        assert rec.chunk_times_s == sorted(rec.chunk_times_s)
        assert rec.output_tokens == 8 and rec.prompt_tokens == 4
    assert result.chunk_token_sources[source] == 2
    assert result.chunk_token_mismatches == 0


def test_interrupt_records_in_flight_and_unsent_requests(client: str) -> None:
    trace = independent([0.0, 0.05], max_tokens=4)
    trace.append(TraceRequest("long", 2, "planner", 0.1, (), 0.0, 500))
    trace += independent([1.0, 1.5], prefix="later")
    with server() as srv:
        stop = TimedAction(0.4, lambda: None, "node reclaimed", stop_run=True)
        t0 = time.monotonic()
        result = dispatch(srv, trace, actions=[stop], client=client).run()
        assert time.monotonic() - t0 < 1.0  # the run stopped at the interruption
    by_id = {r.request_id: r for r in result.records}
    assert result.interrupted and result.interrupt_reason == "node reclaimed at 0.4 s"
    assert len(result.records) == len(trace)
    assert [by_id[k].status for k in ("r000", "r001")] == ["ok", "ok"]
    assert by_id["long"].status == "error" and by_id["long"].error.startswith("run interrupted")
    for key in ("later000", "later001"):
        assert by_id[key].sent_s is None
        assert by_id[key].error.startswith("not sent: run interrupted")
    assert run_status(result) == "interrupted"
    table = requests_table(result.records, "a/e/c/r")
    assert table.num_rows == len(trace)


def test_a_watch_stops_the_run_when_it_gives_a_reason(client: str) -> None:
    trace = independent([0.0, 0.05], max_tokens=4)
    trace.append(TraceRequest("long", 2, "planner", 0.1, (), 0.0, 1000))  # ~4 s: in flight
    trace += independent([2.0, 2.5], prefix="later")
    calls: list[float] = []

    def check() -> str | None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("API server did not answer")  # logged, tried again
        return "GPU node replaced" if len(calls) == 3 else None

    watch = TimedAction(0.2, check, "node watch", every_s=0.1)
    with server() as srv:
        t0 = time.monotonic()
        result = dispatch(srv, trace, actions=[watch], client=client).run()
        elapsed = time.monotonic() - t0
    assert len(calls) == 3  # the third look gave the reason; no more looks after it
    assert elapsed < 1.5  # stopped then, not at the end of the long request
    assert result.interrupted
    assert result.interrupt_reason.startswith("GPU node replaced (seen by the node watch at 0.")
    by_id = {r.request_id: r for r in result.records}
    assert [by_id[k].status for k in ("r000", "r001")] == ["ok", "ok"]
    assert by_id["long"].status == "error" and by_id["long"].error.startswith("run interrupted")
    assert all(by_id[f"later{i:03d}"].sent_s is None for i in range(2))


def test_a_quiet_watch_is_cancelled_when_the_run_ends(client: str) -> None:
    calls: list[float] = []
    watch = TimedAction(0.05, lambda: calls.append(1), "node watch", every_s=0.05)
    with server() as srv:
        t0 = time.monotonic()
        result = dispatch(srv, independent([0.0, 0.1]), actions=[watch], client=client).run()
        assert time.monotonic() - t0 < 3.0
    assert not result.interrupted and all(r.status == "ok" for r in result.records)
    n = len(calls)
    time.sleep(0.2)
    assert len(calls) == n  # nothing runs after the run


def test_unhealthy_server_is_a_bounded_dispatch_error(client: str) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    d = Dispatcher(
        base_url=f"http://127.0.0.1:{port}",
        model="m",
        trace=independent([0.0]),
        prompts={"r000": [1]},
        health_timeout_s=0.6,
        client=client,
    )
    t0 = time.monotonic()
    with pytest.raises(DispatchError, match=r"did not answer 200 within 0\.6 s"):
        d.run()
    assert time.monotonic() - t0 < 3.0


def test_missing_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="no prompt for request"):
        Dispatcher(base_url="http://127.0.0.1:1", model="m", trace=independent([0.0]), prompts={})


def test_pool_size_follows_the_load() -> None:
    small = pool_size(
        n_requests=1000, offered_load_rps=0.3, request_timeout_s=300, warmup_requests=20
    )
    big = pool_size(
        n_requests=1000, offered_load_rps=2.4, request_timeout_s=300, warmup_requests=20
    )
    assert small == 91  # ceil(0.3 * 300) + 1
    assert big == 721
    assert (
        pool_size(n_requests=10, offered_load_rps=50, request_timeout_s=300, warmup_requests=4)
        == 14
    )  # never more than the run's requests


def test_parallel_workers_keep_the_protocol(client: str) -> None:
    """Two worker processes: graphs split between them, one clock, one merged result."""
    from servelab.dispatch import run_parallel

    graphs = []
    for g in range(4):
        graphs += [
            TraceRequest(f"g{g}-p", g, "planner", 0.05 * g, (), 0.0, 4),
            TraceRequest(f"g{g}-w", g, "worker", 0.05 * g, (f"g{g}-p",), 0.05, 4),
            TraceRequest(f"g{g}-a", g, "aggregator", 0.05 * g, (f"g{g}-w",), 0.0, 6),
        ]
    warmup = [RequestSpec(f"warmup-{i}", -1, "warmup", True, 16, [1, 2]) for i in range(2)]
    with server() as srv:
        result = run_parallel(
            base_url=srv.base_url,
            model="m",
            trace=graphs,
            prompts={r.request_id: [7, 8, 9] for r in graphs},
            warmup=warmup,
            workers=2,
            request_timeout_s=10.0,
            health_timeout_s=5.0,
            progress_interval_s=1e6,
            count_tokens=count_words,
            client=client,
        )
    by_id = {r.request_id: r for r in result.records}
    assert [r.request_id for r in result.records] == ["warmup-0", "warmup-1"] + [
        r.request_id for r in graphs
    ]
    assert all(r.status == "ok" for r in result.records)
    assert result.trace_start_s >= max(by_id[w.request_id].chunk_times_s[-1] for w in warmup)
    for g in range(4):
        p, w, a = by_id[f"g{g}-p"], by_id[f"g{g}-w"], by_id[f"g{g}-a"]
        # one clock across processes: planners at trace start + arrival, dependents after
        assert p.scheduled_s == pytest.approx(result.trace_start_s + 0.05 * g)
        assert 0.05 - 1e-9 <= w.scheduled_s - p.chunk_times_s[-1] < 0.1  # to rounding
        assert -1e-9 <= a.scheduled_s - w.chunk_times_s[-1] < 0.05
    assert result.chunk_token_sources == {"usage": 14, "tokenizer": 0}
    assert not result.interrupted


def test_parallel_workers_are_interrupted_together(client: str) -> None:
    from servelab.dispatch import run_parallel

    trace = independent([0.0, 0.02, 0.04, 0.06], max_tokens=4)
    trace += [TraceRequest(f"late{i}", 10 + i, "planner", 1.0, (), 0.0, 4) for i in range(4)]
    stop = TimedAction(0.5, lambda: None, "node reclaimed", stop_run=True)
    with server() as srv:
        result = run_parallel(
            base_url=srv.base_url,
            model="m",
            trace=trace,
            prompts={r.request_id: [7] for r in trace},
            warmup=[],
            workers=2,
            health_timeout_s=5.0,
            progress_interval_s=1e6,
            count_tokens=count_words,
            actions=[stop],
            client=client,
        )
    assert result.interrupted and result.interrupt_reason == "node reclaimed at 0.5 s"
    statuses = {r.request_id: (r.status, r.sent_s) for r in result.records}
    assert all(statuses[f"r{i:03d}"][0] == "ok" for i in range(4))
    assert all(statuses[f"late{i}"][1] is None for i in range(4))
    assert all("node reclaimed" in r.error for r in result.records if r.status != "ok")
