"""Engine /metrics names, the canonical mapping, and the Prometheus text parser on real scrapes."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from servelab.artifacts import TELEMETRY_METRICS
from servelab.engines import (
    ENGINE_METRICS,
    METRIC_MAP,
    cache_config_info,
    canonical_metrics,
    canonical_values,
    parse_metrics_text,
)
from servelab.engines.registry import product_of

DATA = Path(__file__).resolve().parents[1] / "data" / "engine-logs"


def test_the_map_covers_the_canonical_names_and_sglang_has_no_preemption_counter():
    # only llama.cpp counts cached prompt tokens; every canonical name is some engine's
    cached = {"prompt_tokens_cached_total"}
    assert canonical_metrics("vllm") == sorted(set(TELEMETRY_METRICS) - cached)
    assert canonical_metrics("sglang") == sorted(
        set(TELEMETRY_METRICS) - {"preemptions_total"} - cached
    )
    assert set(TELEMETRY_METRICS) == {m for e in METRIC_MAP for m in canonical_metrics(e)}
    assert METRIC_MAP["vllm"]["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"
    assert METRIC_MAP["sglang"]["kv_cache_usage"] == "sglang:token_usage"
    assert METRIC_MAP["sglang"]["requests_waiting"] == "sglang:num_queue_reqs"
    assert METRIC_MAP["sglang"]["prefix_cache_hit_rate"] == "sglang:cache_hit_rate"
    with pytest.raises(ValueError, match="unknown engine"):
        canonical_metrics("tgi")


def test_every_mapped_name_is_one_the_engine_exports():
    for engine, mapping in METRIC_MAP.items():
        for source in mapping.values():
            assert source in ENGINE_METRICS[engine], source
            assert source.startswith(f"{product_of(engine)}:")  # vllm_v1 exports vllm:...


def test_vllm_v0_scrape():
    text = (DATA / "vllm-V0-metrics-01.txt").read_text()
    samples = parse_metrics_text(text)  # the "# source:" comment line is ignored
    values = canonical_values("vllm", samples)
    assert values == {
        "generation_tokens_total": 955.0,
        "kv_cache_usage": 0.0,
        "preemptions_total": 0.0,
        "prefix_cache_hit_rate": -1.0,  # -1: prefix caching off
        "prompt_tokens_total": 148.0,
        "requests_running": 0.0,
        "requests_waiting": 0.0,
    }
    info = cache_config_info(samples)
    assert info is not None
    assert (info["num_gpu_blocks"], info["num_cpu_blocks"], info["block_size"]) == (
        "81767",
        "9362",
        "16",
    )
    assert (info["enable_prefix_caching"], info["gpu_memory_utilization"]) == ("False", "0.9")
    success = [s for s in samples if s.name == "vllm:request_success_total"]
    assert [(s.labels["finished_reason"], s.value) for s in success] == [("stop", 4.0)]
    # The histogram in this excerpt has no _count and no +Inf bucket: still parsed.
    buckets = [s for s in samples if s.name == "vllm:iteration_tokens_total_bucket"]
    assert [s.labels["le"] for s in buckets][-1] == "96.0" and len(buckets) == 15
    assert buckets[0].type == "histogram"


def test_sglang_scrape_with_the_old_name_label():
    samples = parse_metrics_text((DATA / "sglang-0.3.5-metrics-01.txt").read_text())
    model = "/shared/public/elr-models/meta-llama/Llama-3.2-3B/5cc0ffe09ee49f7be6ca7c794ee6bd7245e84e60/"
    assert {s.model for s in samples} == {model}  # from name=, not model_name=
    assert canonical_values("sglang", samples) == {"prompt_tokens_total": 230794.0}
    assert canonical_values("sglang", samples, model="other") == {}
    by_name = {s.name: s.value for s in samples}
    assert by_name["sglang:context_len"] == 131072.0
    assert by_name["sglang:max_total_num_tokens"] == 570979.0


def _sglang_exposition(models: list[str]) -> str:
    """What SGLang 0.4.1's collector exposes (names and label as docs/engines.md lists them), via prometheus_client."""
    reg = CollectorRegistry()
    gauges = {
        name: Gauge(name, name, ["model_name"], registry=reg)
        for name in (
            "sglang:token_usage",
            "sglang:num_running_reqs",
            "sglang:num_queue_reqs",
            "sglang:cache_hit_rate",
        )
    }
    counters = {
        name: Counter(name.removesuffix("_total"), name, ["model_name"], registry=reg)
        for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total")
    }
    for i, model in enumerate(models):
        gauges["sglang:token_usage"].labels(model).set(0.42 + i)
        gauges["sglang:num_running_reqs"].labels(model).set(7)
        gauges["sglang:num_queue_reqs"].labels(model).set(3)
        gauges["sglang:cache_hit_rate"].labels(model).set(0.61)
        counters["sglang:prompt_tokens_total"].labels(model).inc(4096)
        counters["sglang:generation_tokens_total"].labels(model).inc(128)
    return generate_latest(reg).decode()


def test_sglang_exposition_maps_to_canonical_names():
    values = canonical_values("sglang", parse_metrics_text(_sglang_exposition(["llama"])))
    assert values == {
        "generation_tokens_total": 128.0,
        "kv_cache_usage": 0.42,
        "prefix_cache_hit_rate": 0.61,
        "prompt_tokens_total": 4096.0,
        "requests_running": 7.0,
        "requests_waiting": 3.0,
    }


def test_two_models_in_one_scrape_need_a_model_to_choose():
    samples = parse_metrics_text(_sglang_exposition(["a", "b"]))
    with pytest.raises(ValueError, match=r"sglang:.*2 series"):
        canonical_values("sglang", samples)
    assert canonical_values("sglang", samples, model="b")["kv_cache_usage"] == pytest.approx(1.42)


def test_malformed_exposition_is_refused():
    with pytest.raises(ValueError, match="malformed"):
        parse_metrics_text('vllm:num_requests_running{model_name="x" 1.0\n')
