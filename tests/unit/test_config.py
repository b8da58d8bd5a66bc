"""Configuration validation and grid expansion."""

from __future__ import annotations

import collections

import pytest

from servelab.grid import config as grid
from servelab.grid.config import ConfigError, validate_config


def test_study_config_is_valid_and_expands_to_the_99_run_grid(study_config):
    validate_config(study_config)
    runs = grid.runs(study_config)
    assert len(runs) == 99
    counts = collections.Counter((r.arm, r.engine) for r in runs)
    assert counts == {
        ("defaults", "vllm"): 39,
        ("defaults", "sglang"): 39,
        ("matched", "vllm"): 12,
        ("matched", "sglang"): 9,
    }
    assert len({r.id for r in runs}) == 99


def test_condition_ids_follow_the_design_format(study_config):
    ids = list(grid.conditions(study_config))
    assert ids[:5] == ["rate-0.05", "rate-0.12", "rate-0.20", "rate-0.28", "rate-0.40"]
    assert "sharing-0.00" in ids and "sharing-0.95" in ids and "length-8192" in ids


def test_runs_are_grouped_by_deployment(study_config):
    runs = grid.runs(study_config)
    deployment_ids = [
        grid.deployment_for(study_config, r.arm, r.engine, r.condition).id for r in runs
    ]
    # Each deployment's runs are contiguous: it comes up once per campaign.
    seen: list[str] = []
    for d in deployment_ids:
        if not seen or seen[-1] != d:
            assert d not in seen, f"deployment {d} comes up twice"
            seen.append(d)


def test_matched_sglang_passes_the_chunk_flag_only_for_8192_token_runs(study_config):
    rate = grid.deployment_for(study_config, "matched", "sglang", "rate-0.28")
    length = grid.deployment_for(study_config, "matched", "sglang", "length-8192")
    assert "--chunked-prefill-size=2048" not in rate.flags
    assert "--chunked-prefill-size=2048" in length.flags
    assert rate.id != length.id
    vllm = grid.deployment_for(study_config, "defaults", "vllm", "rate-0.28")
    assert "--enable-chunked-prefill=False" in vllm.flags


def test_trace_seed_depends_only_on_condition_and_rep():
    a = grid.trace_seed(1, "rate-0.28", "rep1")
    assert a == grid.trace_seed(1, "rate-0.28", "rep1")
    assert a != grid.trace_seed(1, "rate-0.28", "rep2")
    assert a != grid.trace_seed(1, "rate-0.12", "rep1")
    assert a != grid.trace_seed(2, "rate-0.28", "rep1")
    assert 0 <= a < 2**63


def _set(cfg, path, value):
    node = cfg
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value


_DELETE = object()

# (path into the config, bad value, the key the error must name)
INVALID = [
    (("backend",), "docker", "backend"),
    (("campaign_seed",), -1, "campaign_seed"),
    (("repetitions",), 0, "repetitions"),
    (("model", "dtype"), "int4", "model.dtype"),
    (("model", "max_model_len"), "16k", "model.max_model_len"),
    (("gpu", "name"), "T4", "gpu.name"),
    (("gpu", "memory_mib"), 0, "gpu.memory_mib"),
    (("workload", "arrival_cv"), 0, "workload.arrival_cv"),
    (("workload", "max_tokens", "aggregator"), 0, "workload.max_tokens.aggregator"),
    (("workload", "tool_delay", "distribution"), "pareto", "workload.tool_delay.distribution"),
    (("workload", "tool_delay", "min_s"), 20.0, "workload.tool_delay.min_s"),
    (("conditions", 1, "rate"), -0.1, "conditions[1].rate"),
    (("conditions", 2, "sharing"), 1.0, "conditions[2].sharing"),
    (("conditions", 3, "prompt_tokens"), 4096.5, "conditions[3].prompt_tokens"),
    (("conditions", 4, "sweep"), "burst", "conditions[4].sweep"),
    (("conditions", 0, "duration_s"), _DELETE, "conditions[0]"),
    (("engines", "vllm", "image"), "vllm/vllm-openai:v0.6.3", "engines.vllm.image"),
    (("engines", "sglang", "flags"), ["chunked-prefill-size 2048"], "engines.sglang.flags[0]"),
    (("arms", "matched", "conditions"), ["rate-0.99"], "arms.matched.conditions[0]"),
    (
        ("arms", "defaults", "engines", "vllm", "expect", "chunked_prefill"),
        "no",
        "arms.defaults.engines.vllm.expect.chunked_prefill",
    ),
    (("dispatch", "warmup_requests"), -5, "dispatch.warmup_requests"),
    (("dispatch", "request_timeout_s"), 0, "dispatch.request_timeout_s"),
    (("dispatch", "client"), "aiohttp", "dispatch.client"),
    (("campaign", "success_threshold"), 1.5, "campaign.success_threshold"),
    (("campaign", "retries"), 2.5, "campaign.retries"),
    (("telemetry", "step_s"), 0, "telemetry.step_s"),
    (("telemetry", "prometheus_url"), "localhost:9090", "telemetry.prometheus_url"),
    (("analysis", "phi_guard"), 1.0, "analysis.phi_guard"),
    (("analysis", "typo_key"), True, "analysis"),
]


@pytest.mark.parametrize(("path", "value", "key"), INVALID, ids=[i[2] for i in INVALID])
def test_invalid_value_is_refused_naming_its_key(study_config, path, value, key):
    _set(study_config, path, value)
    with pytest.raises(ConfigError) as info:
        validate_config(study_config)
    assert f"config key {key}" in str(info.value)


def test_duplicate_condition_is_refused(study_config):
    study_config["conditions"].append(dict(study_config["conditions"][0]))
    with pytest.raises(ConfigError, match=r"conditions\[13\]: duplicates condition rate-0.05"):
        validate_config(study_config)


def test_paced_client_over_https_is_refused(study_config):
    study_config["kubernetes"]["engine_url"] = "https://{service}.{namespace}:{port}"
    study_config["dispatch"]["client"] = "paced"
    with pytest.raises(
        ConfigError, match=r"config key dispatch\.client: 'paced' speaks plain http"
    ):
        validate_config(study_config)
    study_config["dispatch"]["client"] = "httpx"
    validate_config(study_config)


def test_unknown_key_is_named(study_config):
    study_config["dispatch"]["warmup"] = 20
    with pytest.raises(ConfigError, match=r"config key dispatch: unknown key\(s\) 'warmup'"):
        validate_config(study_config)
