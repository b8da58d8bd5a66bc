"""Hardware and model presets for the simulator's roofline cost model (config `gpu.name`, `model.preset`).

Sources (see docs/simulator.md): GPU peak dense BF16 tensor throughput and DRAM bandwidth from the vendors'
published specifications (the L4 figures: docs/simulator.md, "Cost model"); model dimensions from
each model's Hugging Face `config.json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

__all__ = ["GPUS", "MODELS", "GpuPreset", "ModelPreset", "gpu_preset", "model_preset"]


@dataclass(frozen=True)
class GpuPreset:
    """One GPU: what the roofline needs, plus what `nvidia-smi` reports as total memory."""

    name: str
    peak_bf16_flops: float  # dense tensor-core FLOP/s
    mem_bandwidth: float  # DRAM bytes/s
    memory_mib: int  # nvidia-smi memory.total
    l2_bytes: int


@dataclass(frozen=True)
class ModelPreset:
    """Transformer dimensions (decoder-only, grouped-query attention, gated MLP)."""

    name: str
    hf_id: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    bos_token_id: int | None  # prepended by the engine's tokenizer; None if the model adds none
    dtype_bytes: int = 2

    @cached_property
    def layer_params(self) -> int:
        """Parameters of the transformer layers (attention projections and MLP; norms ignored)."""
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_layers * (q + kv + o + mlp)

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def total_params(self) -> int:
        """Layers + input embedding + (untied) LM head."""
        return self.layer_params + 2 * self.embedding_params

    @cached_property
    def weight_bytes(self) -> int:
        return self.total_params * self.dtype_bytes

    @cached_property
    def weights_gib(self) -> float:
        return self.weight_bytes / 2**30

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 131,072 B (128 KiB) for Llama-3.1-8B in bf16."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @cached_property
    def attn_flops_per_token_ctx(self) -> int:
        """FLOPs of QK^T and AV for one query token against one context token, all layers."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    @property
    def bos_tokens(self) -> int:
        return 0 if self.bos_token_id is None else 1


# Sources. Peak dense BF16 tensor throughput and DRAM bandwidth: the vendors' data sheets, "with
# sparsity" figures halved. Total memory: nvidia-smi's memory.total, as the engines' rules read it
# (SGLang's chunk size and graph batch by < 25,000 MiB; vLLM V1's batch defaults by >= 70 GiB), from
# public nvidia-smi outputs; the totals of all four GPUs below are listed together in
# github.com/modal-labs/modal-client pull request #2797 (2025-01-23: H100 81559 MiB, A100 80GB
# 81920 MiB, A100 40GB 40960 MiB, L4 23034 MiB). L2: the architecture white papers.
GPUS: dict[str, GpuPreset] = {
    # NVIDIA L4 (Ada AD104): 242 TFLOPS BF16 with sparsity -> 121 dense; 300 GB/s GDDR6; 23034 MiB in nvidia-smi.
    "L4": GpuPreset("L4", 121e12, 300e9, 23034, 48 * 2**20),
    # A100 SXM4 40GB (Ampere GA100): 312 TFLOPS dense BF16 (624 with sparsity), 1,555 GB/s HBM2
    # (NVIDIA A100 Tensor Core GPU data sheet, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf);
    # 40 MB L2 (NVIDIA Ampere GA100 architecture white paper); 40960 MiB in nvidia-smi.
    "A100-40GB": GpuPreset("A100-40GB", 312e12, 1555e9, 40960, 40 * 2**20),
    # A100 SXM4 80GB: 312 TFLOPS dense BF16, 2,039 GB/s HBM2e (the same data sheet, "A100 80GB
    # SXM"); 40 MB L2; 81920 MiB in nvidia-smi.
    "A100-80GB": GpuPreset("A100-80GB", 312e12, 2039e9, 81920, 40 * 2**20),
    # H100 SXM5 80GB (Hopper GH100): 989 TFLOPS dense BF16 (1,979 with sparsity), 3.35 TB/s HBM3
    # (NVIDIA H100 Tensor Core GPU data sheet, "H100 SXM"); 50 MB L2 (NVIDIA H100 Tensor Core GPU
    # architecture white paper); nvidia-smi reports 81559 MiB.
    "H100-80GB": GpuPreset("H100-80GB", 989e12, 3350e9, 81559, 50 * 2**20),
    # The CPU platform (real engines on this machine class): no roofline, each engine's step
    # time is fitted from its unloaded floor (servelab.sim.cpu_platform, config gpu.step_cost);
    # the memory is config gpu.memory_mib.
    "CPU": GpuPreset("CPU", 0.0, 0.0, 24000, 0),
}

MODELS: dict[str, ModelPreset] = {
    "llama-3.1-8b": ModelPreset(
        name="llama-3.1-8b",
        hf_id="meta-llama/Llama-3.1-8B-Instruct",
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=131072,
        bos_token_id=128000,
    ),
    "qwen2.5-7b": ModelPreset(
        name="qwen2.5-7b",
        hf_id="Qwen/Qwen2.5-7B-Instruct",
        num_layers=28,
        hidden_size=3584,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=18944,
        vocab_size=152064,
        max_position_embeddings=32768,
        bos_token_id=None,  # Qwen2 tokenizers add no BOS token
    ),
    # servelab's shared tiny model (servelab.deploy.tiny_model.SHARED_SPEC, served as
    # servelab/tiny-llama3-2x64-hd32): the Llama-3 vocabulary on 2 layers of width 64, in float32.
    "tiny-llama3-2x64-hd32": ModelPreset(
        name="tiny-llama3-2x64-hd32",
        hf_id="servelab/tiny-llama3-2x64-hd32",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=128,
        vocab_size=128256,
        max_position_embeddings=8192,
        bos_token_id=128000,
        dtype_bytes=4,
    ),
}


def gpu_preset(name: str) -> GpuPreset:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(
            f"gpu.name: unknown GPU preset {name!r} (known: {', '.join(GPUS)})"
        ) from None


def model_preset(name: str) -> ModelPreset:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(
            f"model.preset: unknown model preset {name!r} (known: {', '.join(MODELS)})"
        ) from None
