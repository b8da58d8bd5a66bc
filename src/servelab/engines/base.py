"""The types every engine's facts are expressed in: parsed flags, the resolved configuration, the
limits an engine derives at start-up, and what a start-up log shows. Engine-neutral: each engine's
module (`servelab.engines.vllm`, `servelab.engines.sglang`, ...) fills them by its own rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CONFIG_FIELDS",
    "EngineFlags",
    "FlagError",
    "ParsedLog",
    "ResolutionError",
    "ResolvedConfig",
    "RuntimeLimits",
    "UnknownEngine",
    "UnknownEngineLog",
    "model_len",
]


class UnknownEngine(ValueError):
    """An engine name no registry entry has. The message lists the registered engines."""


class FlagError(ValueError):
    """A flag the engine knows has a value the engine rejects. The message names the flag."""


@dataclass(frozen=True)
class EngineFlags:
    """One engine's parsed command line.

    `args` holds every destination of the engine's parser in the parser's own order (the order of
    vLLM's `args: Namespace(...)` log line), defaults included; `given` names the destinations set
    explicitly on the command line; `unknown` keeps the tokens the engine's parser does not know.
    """

    engine: str
    flags: tuple[str, ...]
    args: Mapping[str, Any]
    given: frozenset[str]
    unknown: tuple[str, ...]

    def __getitem__(self, dest: str) -> Any:
        return self.args[dest]

    def is_given(self, dest: str) -> bool:
        return dest in self.given


class ResolutionError(ValueError):
    """The engine would refuse this configuration at start-up. The message names the flag."""


@dataclass(frozen=True)
class ResolvedConfig:
    """The configuration an engine resolves from its flags (see the module docstring for rules).

    `chunk_size` is vLLM's max_num_batched_tokens when chunking and None when not, and SGLang's
    chunked_prefill_size (None when disabled). `token_budget` is vLLM's max_num_batched_tokens
    (always) and SGLang's max_prefill_tokens. `memory_fraction` is vLLM's gpu_memory_utilization or
    SGLang's mem_fraction_static. Fields an engine does not have are None; `max_running_requests`
    is None when SGLang resolves it at run time. `chunked_prefill_rule` says how chunking was
    decided: "flag", "32k-rule" (vLLM), "gpu-memory-rule" (SGLang).
    """

    engine: str
    version: str
    printed_version: str | None
    model: str
    served_model_name: str
    dtype: str
    tensor_parallel_size: int
    gpu_memory_mib: int
    chunked_prefill: bool
    chunked_prefill_rule: str
    chunk_size: int | None
    token_budget: int
    prefix_caching: bool
    context_len: int
    schedule_policy: str
    max_num_seqs: int | None
    max_running_requests: int | None
    max_total_tokens: int | None
    block_size: int | None
    memory_fraction: float | None
    cuda_graph_max_bs: int | None
    overlap_schedule: bool | None
    flags: tuple[str, ...]
    # Setting -> the rule that set it ("flag", or the default rule's name); what
    # results/defaults_diff.csv reports. Not part of the configuration itself (not in to_dict).
    rules: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, keys sorted."""
        raw = asdict(self)
        raw.pop("rules")
        raw["flags"] = list(self.flags)
        return {k: raw[k] for k in sorted(raw)}

    def as_run_config(self) -> dict[str, Any]:
        """The resolved configuration recorded in run.json (docs/architecture.md: at least
        chunked_prefill and chunk_size), keys sorted."""
        keep = (
            "engine",
            "version",
            "chunked_prefill",
            "chunk_size",
            "token_budget",
            "prefix_caching",
            "context_len",
            "schedule_policy",
            "max_num_seqs",
            "max_running_requests",
            "block_size",
            "memory_fraction",
            "cuda_graph_max_bs",
        )
        return {k: getattr(self, k) for k in sorted(keep)}


@dataclass(frozen=True)
class RuntimeLimits:
    """Limits an engine derives at start-up from its KV-cache capacity (not from flags alone).

    vLLM: `num_gpu_blocks` = capacity // block_size; `kv_capacity_tokens` = blocks * block_size;
    `max_running_requests` = max_num_seqs; `prompt_limit` = max_model_len with chunking, else
    min(max_model_len, max_num_batched_tokens) (scheduler.py::_get_prompt_limit).
    SGLang (tp_worker.py, model_runner.py): `kv_capacity_tokens` = max_total_num_tokens (capped by
    --max-total-tokens); req_to_token pool = max_num_reqs + 1 with max_num_reqs =
    min(max(int(T / context_len * 512), 2048), 4096) unless --max-running-requests;
    `max_running_requests` = min(T // 2 or the flag, pool size); `prompt_limit` =
    max_req_input_len = min(context_len - 1, T - 1) - 5 (longer prompts are truncated).
    """

    kv_capacity_tokens: int
    num_gpu_blocks: int | None
    max_running_requests: int
    prompt_limit: int
    max_concurrency: float | None


def model_len(value: int | None, derived: int, flag: str) -> int:
    """The context length an engine uses: its flag's `value`, else the model's `derived` length
    (config.json's max_position_embeddings); a longer flag is refused, as both engines do."""
    if value is None:
        return derived
    if value <= 0:
        raise ResolutionError(f"{flag}={value}: must be a positive number of tokens")
    if value > derived:
        raise ResolutionError(
            f"{flag}={value} is greater than the model's max_position_embeddings ({derived}); "
            "the engine refuses it unless its override environment variable is set"
        )
    return value


CONFIG_FIELDS = (
    "version",
    "chunked_prefill",
    "chunk_size",
    "prefix_caching",
    "context_len",
    "schedule_policy",
)


class UnknownEngineLog(ValueError):
    """The text is not a start-up log of the engine(s) looked for."""


@dataclass(frozen=True)
class ParsedLog:
    """What a start-up log shows. Every configuration value is None when the log does not show it.

    `evidence[name]` is the exact log line (as in the file) that a value came from and
    `evidence_lines[name]` its 1-based line number; `notes[name]` says how a value was read when
    the reading is not direct (implicit, a configured value, the engine's fallback, conflicts).
    `facts` holds other values the log shows (KV blocks, token pool, memory fraction, ...).
    `ready` says whether the log shows the engine ready to serve; `failure` is the first line that
    shows a failed start-up (an exception, an ERROR record, CUDA OOM) before it became ready.
    """

    engine: str
    version: str | None = None
    chunked_prefill: bool | None = None
    chunk_size: int | None = None
    prefix_caching: bool | None = None
    context_len: int | None = None
    schedule_policy: str | None = None
    evidence: Mapping[str, str] = field(default_factory=dict)
    evidence_lines: Mapping[str, int] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    facts: Mapping[str, Any] = field(default_factory=dict)
    ready: bool = False
    failure: str | None = None
    # The candidate release families when the log cannot tell them apart and every one reads it
    # the same way (`parse_startup_log(..., family_open=True)`; `engine` is then the product).
    open_families: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine}
        for name in CONFIG_FIELDS:
            out[name] = getattr(self, name)
        out["evidence"] = dict(sorted(self.evidence.items()))
        out["evidence_lines"] = dict(sorted(self.evidence_lines.items()))
        out["notes"] = dict(sorted(self.notes.items()))
        out["facts"] = dict(sorted(self.facts.items()))
        out["ready"] = self.ready
        out["failure"] = self.failure
        if self.open_families:  # only then: every other reading's dict is unchanged
            out["open_families"] = list(self.open_families)
        return dict(sorted(out.items()))

    def to_json(self) -> str:
        """One JSON object, keys sorted."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2, ensure_ascii=False)
