"""Which simulated model imitates which engine: the simulator's side of the engine registry.

Each entry names the stepping model (an `EngineModel`), how the engine derives its KV capacity at
start-up (`sim.memory`) and the engine-specific parameters its model runs with. The engine's facts
(flags, resolution, start-up log, /metrics names) stay in `servelab.engines`; an engine the
simulator does not imitate simply has no entry here (docs/architecture.md, "Engine registry").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from servelab.engines.base import ResolvedConfig
from servelab.engines.llamacpp import server_settings
from servelab.engines.resolve import runtime_limits
from servelab.sim.base import EngineModel
from servelab.sim.cost import CostModel
from servelab.sim.llamacpp import LlamacppModel
from servelab.sim.memory import (
    VLLM_CPU_DEFAULT_KV_BYTES,
    KvCapacity,
    sglang_kv_capacity,
    vllm_cpu_kv_capacity,
    vllm_kv_capacity,
)
from servelab.sim.params import EngineParams
from servelab.sim.presets import GpuPreset, ModelPreset
from servelab.sim.sglang import SglangModel
from servelab.sim.vllm import VllmModel

__all__ = ["SimulatedEngine", "engine_params", "simulated_engine", "simulated_engines"]


@dataclass(frozen=True)
class SimulatedEngine:
    """A simulated engine. `model` is built as `model(params, preset, cost, track_emitted=...)`;
    `kv_capacity(resolved, preset, gpu, gpu_memory_mib)` is what the engine reports at start-up;
    `params(resolved)` gives the EngineParams fields only this engine sets."""

    engine: str
    model: Callable[..., EngineModel]
    kv_capacity: Callable[[ResolvedConfig, ModelPreset, GpuPreset, int], KvCapacity]
    params: Callable[[ResolvedConfig], Mapping[str, Any]]


def _vllm_capacity(
    resolved: ResolvedConfig, model: ModelPreset, gpu: GpuPreset, gpu_memory_mib: int
) -> KvCapacity:
    assert resolved.max_num_seqs is not None and resolved.block_size is not None
    if gpu.name == "CPU":
        flagged = [f for f in resolved.flags if f.startswith("--kv-cache-memory-bytes=")]
        kv_bytes = int(flagged[-1].split("=", 1)[1]) if flagged else VLLM_CPU_DEFAULT_KV_BYTES
        return vllm_cpu_kv_capacity(
            model, kv_cache_bytes=kv_bytes, block_size=int(resolved.block_size)
        )
    assert resolved.memory_fraction is not None  # vLLM always resolves gpu_memory_utilization
    return vllm_kv_capacity(
        model,
        gpu,
        gpu_memory_utilization=resolved.memory_fraction,
        max_num_batched_tokens=resolved.token_budget,
        max_num_seqs=resolved.max_num_seqs,
        block_size=resolved.block_size,
        gpu_memory_mib=gpu_memory_mib,
    )


def _vllm_params(resolved: ResolvedConfig) -> dict[str, Any]:
    assert resolved.block_size is not None
    return {
        "block_size": int(resolved.block_size),
        # model_runner.py: CUDA graphs for batch sizes up to 256, contexts up to 8192
        "cuda_graph_max_bs": 256,
        "max_seq_len_to_capture": min(8192, int(resolved.context_len)),
        "overlap_schedule": False,
    }


def _sglang_capacity(
    resolved: ResolvedConfig, model: ModelPreset, gpu: GpuPreset, gpu_memory_mib: int
) -> KvCapacity:
    assert resolved.memory_fraction is not None  # SGLang always resolves mem_fraction_static
    return sglang_kv_capacity(
        model, gpu, mem_fraction_static=resolved.memory_fraction, gpu_memory_mib=gpu_memory_mib
    )


def _sglang_params(resolved: ResolvedConfig) -> dict[str, Any]:
    assert resolved.cuda_graph_max_bs is not None
    return {
        "block_size": 1,
        "cuda_graph_max_bs": int(resolved.cuda_graph_max_bs),
        "max_seq_len_to_capture": int(resolved.context_len),
        "overlap_schedule": bool(resolved.overlap_schedule),
    }


def _vllm_v1_params(resolved: ResolvedConfig) -> dict[str, Any]:
    """V1 on V0's stepping model (docs/simulator.md "Current releases"): its unified token budget
    is V0's chunked-prefill budget; CUDA graphs up to the resolved capture size, for any context
    (V1's piecewise graphs leave attention outside the graph). On the CPU it captures none."""
    assert resolved.block_size is not None
    return {
        "block_size": int(resolved.block_size),
        "cuda_graph_max_bs": int(resolved.cuda_graph_max_bs or 0),
        "max_seq_len_to_capture": int(resolved.context_len),
        "overlap_schedule": False,
    }


def _llamacpp_capacity(
    resolved: ResolvedConfig, model: ModelPreset, gpu: GpuPreset, gpu_memory_mib: int
) -> KvCapacity:
    """llama-server allocates its n_ctx KV cells at start-up, f16 K and V (llama.cpp 0c1e570
    (vendored in llama-cpp-python 0.3.36), src/llama-context.cpp, llama_context::llama_context:
    "llama_kv_cache: size = ... (N cells, ...)"; common/common.h, cache_type_k/v = F16); no
    activation reserve comes out of it. The budget is the host memory."""
    assert resolved.max_total_tokens is not None
    cells = int(resolved.max_total_tokens)
    kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
    return KvCapacity(
        engine="llamacpp",
        tokens=cells,
        blocks=None,
        block_size=1,
        weights_gib=model.weight_bytes / 2**30,
        activation_gib=0.0,
        budget_gib=gpu_memory_mib / 1024,
        kv_gib=cells * kv_bytes / 2**30,
    )


def _llamacpp_params(resolved: ResolvedConfig) -> dict[str, Any]:
    """One-token cells, no CUDA graphs, no overlap; the micro-batch, the slot-similarity
    threshold, the KV layout, the prompt cache's limit and the HTTP pool's fixed threads
    (engines.llamacpp.server_settings)."""
    st = server_settings(resolved)
    return {
        "block_size": 1,
        "cuda_graph_max_bs": 0,
        "max_seq_len_to_capture": int(resolved.context_len),
        "overlap_schedule": False,
        "ubatch_size": st.n_ubatch,
        "slot_prompt_similarity": st.slot_prompt_similarity,
        "kv_unified": st.kv_unified,
        "cache_ram_mib": st.cache_ram_mib,
        "http_threads": st.http_threads,
    }


_SIMULATED: dict[str, SimulatedEngine] = {
    "vllm": SimulatedEngine("vllm", VllmModel, _vllm_capacity, _vllm_params),
    "sglang": SimulatedEngine("sglang", SglangModel, _sglang_capacity, _sglang_params),
    # The current release families on the models of the study's (docs/simulator.md).
    "vllm_v1": SimulatedEngine("vllm_v1", VllmModel, _vllm_capacity, _vllm_v1_params),
    "sglang_v05": SimulatedEngine("sglang_v05", SglangModel, _sglang_capacity, _sglang_params),
    "llamacpp": SimulatedEngine("llamacpp", LlamacppModel, _llamacpp_capacity, _llamacpp_params),
}


def simulated_engines() -> tuple[str, ...]:
    """The engines the simulator imitates."""
    return tuple(_SIMULATED)


def simulated_engine(engine: str) -> SimulatedEngine:
    try:
        return _SIMULATED[engine]
    except KeyError:
        raise ValueError(
            f"engine {engine!r} has no simulated model: the simulator imitates "
            f"{', '.join(_SIMULATED)}"
        ) from None


def engine_params(resolved: ResolvedConfig, *, kv_capacity_tokens: int) -> EngineParams:
    """The parameters `resolved`'s simulated model runs with, once its KV pool holds
    `kv_capacity_tokens`."""
    limits = runtime_limits(resolved, kv_capacity_tokens=kv_capacity_tokens)
    return EngineParams(
        engine=resolved.engine,
        chunked_prefill=bool(resolved.chunked_prefill),
        chunk_size=resolved.chunk_size,
        token_budget=int(resolved.token_budget),
        prefix_caching=bool(resolved.prefix_caching),
        context_len=int(resolved.context_len),
        max_running=int(limits.max_running_requests),
        kv_capacity_tokens=int(limits.kv_capacity_tokens),
        prompt_limit=int(limits.prompt_limit),
        schedule_policy=str(resolved.schedule_policy),
        **simulated_engine(resolved.engine).params(resolved),
    )


def build_model(
    params: EngineParams,
    preset: ModelPreset,
    cost: CostModel,
    *,
    track_emitted: bool = True,
) -> EngineModel:
    """The stepping model of `params.engine`."""
    return simulated_engine(params.engine).model(params, preset, cost, track_emitted=track_emitted)
