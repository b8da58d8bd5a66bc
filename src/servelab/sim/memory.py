"""KV-cache capacity each engine derives from GPU memory, weights and an activation reserve.

vLLM 0.6.3 (`worker/worker.py::determine_num_available_blocks`):
    num_gpu_blocks = (total · gpu_memory_utilization − peak) // block_bytes
where `peak` is the memory the worker holds after a profiling forward pass of `max_num_batched_tokens`
tokens over `max_num_seqs` sequences: weights + activations of that pass + sampler logits. The CUDA context
is created before the baseline is taken, so it is not part of `peak`.

SGLang 0.4.1 (`model_executor/model_runner.py`):
    max_total_num_tokens = (avail_after_weights − total · (1 − mem_fraction_static)) // cell_size
where `avail_after_weights` is the free memory once the CUDA context, the runtime and the weights are
resident ("Load weight end. avail mem=... GB").

The activation and runtime terms are estimates (documented in docs/simulator.md), named here so they can
be checked against a real start-up log's `# GPU blocks:` / `max_total_num_tokens=` lines.
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
CUDA_CONTEXT_GIB = 0.55
# Non-activation allocations during vLLM's profiling pass (cuBLAS workspace, sampler temporaries).
PROFILE_MISC_GIB = 0.20


def _activation_bytes(model: ModelPreset, tokens: int) -> float:
    """Peak activation memory of one forward pass over `tokens` tokens.

    Dominated by the gated MLP: gate and up projections (2 × intermediate) plus their product, and a
    few hidden-sized buffers (residual, normed input, attention output, QKV), all in the model dtype.
    """
    per_token = (3 * model.intermediate_size + 6 * model.hidden_size) * model.dtype_bytes
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


def sglang_kv_capacity(
    model: ModelPreset,
    gpu: GpuPreset,
    *,
    mem_fraction_static: float,
    gpu_memory_mib: int | None = None,
) -> KvCapacity:
    total = (gpu_memory_mib or gpu.memory_mib) * 2**20
    avail_after_weights = total - CUDA_CONTEXT_GIB * GIB - model.weight_bytes
    rest = total * (1 - mem_fraction_static)
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
