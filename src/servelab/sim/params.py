"""The engine parameters a simulated engine runs with, taken from the engine's resolved configuration
(built by `sim.models.engine_params`)."""

from __future__ import annotations

from dataclasses import dataclass

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
    # llama.cpp (sim.llamacpp): n_ubatch, the micro-batch llama_decode splits a batch into (None:
    # the token budget, n_batch); --slot-prompt-similarity; whether the slots share one KV stream
    # (kv_unified: then the KV capacity is shared and micro-batches are plain n_ubatch-token cuts);
    # the host-memory prompt cache's limit in MiB (--cache-ram: -1 no limit, 0 disabled); the
    # HTTP pool's fixed threads (0: no pool modelled, every request has a thread at once)
    ubatch_size: int | None = None
    slot_prompt_similarity: float = 0.1
    kv_unified: bool = True
    cache_ram_mib: int = 8192
    http_threads: int = 0

    def __post_init__(self) -> None:
        if self.kv_capacity_tokens <= 0:
            raise ValueError(f"kv_capacity_tokens={self.kv_capacity_tokens}: must be positive")
        if self.chunked_prefill and not self.chunk_size:
            raise ValueError("chunk_size: required when chunked_prefill is on")
