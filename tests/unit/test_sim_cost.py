"""Tests of the simulator's presets, KV-capacity derivation and roofline cost model."""

from __future__ import annotations

import dataclasses

import pytest

from servelab.sim.cost import DEFAULT_CALIBRATION, CostModel
from servelab.sim.memory import CUDA_CONTEXT_GIB, sglang_kv_capacity, vllm_kv_capacity
from servelab.sim.presets import gpu_preset, model_preset

LLAMA, QWEN, L4 = model_preset("llama-3.1-8b"), model_preset("qwen2.5-7b"), gpu_preset("L4")


def test_model_dimensions_match_the_study() -> None:
    assert LLAMA.kv_bytes_per_token == 128 * 1024  # §3.3: 128 KiB per token
    assert QWEN.kv_bytes_per_token == 56 * 1024  # §3.3: Qwen2.5-7B stores 56 KiB
    assert LLAMA.total_params == pytest.approx(8.03e9, rel=0.01)
    assert LLAMA.weight_bytes / 1e9 == pytest.approx(16.06, rel=0.01)


def test_unknown_presets_name_the_config_key() -> None:
    with pytest.raises(ValueError, match=r"gpu\.name"):
        gpu_preset("T4")
    with pytest.raises(ValueError, match=r"model\.preset"):
        model_preset("llama-70b")


def test_vllm_kv_blocks_follow_the_profiling_rule() -> None:
    kv = vllm_kv_capacity(
        LLAMA, L4, gpu_memory_utilization=0.88, max_num_batched_tokens=16384, max_num_seqs=256
    )
    total = 23034 * 2**20
    expected = int((total * 0.88 - LLAMA.weight_bytes - kv.activation_gib * 2**30) // (2 * 2**20))
    assert kv.blocks == expected and kv.tokens == 16 * expected
    # a smaller profiling batch leaves more memory for blocks; more utilisation, more blocks
    small = vllm_kv_capacity(
        LLAMA, L4, gpu_memory_utilization=0.88, max_num_batched_tokens=2048, max_num_seqs=256
    )
    more = vllm_kv_capacity(
        LLAMA, L4, gpu_memory_utilization=0.90, max_num_batched_tokens=16384, max_num_seqs=256
    )
    assert small.blocks > kv.blocks and more.blocks > kv.blocks
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        vllm_kv_capacity(
            LLAMA, L4, gpu_memory_utilization=0.6, max_num_batched_tokens=16384, max_num_seqs=256
        )


def test_sglang_kv_tokens_follow_mem_fraction_static() -> None:
    a = sglang_kv_capacity(LLAMA, L4, mem_fraction_static=0.85)
    b = sglang_kv_capacity(LLAMA, L4, mem_fraction_static=0.88)
    # each 0.01 of the fraction is 0.01 x the free memory at start (23034 MiB less the CUDA
    # context: SGLang 0.4.1 reads it after initialising the device) of KV slots
    free_at_start = 23034 * 2**20 - CUDA_CONTEXT_GIB * 2**30
    per_hundredth = 0.01 * free_at_start / LLAMA.kv_bytes_per_token
    assert b.tokens - a.tokens == pytest.approx(3 * per_hundredth, abs=2)
    assert 20_000 < a.tokens < 40_000  # the study's L4: tens of thousands of tokens (§2.1)


def test_decode_is_memory_bound_and_prefill_compute_bound() -> None:
    c = CostModel(LLAMA, L4, "vllm")
    t1 = c.decode_time(1, 1000)
    # decode: reading the weights dominates; 8 sequences cost little more than one
    assert t1 > LLAMA.weight_bytes / L4.mem_bandwidth
    assert c.decode_time(8, 1000) < 1.2 * t1
    # longer contexts read more KV; a shared prefix read from L2 is cheaper
    assert c.decode_time(32, 4000) > c.decode_time(32, 1000)
    assert c.decode_time(32, 4000, shared=3600) < c.decode_time(32, 4000)
    # prefill: time grows about linearly with tokens once compute-bound
    assert c.prefill_time(4000) / c.prefill_time(2000) == pytest.approx(2.0, rel=0.15)
    # cached context saves compute
    assert c.prefill_time(400, cached_tokens=3600) < c.prefill_time(4000) / 4


def test_eager_iterations_and_engine_overheads_differ() -> None:
    v, s = CostModel(LLAMA, L4, "vllm"), CostModel(LLAMA, L4, "sglang")
    assert v.decode_time(16, 4000, cuda_graph=False) > v.decode_time(16, 4000, cuda_graph=True)
    assert s.decode_time(16, 4000) < v.decode_time(16, 4000)  # SGLang's overlap scheduler
    faster = CostModel(
        LLAMA, L4, "vllm", dataclasses.replace(DEFAULT_CALIBRATION, bandwidth_efficiency=1.0)
    )
    assert faster.decode_time(16, 4000) < v.decode_time(16, 4000)
    h100 = CostModel(LLAMA, gpu_preset("H100-80GB"), "vllm")
    # the GPU part scales with the bandwidth (3.35 TB/s vs 300 GB/s); vLLM's CPU overhead does not
    no_cpu = dataclasses.replace(
        DEFAULT_CALIBRATION, vllm_iteration_overhead_s=0.0, vllm_per_seq_overhead_s=0.0
    )
    gpu_l4 = CostModel(LLAMA, L4, "vllm", no_cpu).decode_time(16, 4000)
    gpu_h100 = CostModel(LLAMA, gpu_preset("H100-80GB"), "vllm", no_cpu).decode_time(16, 4000)
    assert gpu_h100 < gpu_l4 / 10
    overhead = DEFAULT_CALIBRATION.vllm_iteration_overhead_s + 16 * (
        DEFAULT_CALIBRATION.vllm_per_seq_overhead_s
    )
    assert h100.decode_time(16, 4000) == pytest.approx(gpu_h100 + overhead)
    assert h100.decode_time(16, 4000) < v.decode_time(16, 4000) / 4
