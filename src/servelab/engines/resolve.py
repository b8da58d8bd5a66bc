"""What configuration an engine resolves from its flags, by the engine's OWN rules.

vLLM 0.6.3 (research/engines.md A1; `vllm/engine/arg_utils.py::create_engine_config`,
`vllm/config.py::SchedulerConfig`):
- chunked prefill, when not flagged, is on iff max_model_len > 32768 on a CUDA device (and no
  speculative model, LoRA or prompt adapter), else off. The GPU model and memory do not matter.
- max_num_batched_tokens, when not flagged: 512 when chunking (single-step scheduling),
  max(max_model_len, 2048) otherwise. `_verify_args` refuses a budget below max_model_len without
  chunking and a budget below max_num_seqs.
- max_num_seqs 256, block_size 16, gpu_memory_utilization 0.90 (must be <= 1.0), prefix caching off
  unless `--enable-prefix-caching`, scheduling policy fcfs. max_model_len from the flag, else the
  model's max_position_embeddings (a larger flag is refused).

SGLang 0.4.1 (research/engines.md B1; `sglang/srt/server_args.py::ServerArgs.__post_init__`,
`managers/scheduler.py`, `schedule_policy.py`):
- chunked_prefill_size, when not flagged: 2048 if the GPU has < 25,000 MiB (nvidia-smi's
  memory.total), else 8192; a value <= 0 disables chunking. `--enable-dp-attention` halves it.
- mem_fraction_static by tensor-parallel size (0.88 at tp 1); cuda_graph_max_bs 8 (< 25,000 MiB
  and tp < 4), 80 (< 25,000 MiB, tp >= 4), else 160.
- schedule_policy lpm; the radix cache on unless `--disable-radix-cache`, and then lpm and
  dfs-weight fall back to fcfs. max_prefill_tokens 16384. Overlap scheduler on unless disabled.
- context length from `--context-length`, else the model's max_position_embeddings (larger refused).
- max_running_requests, unless flagged, is resolved at run time from the KV pool size
  (`runtime_limits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from servelab.engines.flags import ENGINE_NAMES, EngineFlags, parse_flags

__all__ = [
    "DEFAULT_VERSIONS",
    "PRINTED_VERSIONS",
    "ResolutionError",
    "ResolvedConfig",
    "RuntimeLimits",
    "resolve",
    "runtime_limits",
]

# The releases whose rules this module implements (the study's, Appendix A).
DEFAULT_VERSIONS = {"vllm": "0.6.3", "sglang": "0.4.1"}
# What each release prints as its version in the start-up log. The vLLM 0.6.3 wheel ships no
# `vllm/_version.py`, so `vllm/version.py` falls back to "dev" (engines.md A2; vllm issue #9421).
# SGLang 0.4.1 prints no version in its start-up log.
PRINTED_VERSIONS: dict[str, str | None] = {"vllm": "dev", "sglang": None}

VLLM_LONG_CONTEXT = 32768  # arg_utils.py: use_long_context = max_model_len > 32768
SGLANG_SMALL_GPU_MIB = 25_000  # server_args.py: gpu_mem < 25_000


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
    memory_fraction: float
    cuda_graph_max_bs: int | None
    overlap_schedule: bool | None
    flags: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, keys sorted."""
        raw = asdict(self)
        raw["flags"] = list(self.flags)
        return {k: raw[k] for k in sorted(raw)}

    def as_run_config(self) -> dict[str, Any]:
        """The resolved configuration recorded in run.json (DESIGN.md: at least chunked_prefill and
        chunk_size), keys sorted."""
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

    def parsed_flags(self) -> EngineFlags:
        """The engine's full parsed command line (used to render its start-up log)."""
        return parse_flags(self.engine, self.flags)


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


def _model_len(value: int | None, derived: int, flag: str) -> int:
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


def _resolve_vllm(
    f: EngineFlags, *, gpu_memory_mib: int, max_pos: int, version: str
) -> ResolvedConfig:
    a = f.args
    max_model_len = _model_len(a["max_model_len"], max_pos, "--max-model-len")
    is_gpu = a["device"] in ("auto", "cuda")
    if a["enable_chunked_prefill"] is None:
        long_ok = (
            max_model_len > VLLM_LONG_CONTEXT
            and is_gpu
            and a["speculative_model"] is None
            and not a["enable_lora"]
            and not a["enable_prompt_adapter"]
        )
        chunked, rule = bool(long_ok), "32k-rule"
    else:
        chunked, rule = bool(a["enable_chunked_prefill"]), "flag"
    budget = a["max_num_batched_tokens"]
    if budget is None:
        budget = 512 if chunked and a["num_scheduler_steps"] == 1 else max(max_model_len, 2048)
    if budget <= 0:
        raise ResolutionError(f"--max-num-batched-tokens={budget}: must be positive")
    if not chunked and budget < max_model_len:
        raise ResolutionError(
            f"--max-num-batched-tokens: max_num_batched_tokens ({budget}) is smaller than "
            f"max_model_len ({max_model_len}) with chunked prefill off; vLLM's "
            "SchedulerConfig._verify_args refuses this"
        )
    if budget < a["max_num_seqs"]:
        raise ResolutionError(
            f"--max-num-batched-tokens: max_num_batched_tokens ({budget}) must be greater than "
            f"or equal to max_num_seqs ({a['max_num_seqs']}) (SchedulerConfig._verify_args)"
        )
    if a["num_scheduler_steps"] < 1:
        raise ResolutionError(f"--num-scheduler-steps={a['num_scheduler_steps']}: must be >= 1")
    util = float(a["gpu_memory_utilization"])
    if util > 1.0:
        raise ResolutionError(
            f"--gpu-memory-utilization={util}: GPU memory utilization must be less than 1.0"
        )
    block_size = int(a["block_size"])
    if chunked and a["enable_prefix_caching"] and budget % block_size:
        raise ResolutionError(
            f"--max-num-batched-tokens={budget}: with chunked prefill and prefix caching the "
            f"chunk size must be divisible by the block size ({block_size}); vLLM 0.6.3 raises "
            "this at the first chunked prefill (scheduler.py::_get_num_new_tokens)"
        )
    served = a["served_model_name"]
    return ResolvedConfig(
        engine="vllm",
        version=version,
        printed_version=PRINTED_VERSIONS["vllm"],
        model=a["model"],
        served_model_name=served[0] if served else a["model"],
        dtype=a["dtype"],
        tensor_parallel_size=int(a["tensor_parallel_size"]),
        gpu_memory_mib=gpu_memory_mib,
        chunked_prefill=chunked,
        chunked_prefill_rule=rule,
        chunk_size=budget if chunked else None,
        token_budget=budget,
        prefix_caching=bool(a["enable_prefix_caching"]),
        context_len=max_model_len,
        schedule_policy=a["scheduling_policy"],
        max_num_seqs=int(a["max_num_seqs"]),
        max_running_requests=None,
        max_total_tokens=None,
        block_size=block_size,
        memory_fraction=util,
        cuda_graph_max_bs=None,
        overlap_schedule=None,
        flags=f.flags,
    )


def _sglang_mem_fraction(tp: int) -> float:
    if tp >= 16:
        return 0.79
    if tp >= 8:
        return 0.81
    if tp >= 4:
        return 0.85
    if tp >= 2:
        return 0.87
    return 0.88


def _resolve_sglang(
    f: EngineFlags, *, gpu_memory_mib: int, max_pos: int, version: str
) -> ResolvedConfig:
    a = f.args
    tp = int(a["tensor_parallel_size"])
    if tp < 1:
        raise ResolutionError(f"--tp-size={tp}: must be >= 1")
    small_gpu = gpu_memory_mib < SGLANG_SMALL_GPU_MIB
    frac = a["mem_fraction_static"]
    frac = _sglang_mem_fraction(tp) if frac is None else float(frac)
    if not 0.0 < frac < 1.0:
        raise ResolutionError(f"--mem-fraction-static={frac}: must be between 0 and 1")
    size = a["chunked_prefill_size"]
    if size is None:
        size, rule = (2048 if small_gpu else 8192), "gpu-memory-rule"
    else:
        rule = "flag"
    overlap = not a["disable_overlap_schedule"]
    if a["enable_dp_attention"]:
        size, overlap = size // 2, False
    chunked = size > 0  # scheduler.py: "-1 means disable"
    graph_bs = a["cuda_graph_max_bs"]
    if graph_bs is None:
        graph_bs = (8 if tp < 4 else 80) if small_gpu else 160
    context_len = _model_len(a["context_length"], max_pos, "--context-length")
    prefix = not a["disable_radix_cache"]
    policy = a["schedule_policy"]
    if not prefix and policy in ("lpm", "dfs-weight"):
        policy = "fcfs"  # schedule_policy.py: the radix cache is disabled => FCFS
    for dest, flag in (
        ("max_prefill_tokens", "--max-prefill-tokens"),
        ("max_running_requests", "--max-running-requests"),
        ("max_total_tokens", "--max-total-tokens"),
    ):
        if a[dest] is not None and a[dest] <= 0:
            raise ResolutionError(f"{flag}={a[dest]}: must be positive")
    return ResolvedConfig(
        engine="sglang",
        version=version,
        printed_version=PRINTED_VERSIONS["sglang"],
        model=a["model_path"],
        served_model_name=a["served_model_name"] or a["model_path"],
        dtype=a["dtype"],
        tensor_parallel_size=tp,
        gpu_memory_mib=gpu_memory_mib,
        chunked_prefill=chunked,
        chunked_prefill_rule=rule,
        chunk_size=size if chunked else None,
        token_budget=int(a["max_prefill_tokens"]),
        prefix_caching=prefix,
        context_len=context_len,
        schedule_policy=policy,
        max_num_seqs=None,
        max_running_requests=a["max_running_requests"],
        max_total_tokens=a["max_total_tokens"],
        block_size=None,
        memory_fraction=frac,
        cuda_graph_max_bs=int(graph_bs),
        overlap_schedule=overlap,
        flags=f.flags,
    )


def resolve(
    engine: str,
    flags: Sequence[str],
    *,
    gpu_memory_mib: int,
    model_max_position_embeddings: int = 131072,
    version: str | None = None,
) -> ResolvedConfig:
    """Resolve `engine`'s configuration from its command-line `flags` by the engine's own rules.

    `gpu_memory_mib` is what nvidia-smi reports as memory.total (an L4: 23034); only SGLang's rules
    use it. `model_max_position_embeddings` stands in for the model's config.json (Llama-3.1-8B:
    131072). `version` must be the release whose rules are implemented (default: the study's).
    Raises ResolutionError (or FlagError for a malformed flag), both ValueErrors naming the flag.
    """
    if engine not in ENGINE_NAMES:
        raise ResolutionError(
            f"unknown engine {engine!r}: expected one of {', '.join(ENGINE_NAMES)}"
        )
    version = DEFAULT_VERSIONS[engine] if version is None else str(version)
    if version != DEFAULT_VERSIONS[engine]:
        raise ResolutionError(
            f"{engine} version {version}: servelab implements the resolution rules of "
            f"{engine} {DEFAULT_VERSIONS[engine]} only"
        )
    if int(gpu_memory_mib) <= 0:
        raise ResolutionError(f"gpu_memory_mib={gpu_memory_mib}: must be positive")
    if int(model_max_position_embeddings) <= 0:
        raise ResolutionError(
            f"model_max_position_embeddings={model_max_position_embeddings}: must be positive"
        )
    parsed = parse_flags(engine, flags)
    impl = _resolve_vllm if engine == "vllm" else _resolve_sglang
    return impl(
        parsed,
        gpu_memory_mib=int(gpu_memory_mib),
        max_pos=int(model_max_position_embeddings),
        version=version,
    )


def runtime_limits(resolved: ResolvedConfig, *, kv_capacity_tokens: int) -> RuntimeLimits:
    """The limits the engine derives at start-up once its KV pool holds `kv_capacity_tokens`."""
    if kv_capacity_tokens <= 0:
        raise ResolutionError(f"kv_capacity_tokens={kv_capacity_tokens}: must be positive")
    ctx = resolved.context_len
    if resolved.engine == "vllm":
        assert resolved.block_size is not None and resolved.max_num_seqs is not None
        blocks = kv_capacity_tokens // resolved.block_size
        if blocks <= 0:
            raise ResolutionError(
                f"kv_capacity_tokens={kv_capacity_tokens}: less than one "
                f"{resolved.block_size}-token block"
            )
        limit = ctx if resolved.chunked_prefill else min(ctx, resolved.token_budget)
        return RuntimeLimits(
            kv_capacity_tokens=blocks * resolved.block_size,
            num_gpu_blocks=blocks,
            max_running_requests=resolved.max_num_seqs,
            prompt_limit=limit,
            max_concurrency=blocks * resolved.block_size / ctx,
        )
    total = kv_capacity_tokens
    if resolved.max_total_tokens is not None:
        total = min(total, resolved.max_total_tokens)
    max_num_reqs = resolved.max_running_requests
    if max_num_reqs is None:
        max_num_reqs = min(max(int(total / ctx * 512), 2048), 4096)
    pool = max_num_reqs + 1
    wanted = total // 2 if resolved.max_running_requests is None else resolved.max_running_requests
    max_req_len = min(ctx - 1, total - 1)
    if max_req_len - 5 <= 0:
        raise ResolutionError(
            f"kv_capacity_tokens={kv_capacity_tokens}: memory pool size is too small"
        )
    return RuntimeLimits(
        kv_capacity_tokens=total,
        num_gpu_blocks=None,
        max_running_requests=min(wanted, pool),
        prompt_limit=max_req_len - 5,
        max_concurrency=None,
    )
