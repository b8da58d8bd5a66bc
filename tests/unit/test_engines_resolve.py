"""Configuration resolution by each engine's own rules (docs/engines.md, "Upstream sources"; servelab.engines.vllm and .sglang)."""

from __future__ import annotations

import json

import pytest

from servelab.engines import FlagError, ResolutionError, resolve, runtime_limits
from servelab.grid import config as grid

L4_MIB = 23034
MODEL = "--model=meta-llama/Llama-3.1-8B-Instruct"
SG_MODEL = "--model-path=meta-llama/Llama-3.1-8B-Instruct"


# ----------------------------------------------------------------------------------- vLLM


@pytest.mark.parametrize(
    ("max_model_len", "chunked", "budget"),
    [
        (32768, False, 32768),  # not > 32768: off, budget max(len, 2048)
        (32769, True, 512),  # > 32768: on, budget 512
        (16384, False, 16384),
        (1024, False, 2048),  # short context: budget raised to 2048
    ],
)
def test_vllm_32k_rule_on_both_sides_of_the_boundary(max_model_len, chunked, budget):
    r = resolve("vllm", [MODEL, f"--max-model-len={max_model_len}"], gpu_memory_mib=L4_MIB)
    assert (r.chunked_prefill, r.token_budget, r.chunked_prefill_rule) == (
        chunked,
        budget,
        "32k-rule",
    )
    assert r.chunk_size == (budget if chunked else None)
    assert r.context_len == max_model_len


def test_vllm_without_max_model_len_uses_the_models_length_and_chunks():
    r = resolve("vllm", [MODEL], gpu_memory_mib=L4_MIB, model_max_position_embeddings=131072)
    assert (r.context_len, r.chunked_prefill, r.chunk_size) == (131072, True, 512)
    short = resolve("vllm", [MODEL], gpu_memory_mib=L4_MIB, model_max_position_embeddings=8192)
    assert (short.context_len, short.chunked_prefill) == (8192, False)


def test_vllm_gpu_memory_does_not_matter():
    small = resolve("vllm", [MODEL, "--max-model-len=16384"], gpu_memory_mib=L4_MIB)
    big = resolve("vllm", [MODEL, "--max-model-len=16384"], gpu_memory_mib=81920)
    assert small.as_run_config() == big.as_run_config()


@pytest.mark.parametrize(
    "extra", [["--enable-lora"], ["--speculative-model=draft"], ["--device=cpu"]]
)
def test_vllm_32k_rule_needs_cuda_and_no_lora_or_spec_decode(extra):
    r = resolve("vllm", [MODEL, "--max-model-len=65536", *extra], gpu_memory_mib=L4_MIB)
    assert r.chunked_prefill is False and r.token_budget == 65536


def test_vllm_explicit_flags_override_the_rule():
    off = resolve("vllm", [MODEL, "--enable-chunked-prefill=False"], gpu_memory_mib=L4_MIB)
    assert (off.chunked_prefill, off.chunk_size, off.token_budget) == (False, None, 131072)
    on = resolve(
        "vllm", [MODEL, "--max-model-len=16384", "--enable-chunked-prefill"], gpu_memory_mib=L4_MIB
    )
    assert (on.chunked_prefill, on.chunk_size, on.chunked_prefill_rule) == (True, 512, "flag")


def test_vllm_defaults():
    r = resolve("vllm", [MODEL, "--max-model-len=16384"], gpu_memory_mib=L4_MIB)
    assert (r.max_num_seqs, r.block_size, r.memory_fraction) == (256, 16, 0.9)
    assert (r.prefix_caching, r.schedule_policy) == (False, "fcfs")
    assert (r.printed_version, r.version) == ("dev", "0.6.3")
    assert r.served_model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert r.max_running_requests is None and r.cuda_graph_max_bs is None


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        (["--max-model-len=16384", "--max-num-batched-tokens=8192"], "--max-num-batched-tokens"),
        (
            ["--enable-chunked-prefill", "--max-num-batched-tokens=128", "--max-model-len=4096"],
            "--max-num-batched-tokens",
        ),
        (["--gpu-memory-utilization=1.2"], "--gpu-memory-utilization"),
        (["--max-model-len=200000"], "--max-model-len"),
        (
            [
                "--max-model-len=16384",
                "--enable-chunked-prefill",
                "--enable-prefix-caching",
                "--max-num-batched-tokens=2050",
            ],
            "--max-num-batched-tokens",
        ),
    ],
)
def test_vllm_refuses_what_vllm_refuses(flags, flag):
    with pytest.raises(ResolutionError, match=flag):
        resolve("vllm", [MODEL, *flags], gpu_memory_mib=L4_MIB)


# --------------------------------------------------------------------------------- SGLang


@pytest.mark.parametrize(
    ("mib", "chunk", "graph_bs"), [(23034, 2048, 8), (24999, 2048, 8), (25000, 8192, 160)]
)
def test_sglang_gpu_memory_rule_at_the_25000_mib_boundary(mib, chunk, graph_bs):
    r = resolve("sglang", [SG_MODEL], gpu_memory_mib=mib)
    assert (r.chunked_prefill, r.chunk_size, r.cuda_graph_max_bs) == (True, chunk, graph_bs)
    assert r.chunked_prefill_rule == "gpu-memory-rule"


@pytest.mark.parametrize("size", ["-1", "0"])
def test_sglang_non_positive_chunk_size_disables_chunking(size):
    r = resolve("sglang", [SG_MODEL, f"--chunked-prefill-size={size}"], gpu_memory_mib=L4_MIB)
    assert (r.chunked_prefill, r.chunk_size, r.chunked_prefill_rule) == (False, None, "flag")


@pytest.mark.parametrize(
    ("tp", "fraction", "graph_bs"), [(1, 0.88, 8), (2, 0.87, 8), (4, 0.85, 80), (8, 0.81, 80)]
)
def test_sglang_memory_fraction_and_graph_batch_by_tp(tp, fraction, graph_bs):
    r = resolve("sglang", [SG_MODEL, f"--tp-size={tp}"], gpu_memory_mib=L4_MIB)
    assert (r.memory_fraction, r.cuda_graph_max_bs, r.tensor_parallel_size) == (
        fraction,
        graph_bs,
        tp,
    )


def test_sglang_defaults_and_context_length():
    r = resolve("sglang", [SG_MODEL], gpu_memory_mib=L4_MIB, model_max_position_embeddings=131072)
    assert (r.schedule_policy, r.prefix_caching, r.overlap_schedule) == ("lpm", True, True)
    assert (r.token_budget, r.context_len, r.max_running_requests) == (16384, 131072, None)
    assert r.printed_version is None and r.block_size is None and r.max_num_seqs is None
    short = resolve("sglang", [SG_MODEL, "--context-length=16384"], gpu_memory_mib=L4_MIB)
    assert short.context_len == 16384
    with pytest.raises(ResolutionError, match="--context-length"):
        resolve("sglang", [SG_MODEL, "--context-length=262144"], gpu_memory_mib=L4_MIB)


def test_sglang_radix_cache_off_falls_back_to_fcfs():
    r = resolve("sglang", [SG_MODEL, "--disable-radix-cache"], gpu_memory_mib=L4_MIB)
    assert (r.prefix_caching, r.schedule_policy) == (False, "fcfs")
    random = resolve(
        "sglang",
        [SG_MODEL, "--disable-radix-cache", "--schedule-policy=random"],
        gpu_memory_mib=L4_MIB,
    )
    assert random.schedule_policy == "random"


def test_sglang_dp_attention_halves_the_chunk_and_disables_overlap():
    r = resolve("sglang", [SG_MODEL, "--enable-dp-attention"], gpu_memory_mib=L4_MIB)
    assert (r.chunk_size, r.overlap_schedule) == (1024, False)


# -------------------------------------------------------------------- the study's grid


def test_the_study_arms_resolve_as_the_study_reports(study_config):
    """Table 1 / §3.4: defaults vLLM off, SGLang 2048 on an L4; matched both on at 2048."""
    mib = study_config["gpu"]["memory_mib"]
    seen = set()
    for run in grid.runs(study_config):
        d = grid.deployment_for(study_config, run.arm, run.engine, run.condition)
        if d.id in seen:
            continue
        seen.add(d.id)
        r = resolve(d.engine, d.flags, gpu_memory_mib=mib)
        assert r.chunked_prefill is d.expect_chunked_prefill, d.id
        if d.expect_chunk_size is not None:
            assert r.chunk_size == d.expect_chunk_size, d.id
        assert (r.prefix_caching, r.context_len) == (True, 16384)
        assert r.memory_fraction == {"vllm": 0.88, "sglang": 0.85}[d.engine]
        assert r.schedule_policy == {"vllm": "fcfs", "sglang": "lpm"}[d.engine]
    assert len(seen) == 5  # vLLM x 2 arms, SGLang defaults, SGLang matched rate and length


def test_dict_forms_are_json_safe_and_sorted():
    r = resolve("vllm", [MODEL, "--max-model-len=16384"], gpu_memory_mib=L4_MIB)
    d = r.to_dict()
    assert list(d) == sorted(d) and json.loads(json.dumps(d)) == d
    assert d["flags"] == [MODEL, "--max-model-len=16384"]
    run = r.as_run_config()
    assert list(run) == sorted(run)
    assert {"chunked_prefill", "chunk_size"} <= set(run) and "flags" not in run


def test_only_the_implemented_versions_and_engines():
    assert resolve("vllm", [MODEL], gpu_memory_mib=L4_MIB, version="0.6.3").version == "0.6.3"
    with pytest.raises(
        ResolutionError,
        match=r"vLLM family \(<0\.8; engine vllm\), whose rules servelab implements at 0\.6\.3 only",
    ):
        resolve("vllm", [MODEL], gpu_memory_mib=L4_MIB, version="0.6.4")
    with pytest.raises(ResolutionError, match="unknown engine"):
        resolve("tgi", [], gpu_memory_mib=L4_MIB)
    with pytest.raises(FlagError, match="--block-size"):
        resolve("vllm", ["--block-size=7"], gpu_memory_mib=L4_MIB)


def test_runtime_limits():
    v = resolve("vllm", [MODEL, "--max-model-len=16384"], gpu_memory_mib=L4_MIB)
    lim = runtime_limits(v, kv_capacity_tokens=34010)
    assert (lim.num_gpu_blocks, lim.kv_capacity_tokens, lim.max_running_requests) == (
        2125,
        34000,
        256,
    )
    assert lim.prompt_limit == 16384 and lim.max_concurrency == pytest.approx(34000 / 16384)
    # SGLang: the fixture sglang-0.4.1-01 shows max_running_requests=2049 for 444500 tokens at 131072.
    s = resolve("sglang", [SG_MODEL], gpu_memory_mib=81920)
    lim = runtime_limits(s, kv_capacity_tokens=444500)
    assert (lim.max_running_requests, lim.prompt_limit) == (2049, 131066)
    capped = resolve("sglang", [SG_MODEL, "--max-total-tokens=20000"], gpu_memory_mib=L4_MIB)
    lim = runtime_limits(capped, kv_capacity_tokens=444500)
    assert (lim.kv_capacity_tokens, lim.max_running_requests) == (20000, 2049)
    assert lim.prompt_limit == 19994
