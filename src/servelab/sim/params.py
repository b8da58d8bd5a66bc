"""The engine parameters a simulated engine runs with, taken from the engine's resolved configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EngineParams"]


@dataclass(frozen=True)
class EngineParams:
    """What a scheduler model needs: resolved configuration plus start-up limits (KV capacity).

    `max_running` is vLLM's max_num_seqs or SGLang's max_running_requests; `token_budget` is vLLM's
    max_num_batched_tokens and SGLang's max_prefill_tokens; `chunk_size` is None when prefill is not
    chunked; `prompt_limit` is the longest prompt the engine accepts (vLLM ignores longer ones,
    SGLang truncates them).
    """

    engine: str
    chunked_prefill: bool
    chunk_size: int | None
    token_budget: int
    prefix_caching: bool
    context_len: int
    max_running: int
    kv_capacity_tokens: int
    prompt_limit: int
    schedule_policy: str = "fcfs"
    block_size: int = 16
    watermark: float = 0.01  # vLLM BlockSpaceManagerV2 admission watermark
    max_seq_len_to_capture: int = 8192  # vLLM: decode with a longer context runs eagerly
    cuda_graph_max_bs: int = 256  # largest decode batch replayed from a CUDA graph
    overlap_schedule: bool = True  # SGLang

    def __post_init__(self) -> None:
        if self.engine not in ("vllm", "sglang"):
            raise ValueError(f"engine: unknown engine {self.engine!r}")
        if self.kv_capacity_tokens <= 0:
            raise ValueError(f"kv_capacity_tokens={self.kv_capacity_tokens}: must be positive")
        if self.chunked_prefill and not self.chunk_size:
            raise ValueError("chunk_size: required when chunked_prefill is on")

    @classmethod
    def from_resolved(cls, resolved: Any, *, kv_capacity_tokens: int) -> EngineParams:
        """Build from a `servelab.engines.ResolvedConfig` and the KV capacity the engine derived."""
        from servelab.engines.resolve import runtime_limits

        limits = runtime_limits(resolved, kv_capacity_tokens=kv_capacity_tokens)
        common = dict(
            chunked_prefill=bool(resolved.chunked_prefill),
            chunk_size=resolved.chunk_size,
            token_budget=int(resolved.token_budget),
            prefix_caching=bool(resolved.prefix_caching),
            context_len=int(resolved.context_len),
            max_running=int(limits.max_running_requests),
            kv_capacity_tokens=int(limits.kv_capacity_tokens),
            prompt_limit=int(limits.prompt_limit),
            schedule_policy=str(resolved.schedule_policy),
        )
        if resolved.engine == "vllm":
            return cls(
                engine="vllm",
                **common,
                block_size=int(resolved.block_size),
                # model_runner.py: CUDA graphs for batch sizes up to 256, contexts up to 8192
                cuda_graph_max_bs=256,
                max_seq_len_to_capture=min(8192, int(resolved.context_len)),
                overlap_schedule=False,
            )
        return cls(
            engine="sglang",
            **common,
            block_size=1,
            cuda_graph_max_bs=int(resolved.cuda_graph_max_bs),
            max_seq_len_to_capture=int(resolved.context_len),
            overlap_schedule=bool(resolved.overlap_schedule),
        )
