"""vLLM 0.6.3 (the V0 engine): its flags, resolution rules, start-up log and /metrics names.

Every rule cites its upstream source at v0.6.3; docs/engines.md has the full list.

Resolution (`vllm/engine/arg_utils.py::EngineArgs.create_engine_config`,
`vllm/config.py::SchedulerConfig`):
- chunked prefill, when not flagged, is on iff max_model_len > 32768 on a CUDA device (and no
  speculative model, LoRA or prompt adapter), else off. The GPU model and memory do not matter.
- max_num_batched_tokens, when not flagged: 512 when chunking (single-step scheduling),
  max(max_model_len, 2048) otherwise. `_verify_args` refuses a budget below max_model_len without
  chunking and a budget below max_num_seqs.
- max_num_seqs 256, block_size 16, gpu_memory_utilization 0.90 (must be <= 1.0), prefix caching off
  unless `--enable-prefix-caching`, scheduling policy fcfs. max_model_len from the flag, else the
  model's max_position_embeddings (a larger flag is refused).
- Run-time limits (`vllm/core/scheduler.py::Scheduler._get_prompt_limit`): num_gpu_blocks =
  capacity // block_size; max_running_requests = max_num_seqs; the prompt limit is max_model_len
  with chunking, else min(max_model_len, max_num_batched_tokens).

Start-up log (`vllm/logger.py` format `%(levelname)s %(asctime)s %(filename)s:%(lineno)d]`):
`version` from "vLLM API server version X" or the engine line's "(vX)" (any string: `dev`,
`0.6.1.dev238+ge2c6e0a82`, `999.999.999`); `chunked_prefill` from the engine line's
`chunked_prefill_enabled=` (0.6.3's missing comma before multi_step_stream_outputs and 0.6.6's field
order both handled), else "Chunked prefill is enabled with max_num_batched_tokens=N." or the ">32K"
warning (both mean on); when a COMPLETE engine line of a version without that field (0.6.2) is
present and neither line is, it is off: an implicit reading, marked in `notes`. `chunk_size` (only
when chunking is on) from "Chunked prefill is enabled with max_num_batched_tokens=N.", else from an
explicit `max_num_batched_tokens=N` in the args line. `prefix_caching` and `context_len`
(max_seq_len) from the engine line; context_len else from "Maximum concurrency for N tokens per
request". `schedule_policy` from the args line's `scheduling_policy` (vLLM 0.6.3 uses it verbatim).
Facts: `num_gpu_blocks` from "# GPU blocks: N" and `block_size` from the args line: the KV
capacity in tokens is their product (what the gate checks when an arm expects a capacity).
The args line's `None` values are configured, not resolved, and are never read. The 0.6.3 wheel
ships no `vllm/_version.py`, so `vllm/version.py` prints "dev" (vllm issue #9421).

/metrics (`vllm/engine/metrics.py::Metrics`, label `model_name`): see METRIC_MAP and METRICS.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict, TypeVar

from servelab.engines import _cli_tables
from servelab.engines.base import (
    EngineFlags,
    ResolutionError,
    ResolvedConfig,
    RuntimeLimits,
    model_len,
)
from servelab.engines.cmdline import parse_table
from servelab.engines.logtext import (
    BOOL,
    CUT,
    TORCH_DTYPES,
    LogLine,
    Reader,
    field,
    token,
    tqdm_shards,
)
from servelab.engines.spec import EngineSpec, LogFormat, OpenAIDialect

__all__ = ["SPEC"]

VERSION = "0.6.3"
# What 0.6.3 prints as its version (see the module docstring).
PRINTED_VERSION = "dev"
LONG_CONTEXT = 32768  # arg_utils.py: use_long_context = max_model_len > 32768


# ------------------------------------------------------------------------------------ flags


def normalise_flags(tokens: Sequence[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser: underscores in `--long_option` names become dashes."""
    out = []
    for tok in tokens:
        if tok.startswith("--"):
            key, sep, value = tok.partition("=")
            out.append("--" + key[2:].replace("_", "-") + sep + value)
        else:
            out.append(tok)
    return out


def _parsed(r: ResolvedConfig) -> EngineFlags:
    return parse_table("vllm", _cli_tables.VLLM_0_6_3, r.flags, normalise=normalise_flags)


# ------------------------------------------------------------------------------- resolution


def resolve(
    f: EngineFlags, *, gpu_memory_mib: int, max_pos: int, version: str, gpu_name: str = ""
) -> ResolvedConfig:
    a = f.args
    max_model_len = model_len(a["max_model_len"], max_pos, "--max-model-len")
    is_gpu = a["device"] in ("auto", "cuda")
    if a["enable_chunked_prefill"] is None:
        long_ok = (
            max_model_len > LONG_CONTEXT
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
        printed_version=PRINTED_VERSION,
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
        block_size=block_size,
        memory_fraction=util,
        cuda_graph_max_bs=None,
        **NOT_IN_VLLM,
        flags=f.flags,
        rules=_rules(f, rule),
    )


class NotInVllm(TypedDict):
    """The resolved fields only SGLang has: every vLLM family resolves them to None."""

    max_running_requests: None
    max_total_tokens: None
    overlap_schedule: None


NOT_IN_VLLM = NotInVllm(max_running_requests=None, max_total_tokens=None, overlap_schedule=None)


def _rules(f: EngineFlags, chunked_rule: str) -> dict[str, str]:
    """The rule behind each resolved setting (results/defaults_diff.csv; docs/engines.md)."""

    def given(dest: str, default: str) -> str:
        return "flag" if f.is_given(dest) else default

    budget = given("max_num_batched_tokens", "budget-rule")
    return {
        "chunked_prefill": chunked_rule,
        "chunk_size": budget,
        "token_budget": budget,
        "prefix_caching": given("enable_prefix_caching", "default"),
        "schedule_policy": given("scheduling_policy", "default"),
        "max_running_requests": given("max_num_seqs", "default"),
        "memory_fraction": given("gpu_memory_utilization", "default"),
        "context_len": given("max_model_len", "model-max-position"),
    }


def runtime_limits(resolved: ResolvedConfig, kv_capacity_tokens: int) -> RuntimeLimits:
    """The limits vLLM derives once its KV pool holds `kv_capacity_tokens` (module docstring)."""
    ctx = resolved.context_len
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


# ------------------------------------------------------------------------------ start-up log

RECORD = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? "
    # at DEBUG level V1 names the file by its path under vllm/ (engine/arg_utils.py)
    r"\[?(?P<src>[\w./-]+\.py):\d+\] (?P<msg>.*)$"
)
# Messages (the part after the logger prefix) that only vLLM's start-up prints, for both families
# in one table (servelab's); each family's MARKERS names the ones its releases print (V1's:
# servelab.engines.vllm_v1.MARKERS).
MARKER = {
    "engine": re.compile(r"Initializing an? (?:V\d )?LLM engine \(v[^\s()]*\) with config:"),
    "v1_engine": re.compile(r"Initializing a V1 LLM engine \(v[^\s()]*\) with config:"),
    "api_server_version": re.compile(r"vLLM API server version \S"),
    "server_version": re.compile(r"vLLM (?:API )?server version \S"),
    "chunked": re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=\d"),
    "blocks": re.compile(r"# (?:GPU|CPU) blocks: \d"),
    "args": re.compile(r"args: Namespace\(.*(?:max_num_batched_tokens|enable_chunked_prefill)="),
    "long_context": re.compile(
        r"Chunked prefill is enabled by default for models with max_model_len > 32K"
    ),
    "kv_cache_size": re.compile(r"(?:GPU|CPU|XPU) KV cache size: [\d,]+ tokens"),
    "non_default_args": re.compile(r"non-default args: \{"),
    "starting_server": re.compile(r"Starting vLLM (?:API )?server (?:\d+ )?on "),
}
MARKERS = tuple(
    MARKER[name]
    for name in ("engine", "api_server_version", "chunked", "blocks", "args", "long_context")
)
MARKER_WORDS = re.compile(
    r"LLM engine|server version|Chunked prefill is enabled| blocks: |Namespace\("
)
READY = re.compile(
    r"Uvicorn running on|Application startup complete\.|Graph capturing finished in|"
    r"init engine \(profile, create kv cache, warmup model\) took"
)

# The messages _parse_vllm reads (a cheap first test: most lines of a long log are none of them).
_VLLM_INTERESTING = re.compile(
    r"vLLM API server version |Initializing an? |Chunked prefill is enabled |args: Namespace\(|"
    r"# (?:GPU|CPU) blocks: |Maximum concurrency for |Loading model weights took "
)


def _is_true(value: str) -> bool:
    return value == "True"


S = TypeVar("S")

# (value, the engine line's config keys that show it, first found wins, pattern, conversion)
EngineField = tuple[str, tuple[str, ...], str, Callable[[str], Any]]
ENGINE_FIELDS: tuple[EngineField, ...] = (
    ("chunked_prefill", ("chunked_prefill_enabled",), BOOL, _is_true),
    ("prefix_caching", ("enable_prefix_caching",), BOOL, _is_true),
    ("context_len", ("max_seq_len",), r"\d+", int),
    ("tensor_parallel_size", ("tensor_parallel_size",), r"\d+", int),
)


def read_engine_fields(
    r: Reader, cfg: str, line: LogLine, fields: Sequence[EngineField] = ENGINE_FIELDS
) -> None:
    """Put each value the engine line's config shows, read under the first of its keys found."""
    for name, keys, pat, conv in fields:
        for key in keys:
            if f := field(cfg, key, pat):
                r.put(name, conv(f.group(1)), line)
                break


@dataclass
class _Seen:
    """The lines of a start-up log whose values `read_log` concludes after reading every line."""

    engine_line: LogLine | None = None
    engine_cfg: str = ""
    chunk_line: LogLine | None = None
    chunk_value: int | None = None
    auto_line: LogLine | None = None
    args_line: LogLine | None = None
    args_body: str = ""
    concurrency: tuple[LogLine, int] | None = None


def scan_log(
    lines: list[LogLine],
    seen: S,
    interesting: re.Pattern[str],
    read_line: Callable[[Reader, S, LogLine, str], None],
    conclude: Callable[[Reader, S], None],
    unprefixed: Callable[[Reader, LogLine], None] | None = None,
) -> Reader:
    """How both vLLM families read a start-up log (servelab's): `read_line` puts each
    `interesting` message's own values and keeps in `seen` the lines `conclude` then reads
    together; a line without a logger prefix goes to `unprefixed`, if given."""
    r = Reader()
    for line in lines:
        msg = line.msg
        if msg is None:
            if unprefixed is not None:
                unprefixed(r, line)
            continue
        if interesting.match(msg):
            read_line(r, seen, line, msg)
    conclude(r, seen)
    return r


def read_log(lines: list[LogLine]) -> Reader:
    """The values a vLLM V0 start-up log shows (`scan_log` with V0's lines)."""
    return scan_log(lines, _Seen(), _VLLM_INTERESTING, _read_line, _conclude)


def _read_line(r: Reader, seen: _Seen, line: LogLine, msg: str) -> None:
    """A V0 message's values, and the lines `_conclude` reads, into `seen`."""
    if m := re.match(r"vLLM API server version ([^\s\x00]+)$", msg):
        r.put("version", m.group(1), line)
    elif m := re.match(
        r"Initializing an? (?:V\d )?LLM engine \(v([^\s()]+)\) with config: (.*)$", msg
    ):
        r.put("version", m.group(1), line)
        seen.engine_line, seen.engine_cfg = line, m.group(2)
        read_engine_fields(r, seen.engine_cfg, line)
    elif m := re.match(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)\.", msg):
        seen.chunk_line, seen.chunk_value = line, int(m.group(1))
    elif msg.startswith("Chunked prefill is enabled by default for models with max_model_len"):
        seen.auto_line = line
    elif m := re.match(r"args: Namespace\((.*)$", msg):
        seen.args_line, seen.args_body = line, m.group(1)
    elif m := re.match(r"# GPU blocks: (\d+), # CPU blocks: (\d+)$", msg):
        r.put("num_gpu_blocks", int(m.group(1)), line)
        r.put("num_cpu_blocks", int(m.group(2)), line)
    elif m := re.match(r"# CPU blocks: (\d+)$", msg):
        r.put("num_cpu_blocks", int(m.group(1)), line)
    elif m := re.match(r"Maximum concurrency for (\d+) tokens per request: ([\d.]+)x$", msg):
        r.put("max_concurrency", float(m.group(2)), line)
        seen.concurrency = (line, int(m.group(1)))
    elif m := re.match(r"Loading model weights took ([\d.]+) GB$", msg):
        r.put("weights_gib", float(m.group(1)), line)


def _conclude(r: Reader, seen: _Seen) -> None:
    """The values that lines tell together, or that a missing line tells."""
    # chunked_prefill: the engine line's resolved flag, else the lines that only print when on.
    if not r.has("chunked_prefill"):
        if seen.chunk_line is not None:
            r.put("chunked_prefill", True, seen.chunk_line)
        elif seen.auto_line is not None:
            r.put("chunked_prefill", True, seen.auto_line)
        elif seen.engine_line is not None and _complete_engine_line(seen.engine_cfg):
            r.put(
                "chunked_prefill",
                False,
                seen.engine_line,
                "implicit: this version's engine line has no chunked_prefill_enabled field and "
                "the log has no 'Chunked prefill is enabled' line, which vLLM prints whenever "
                "chunked prefill is on",
            )
    args_line, args_body = seen.args_line, seen.args_body
    if r.values.get("chunked_prefill") is True:
        if seen.chunk_line is not None:
            r.put("chunk_size", seen.chunk_value, seen.chunk_line)
        elif args_line is not None and (f := field(args_body, "max_num_batched_tokens", r"\d+")):
            r.put(
                "chunk_size",
                int(f.group(1)),
                args_line,
                "configured explicitly in the args line; vLLM uses an explicit "
                "max_num_batched_tokens verbatim",
            )
    if not r.has("context_len") and seen.concurrency is not None:
        r.put("context_len", seen.concurrency[1], seen.concurrency[0])
    if args_line is not None and (f := field(args_body, "block_size", r"\d+")):
        # The KV block's tokens: `# GPU blocks` times it is the KV capacity in tokens
        # (vllm/engine/arg_utils.py::EngineArgs.block_size, 16 unless --block-size).
        r.put("block_size", int(f.group(1)), args_line)
    if args_line is not None and (f := field(args_body, "scheduling_policy", r"'[\w-]+'")):
        r.put(
            "schedule_policy",
            f.group(1).strip("'"),
            args_line,
            "from the args line: vLLM 0.6.3 schedules by this policy verbatim",
        )


def _complete_engine_line(cfg: str) -> bool:
    """True when the engine-config message ends with its own closing parenthesis.

    The message is `... with config: model=..., mm_processor_kwargs=None)`: outside quoted strings
    its parentheses are unbalanced by exactly the one final `)`. A line cut anywhere (including
    right after a nested `DecodingConfig(...)`) fails this test.
    """
    if CUT in cfg or not cfg.endswith(")"):
        return False
    depth, quote = 0, ""
    for ch in cfg:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
    return depth == -1 and not quote


# ----------------------------------------------------------------------------------- metrics

# Canonical telemetry name -> vLLM 0.6.3 sample name.
METRIC_MAP = {
    "kv_cache_usage": "vllm:gpu_cache_usage_perc",
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
    "preemptions_total": "vllm:num_preemptions_total",
    "prompt_tokens_total": "vllm:prompt_tokens_total",
    "generation_tokens_total": "vllm:generation_tokens_total",
    "prefix_cache_hit_rate": "vllm:gpu_prefix_cache_hit_rate",
}
# Every series vLLM 0.6.3 exports (metric family name -> type).
METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_swapped": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:cpu_cache_usage_perc": "gauge",
    "vllm:cpu_prefix_cache_hit_rate": "gauge",
    "vllm:gpu_prefix_cache_hit_rate": "gauge",
    "vllm:num_preemptions_total": "counter",
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:avg_prompt_throughput_toks_per_s": "gauge",
    "vllm:avg_generation_throughput_toks_per_s": "gauge",
    "vllm:cache_config_info": "gauge",
}


# ------------------------------------------------------------------ rendering its start-up log

# vLLM 0.6.3 api_server routes in registration order (FastAPI docs routes first; /metrics is a
# mount and is not listed).
ROUTES = (
    ("/openapi.json", "GET, HEAD"),
    ("/docs", "GET, HEAD"),
    ("/docs/oauth2-redirect", "GET, HEAD"),
    ("/redoc", "GET, HEAD"),
    ("/health", "GET"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    ("/v1/models", "GET"),
    ("/version", "GET"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/embeddings", "POST"),
)


def _vllm_namespace(args: dict[str, Any]) -> str:
    body = ", ".join(f"{dest}={args[dest]!r}" for _, dest, *_ in _cli_tables.VLLM_0_6_3)
    return f"Namespace({body})"


def render_startup_log(
    r: ResolvedConfig, kv_tokens: int, weights_gib: float, t0: datetime, kv_bytes: int
) -> list[str]:
    """vLLM 0.6.3's start-up log for `r`: the API server's `args: Namespace(...)`, the engine
    config line, the chunked-prefill lines of EngineArgs.create_engine_config, the GPU and CPU
    block counts (swap space over block bytes) and the readiness line, in the logging format of
    vllm/logger.py (`LEVEL MM-DD HH:MM:SS file:line] message`)."""
    parsed = _parsed(r)
    a = dict(parsed.args)
    limits = runtime_limits(r, kv_tokens)
    assert r.block_size is not None and limits.num_gpu_blocks is not None
    swap_bytes = float(a["swap_space"]) * (1 << 30)
    cpu_blocks = int(swap_bytes // (r.block_size * kv_bytes))
    seed = token("vllm", *r.flags)
    lines: list[str] = []

    def log(offset_s: float, level: str, where: str, message: str) -> None:
        stamp = (t0 + timedelta(seconds=offset_s)).strftime("%m-%d %H:%M:%S")
        lines.append(f"{level} {stamp} {where}] {message}")

    def config_lines(offset_s: float) -> None:
        """What EngineArgs.create_engine_config logs (frontend and engine process both call it)."""
        if r.chunked_prefill and r.chunked_prefill_rule == "32k-rule":
            log(
                offset_s,
                "WARNING",
                "arg_utils.py:953",
                "Chunked prefill is enabled by default for models with max_model_len > 32K. "
                "Currently, chunked prefill might not work with some features or models. If you "
                "encounter any issues, please disable chunked prefill by setting "
                "--enable-chunked-prefill=False.",
            )
        if not r.chunked_prefill and r.context_len > 32768:
            log(
                offset_s,
                "WARNING",
                "arg_utils.py:963",
                f"The model has a long context length ({r.context_len}). This may cause OOM "
                "errors during the initial memory profiling phase, or result in low performance "
                "due to small KV cache space. Consider setting --max-model-len to a smaller value.",
            )
        if r.chunked_prefill:
            log(
                offset_s,
                "INFO",
                "config.py:1005",
                f"Chunked prefill is enabled with max_num_batched_tokens={r.token_budget}.",
            )

    log(0, "INFO", "api_server.py:528", f"vLLM API server version {r.printed_version}")
    log(0, "INFO", "api_server.py:529", f"args: {_vllm_namespace(a)}")
    ipc = seed[:8] + "-" + seed[8:12] + "-" + seed[12:16] + "-" + seed[16:20] + "-" + seed[20:32]
    log(
        1,
        "INFO",
        "api_server.py:166",
        f"Multiprocessing frontend to use ipc:///tmp/{ipc} for IPC Path.",
    )
    pid = 70 + int(seed[32:34], 16) % 30
    log(1, "INFO", "api_server.py:179", f"Started engine process with PID {pid}")
    config_lines(1)
    config_lines(5)
    tokenizer = a["tokenizer"] or r.model
    served = r.served_model_name
    engine_line = (
        f"Initializing an LLM engine (v{r.printed_version}) with config: "
        f"model={r.model!r}, speculative_config=None, tokenizer={tokenizer!r}, "
        f"skip_tokenizer_init={a['skip_tokenizer_init']}, tokenizer_mode={a['tokenizer_mode']}, "
        f"revision={a['revision']}, override_neuron_config=None, "
        f"rope_scaling={a['rope_scaling']!r}, rope_theta={a['rope_theta']!r}, "
        f"tokenizer_revision={a['tokenizer_revision']}, "
        f"trust_remote_code={a['trust_remote_code']}, "
        f"dtype={TORCH_DTYPES.get(a['dtype'], 'torch.bfloat16')}, max_seq_len={r.context_len}, "
        f"download_dir={a['download_dir']!r}, load_format=LoadFormat.{a['load_format'].upper()}, "
        f"tensor_parallel_size={r.tensor_parallel_size}, "
        f"pipeline_parallel_size={a['pipeline_parallel_size']}, "
        f"disable_custom_all_reduce={a['disable_custom_all_reduce']}, "
        f"quantization={a['quantization']}, enforce_eager={a['enforce_eager']}, "
        f"kv_cache_dtype={a['kv_cache_dtype']}, "
        f"quantization_param_path={a['quantization_param_path']}, device_config=cuda, "
        f"decoding_config=DecodingConfig(guided_decoding_backend="
        f"{a['guided_decoding_backend']!r}), "
        "observability_config=ObservabilityConfig(otlp_traces_endpoint=None, "
        "collect_model_forward_time=False, collect_model_execute_time=False), "
        f"seed={a['seed']}, served_model_name={served}, use_v2_block_manager=True, "
        f"num_scheduler_steps={a['num_scheduler_steps']}, "
        # vLLM 0.6.3's format string really has no comma before multi_step_stream_outputs.
        f"chunked_prefill_enabled={r.chunked_prefill} "
        f"multi_step_stream_outputs={a['multi_step_stream_outputs']}, "
        f"enable_prefix_caching={r.prefix_caching}, "
        f"use_async_output_proc={not a['enforce_eager'] and not a['disable_async_output_proc']}, "
        f"use_cached_outputs=True, mm_processor_kwargs={a['mm_processor_kwargs']})"
    )
    log(6, "INFO", "llm_engine.py:237", engine_line)
    log(8, "INFO", "model_runner.py:1060", f"Starting to load model {r.model}...")
    log(8, "INFO", "weight_utils.py:243", "Using model weights format ['*.safetensors']")
    lines.extend(tqdm_shards(4, 8.0))
    log(17, "INFO", "model_runner.py:1071", f"Loading model weights took {weights_gib:.4f} GB")
    log(
        19,
        "INFO",
        "gpu_executor.py:122",
        f"# GPU blocks: {limits.num_gpu_blocks}, # CPU blocks: {cpu_blocks}",
    )
    log(
        19,
        "INFO",
        "gpu_executor.py:126",
        f"Maximum concurrency for {r.context_len} tokens per request: "
        f"{limits.max_concurrency:.2f}x",
    )
    if not a["enforce_eager"]:
        log(
            21,
            "INFO",
            "model_runner.py:1402",
            "Capturing the model for CUDA graphs. This may lead to unexpected consequences if the "
            "model is not static. To run the model in eager mode, set 'enforce_eager=True' or use "
            "'--enforce-eager' in the CLI.",
        )
        log(
            21,
            "INFO",
            "model_runner.py:1406",
            "CUDA graphs can take additional 1~3 GiB memory per GPU. If you are running out of "
            "memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode. You can "
            "also reduce the `max_num_seqs` as needed to decrease memory usage.",
        )
        log(30, "INFO", "model_runner.py:1530", "Graph capturing finished in 9 secs.")
    log(
        31,
        "INFO",
        "api_server.py:232",
        f"vLLM to use /tmp/tmp{seed[40:48]} as PROMETHEUS_MULTIPROC_DIR",
    )
    log(
        31,
        "WARNING",
        "serving_embedding.py:199",
        "embedding_mode is False. Embedding API will not work.",
    )
    log(31, "INFO", "launcher.py:19", "Available routes are:")
    for path, methods in ROUTES:
        log(31, "INFO", "launcher.py:27", f"Route: {path}, Methods: {methods}")
    lines.append("INFO:     Started server process [1]")
    lines.append("INFO:     Waiting for application startup.")
    lines.append("INFO:     Application startup complete.")
    lines.append(
        f"INFO:     Uvicorn running on socket ('0.0.0.0', {a['port']}) (Press CTRL+C to quit)"
    )
    return lines


# ------------------------------------------------------------------------------- the registry entry


# What the live sim server imitates of vLLM 0.6.3's OpenAI server. vllm/entrypoints/openai/
# serving_completion.py: OpenAIServingCompletion.create_completion names a request
# f"cmpl-{random_uuid()}"; completion_stream_generator leaves finish_reason and stop_reason null
# until the last chunk, puts the cumulative usage on every chunk under
# stream_options.continuous_usage_stats and ends with a usage-only chunk under the request's id.
# vllm/entrypoints/openai/protocol.py: StreamOptions (include_usage and continuous_usage_stats
# default true), CompletionRequest.validate_stream_options (stream_options need stream=True),
# ModelCard.max_model_len.
OPENAI = OpenAIDialect(
    request_id_prefix="cmpl-",
    stream_options_need_stream=True,
    usage_by_default=True,
    continuous_usage=True,
    usage_chunk_own_id=False,
    unfinished_finish_reason=None,
    stop_field="stop_reason",
    models_max_model_len=True,
)

SPEC = EngineSpec(
    name="vllm",
    # vllm/engine/arg_utils.py::EngineArgs.add_cli_args at v0.6.3 (`--gpu-memory-utilization`,
    # default 0.9): the fraction of total memory Worker.determine_num_available_blocks budgets.
    memory_fraction_flag="--gpu-memory-utilization",
    title="vLLM",
    product="vllm",
    family="V0",
    # V1 became the default engine in 0.8.0 (vllm/envs.py VLLM_USE_V1); before it every release
    # ran V0.
    family_versions="<0.8",
    version=VERSION,
    printed_version=PRINTED_VERSION,
    flag_table=_cli_tables.VLLM_0_6_3,
    normalise_flags=normalise_flags,
    resolve=resolve,
    runtime_limits=runtime_limits,
    log=LogFormat(
        record=RECORD,
        markers=MARKERS,
        marker_words=MARKER_WORDS,
        marker_hint="'Initializing an LLM engine (v...) with config:', 'vLLM API server version'",
        ready=READY,
        read=read_log,
        # V0's own lines: its engine line (0.8 to 0.10 print "a V0 LLM engine" when V1 falls
        # back) and its block count (V1 prints "GPU KV cache size: N tokens").
        family_marks=(
            re.compile(r"Initializing an? (?:V0 )?LLM engine \(v"),
            re.compile(r"# GPU blocks: \d"),
        ),
        facts=(
            "num_gpu_blocks",
            "block_size",
            "num_cpu_blocks",
            "max_concurrency",
            "weights_gib",
            "tensor_parallel_size",
        ),
    ),
    metric_map=METRIC_MAP,
    metric_series=METRICS,
    entrypoint=("python3", "-m", "vllm.entrypoints.openai.api_server"),
    # vllm/entrypoints/openai/serving_completion.py::completion_stream_generator at v0.6.3 yields
    # one chunk per output token (there is no --stream-interval in 0.6.3).
    stream_interval=1,
    render_startup_log=render_startup_log,
    openai=OPENAI,
)
