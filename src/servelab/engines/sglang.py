"""SGLang 0.4.1: its flags, resolution rules, start-up log and /metrics names.

Every rule cites its upstream source at v0.4.1; docs/engines.md has the full list.

Resolution (`sglang/srt/server_args.py::ServerArgs.__post_init__`, `managers/scheduler.py`,
`managers/schedule_policy.py`):
- chunked_prefill_size, when not flagged: 2048 if the GPU has < 25,000 MiB (nvidia-smi's
  memory.total), else 8192; a value <= 0 disables chunking. `--enable-dp-attention` halves it.
- mem_fraction_static by tensor-parallel size (0.88 at tp 1); cuda_graph_max_bs 8 (< 25,000 MiB
  and tp < 4), 80 (< 25,000 MiB, tp >= 4), else 160.
- schedule_policy lpm; the radix cache on unless `--disable-radix-cache`, and then lpm and
  dfs-weight fall back to fcfs. max_prefill_tokens 16384. Overlap scheduler on unless disabled.
- context length from `--context-length`, else the model's max_position_embeddings (larger refused).
- max_running_requests, unless flagged, is resolved at run time from the KV pool size
  (`managers/tp_worker.py::TpModelWorker.__init__`, `model_executor/model_runner.py`):
  req_to_token pool = max_num_reqs + 1 with max_num_reqs = min(max(int(T / context_len * 512),
  2048), 4096); max_running_requests = min(T // 2 or the flag, pool size); the prompt limit is
  max_req_input_len = min(context_len - 1, T - 1) - 5 (longer prompts are truncated).

Start-up log (`[%Y-%m-%d %H:%M:%S]` records, `[... TP0]` in the scheduler process): everything from
`server_args=ServerArgs(...)` (printed after `__post_init__`, so resolved) and the
`max_total_num_tokens=..., context_len=N` summary line: chunked prefill on iff chunked_prefill_size >
0 (`-1` disables), `prefix_caching` = not disable_radix_cache, `schedule_policy` as printed except
that lpm/dfs-weight with the radix cache disabled is fcfs (the engine's own fallback, noted),
`context_len` from the summary line (else an explicit `context_length=N`, noted). SGLang 0.4.x
prints no version: `version` is None.

/metrics (`sglang/srt/metrics/collector.py`, with `--enable-metrics`, label `model_name`; releases
before 0.4 used the label `name`). SGLang 0.4.1 exports no preemption (retraction) counter:
retractions appear only in its log ("Decode out of memory happened. #retracted_reqs: N"), so
`preemptions_total` is absent from METRIC_MAP (no stand-in series, no zeros).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

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
    CUDA_CONTEXT_GIB,
    INT,
    TORCH_DTYPES,
    LogLine,
    Reader,
    repr_field,
    token,
    tqdm_shards,
)
from servelab.engines.spec import EngineSpec, LogFormat, OpenAIDialect

__all__ = ["SPEC"]

VERSION = "0.4.1"
PRINTED_VERSION = None  # 0.4.x prints no version in its start-up log
SMALL_GPU_MIB = 25_000  # server_args.py: gpu_mem < 25_000
REQUIRED_FLAGS = (("model_path", "--model-path"),)


def _parsed(r: ResolvedConfig) -> EngineFlags:
    return parse_table("sglang", _cli_tables.SGLANG_0_4_1, r.flags, required=REQUIRED_FLAGS)


# ------------------------------------------------------------------------------- resolution


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


def resolve(
    f: EngineFlags, *, gpu_memory_mib: int, max_pos: int, version: str, gpu_name: str = ""
) -> ResolvedConfig:
    a = f.args
    tp = int(a["tensor_parallel_size"])
    if tp < 1:
        raise ResolutionError(f"--tp-size={tp}: must be >= 1")
    small_gpu = gpu_memory_mib < SMALL_GPU_MIB
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
    context_len = model_len(a["context_length"], max_pos, "--context-length")
    prefix = not a["disable_radix_cache"]
    policy = a["schedule_policy"]
    if not prefix and policy in ("lpm", "dfs-weight"):
        policy = "fcfs"  # schedule_policy.py: the radix cache is disabled => FCFS
    check_positive_counts(a)
    return ResolvedConfig(
        engine="sglang",
        version=version,
        printed_version=PRINTED_VERSION,
        **model_fields(a),
        tensor_parallel_size=tp,
        gpu_memory_mib=gpu_memory_mib,
        **prefill_fields(a, chunked=chunked, rule=rule, size=size),
        prefix_caching=prefix,
        context_len=context_len,
        schedule_policy=policy,
        **pool_fields(a),
        memory_fraction=frac,
        cuda_graph_max_bs=int(graph_bs),
        overlap_schedule=overlap,
        flags=f.flags,
        rules=_rules(f, rule),
    )


class ModelFields(TypedDict):
    model: str
    served_model_name: str
    dtype: str


def model_fields(a: Mapping[str, Any]) -> ModelFields:
    """The model an SGLang server serves, under which name, in which dtype (every family)."""
    return ModelFields(
        model=a["model_path"],
        served_model_name=a["served_model_name"] or a["model_path"],
        dtype=a["dtype"],
    )


class PrefillFields(TypedDict):
    chunked_prefill: bool
    chunked_prefill_rule: str
    chunk_size: int | None
    token_budget: int


def prefill_fields(
    a: Mapping[str, Any], *, chunked: bool, rule: str, size: int | None
) -> PrefillFields:
    """How prefill is chunked (`size` tokens a chunk when `chunked`, by `rule`) and the
    --max-prefill-tokens budget of one prefill batch (every family)."""
    return PrefillFields(
        chunked_prefill=chunked,
        chunked_prefill_rule=rule,
        chunk_size=size if chunked else None,
        token_budget=int(a["max_prefill_tokens"]),
    )


class PoolFields(TypedDict):
    max_num_seqs: None
    max_running_requests: int | None
    max_total_tokens: int | None
    block_size: None


def pool_fields(a: Mapping[str, Any]) -> PoolFields:
    """SGLang's request and token pools as flagged (resolved at run time when not), and the two
    vLLM-only fields, None (every family)."""
    return PoolFields(
        max_num_seqs=None,
        max_running_requests=a["max_running_requests"],
        max_total_tokens=a["max_total_tokens"],
        block_size=None,
    )


def check_positive_counts(a: Mapping[str, Any]) -> None:
    """Refuse a non-positive prefill budget, running-request or total-token cap (both SGLang
    families' `resolve`)."""
    for dest, flag in (
        ("max_prefill_tokens", "--max-prefill-tokens"),
        ("max_running_requests", "--max-running-requests"),
        ("max_total_tokens", "--max-total-tokens"),
    ):
        if a[dest] is not None and a[dest] <= 0:
            raise ResolutionError(f"{flag}={a[dest]}: must be positive")


def _rules(f: EngineFlags, chunk_rule: str) -> dict[str, str]:
    """The rule behind each resolved setting (results/defaults_diff.csv; docs/engines.md)."""

    def given(dest: str, default: str) -> str:
        return "flag" if f.is_given(dest) else default

    return {
        "chunked_prefill": chunk_rule,
        "chunk_size": chunk_rule,
        "token_budget": given("max_prefill_tokens", "default"),
        "prefix_caching": given("disable_radix_cache", "default"),
        "schedule_policy": given("schedule_policy", "default"),
        "max_running_requests": given("max_running_requests", "run-time-pool-rule"),
        "memory_fraction": given("mem_fraction_static", "tp-size-rule"),
        "cuda_graph_max_bs": given("cuda_graph_max_bs", "gpu-memory-rule"),
        "context_len": given("context_length", "model-max-position"),
    }


def pool_tokens(resolved: ResolvedConfig, kv_capacity_tokens: int) -> int:
    """The KV pool's tokens: the allocated capacity, capped by --max-total-tokens (both families)."""
    if resolved.max_total_tokens is not None:
        return min(kv_capacity_tokens, resolved.max_total_tokens)
    return kv_capacity_tokens


def pool_limits(
    resolved: ResolvedConfig, kv_capacity_tokens: int, max_running_requests: int
) -> RuntimeLimits:
    """The limits of a pool of `pool_tokens` running at most `max_running_requests`, with 0.4.1's
    prompt limit, which 0.5.23 keeps: scheduler.py's max_req_len = min(context_len - 1,
    max_total_num_tokens - 1), and max_req_input_len = max_req_len - 5. A pool too small for one
    prompt or one request refuses to start."""
    total = pool_tokens(resolved, kv_capacity_tokens)
    max_req_len = min(resolved.context_len - 1, total - 1)
    if max_req_len - 5 <= 0 or max_running_requests < 1:
        raise ResolutionError(
            f"kv_capacity_tokens={kv_capacity_tokens}: memory pool size is too small"
        )
    return RuntimeLimits(
        kv_capacity_tokens=total,
        num_gpu_blocks=None,
        max_running_requests=max_running_requests,
        prompt_limit=max_req_len - 5,
        max_concurrency=None,
    )


def runtime_limits(resolved: ResolvedConfig, kv_capacity_tokens: int) -> RuntimeLimits:
    """The limits SGLang derives once its KV pool holds `kv_capacity_tokens` (module docstring)."""
    total = pool_tokens(resolved, kv_capacity_tokens)
    max_num_reqs = resolved.max_running_requests
    if max_num_reqs is None:
        max_num_reqs = min(max(int(total / resolved.context_len * 512), 2048), 4096)
    pool = max_num_reqs + 1
    wanted = total // 2 if resolved.max_running_requests is None else resolved.max_running_requests
    return pool_limits(resolved, kv_capacity_tokens, min(wanted, pool))


# ------------------------------------------------------------------------------ start-up log

# `[2025-01-01 00:00:00 TP0] message`; ranks may be DP/PP/ATTN_CP/MOE_DP/TP/EP (0.5), and some
# 0.5 records put `LEVEL file.py:N: ` before the message.
RECORD = re.compile(
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?P<proc>(?: [A-Z_]{2,7}\d+)*)\] "
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+\.py:\d+: )?(?P<msg>.*)$"
)
# ServerArgs fields absent from 0.4.10.post2's (the last 0.4 release) that 0.5 releases print:
# weight_version, moe_runner_backend, gc_warning_threshold_secs and scheduler_recv_interval from
# 0.5.1 on, tokenizer_worker_num and enable_fp32_lm_head by 0.5.10 (all still in 0.5.23). A
# `server_args=` line that shows one of them is from the 0.5 family.
FIELDS_SINCE_0_5 = (
    r"(?:weight_version|moe_runner_backend|gc_warning_threshold_secs|scheduler_recv_interval)"
)
# Messages (the part after the logger prefix) that only SGLang's start-up prints, of every family
# in one table (servelab's); each family's MARKERS names the ones its releases print (0.5's:
# servelab.engines.sglang_v05.MARKERS).
MARKER = {
    "server_args": re.compile(r"server_args=ServerArgs\("),
    # 0.5 prints the arguments as a dict too (srt/server_args.py, ServerArgs.__post_init__ logging)
    "server_args_any": re.compile(r"server_args=(?:ServerArgs\(|\{'model_path': )"),
    "max_total_tokens": re.compile(r"max_total_num_tokens=\d+, "),
    "ready": re.compile(r"The server is fired up and ready to roll!"),
    "batch": re.compile(r"(?:Prefill|Decode) batch\. #"),
    "batch_any": re.compile(r"(?:Prefill|Decode) batch[.,] "),
    "load_weight": re.compile(r"Load weight begin\. avail mem="),
    "cuda_graph": re.compile(r"Capture cuda graph begin\."),
    "kv_cache": re.compile(r"KV Cache is allocated\. "),
    # a start-up that failed in the scheduler (managers/scheduler.py, entrypoints/engine.py)
    "scheduler_exception": re.compile(r"Scheduler hit an exception: "),
    "sigquit": re.compile(r"Received sigquit from a child process"),
}
MARKERS = tuple(
    MARKER[name]
    for name in ("server_args", "max_total_tokens", "ready", "batch", "load_weight", "cuda_graph")
)
MARKER_WORDS = re.compile(
    r"ServerArgs\(|max_total_num_tokens=|ready to roll| batch\. #|Load weight begin|"
    r"Capture cuda graph begin"
)
READY = re.compile(r"The server is fired up and ready to roll!")


def read_log(lines: list[LogLine]) -> Reader:
    """What an SGLang start-up log shows (the module docstring). Reads the `server_args=` line in
    both of its forms, `ServerArgs(name=value, ...)` (0.4.x to 0.5.4) and the resolved dict
    `{'name': value, ...}` (0.5.23), so the 0.5 family reuses it (`servelab.engines.sglang_v05`)."""
    r = Reader()
    args_size: tuple[LogLine, int | None] | None = None
    summary_size: tuple[LogLine, int | None] | None = None
    explicit_context: tuple[LogLine, int] | None = None
    for line in lines:
        msg = line.msg
        if msg is None or not msg.startswith(("server_args=", "max_total_num_tokens=")):
            continue
        if m := re.match(r"server_args=(?:ServerArgs\((.*)|(\{.*))$", msg):
            body = m.group(1) if m.group(1) is not None else m.group(2)
            if f := repr_field(body, "chunked_prefill_size", rf"{INT}|None"):
                args_size = (line, None if f.group(1) == "None" else int(f.group(1)))
            radix = repr_field(body, "disable_radix_cache", BOOL)
            if radix:
                r.put("prefix_caching", radix.group(1) == "False", line)
            if f := repr_field(body, "schedule_policy", r"'[\w-]+'"):
                policy = f.group(1).strip("'")
                if radix and radix.group(1) == "True" and policy in ("lpm", "dfs-weight"):
                    note: str | None = (
                        f"schedule_policy='{policy}' with disable_radix_cache=True: SGLang falls "
                        "back to fcfs (schedule_policy.py)"
                    )
                    r.put("schedule_policy", "fcfs", line, note)
                else:
                    r.put("schedule_policy", policy, line)
            if f := repr_field(body, "context_length", r"\d+"):
                explicit_context = (line, int(f.group(1)))
            for name, pat, conv in (
                ("mem_fraction_static", r"[\d.]+", float),
                ("cuda_graph_max_bs", r"\d+", int),
                ("tp_size", r"\d+", int),
            ):
                if f := repr_field(body, name, pat):
                    r.put(name, conv(f.group(1)), line)
        elif msg.startswith("max_total_num_tokens="):
            for name in (
                "max_total_num_tokens",
                "max_prefill_tokens",
                "max_running_requests",
                "context_len",
            ):
                if f := re.search(rf"(?:^|, ){name}=(\d+)(?=,|$)", msg):
                    r.put(name, int(f.group(1)), line)
            if f := re.search(rf"(?:^|, )chunked_prefill_size=({INT}|None)(?=,|$)", msg):
                summary_size = (line, None if f.group(1) == "None" else int(f.group(1)))

    # chunked prefill: server_args (resolved by __post_init__); a newer summary line that also
    # prints chunked_prefill_size is the scheduler's own value and wins if they disagree.
    chosen = summary_size or args_size
    if chosen is not None:
        line, size = chosen
        note = None
        if summary_size and args_size and summary_size[1] != args_size[1]:
            note = (
                f"server_args (line {args_size[0].no}) shows chunked_prefill_size={args_size[1]}, "
                f"the scheduler's summary line shows {summary_size[1]}; the summary line is used"
            )
        elif summary_size is not None and args_size is not None:
            line = args_size[0]  # they agree: cite the resolution itself
        if size is not None and size > 0:
            r.put("chunked_prefill", True, line, note)
            r.put("chunk_size", size, line, note)
        else:
            why = f"chunked_prefill_size={size}: a value <= 0 (or None) disables chunking"
            r.put("chunked_prefill", False, line, f"{note}; {why}" if note else why)
    if not r.has("context_len") and explicit_context is not None:
        r.put(
            "context_len",
            explicit_context[1],
            explicit_context[0],
            "configured explicitly (context_length); SGLang uses it verbatim",
        )
    return r


# ----------------------------------------------------------------------------------- metrics

# Canonical telemetry name -> SGLang 0.4.1 sample name (no preemptions_total: see above).
METRIC_MAP = {
    "kv_cache_usage": "sglang:token_usage",
    "requests_running": "sglang:num_running_reqs",
    "requests_waiting": "sglang:num_queue_reqs",
    "prompt_tokens_total": "sglang:prompt_tokens_total",
    "generation_tokens_total": "sglang:generation_tokens_total",
    "prefix_cache_hit_rate": "sglang:cache_hit_rate",
}
# Every series SGLang 0.4.1 exports (metric family name -> type).
METRICS = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_used_tokens": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:prompt_tokens_total": "counter",
    "sglang:generation_tokens_total": "counter",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:time_per_output_token_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
    "sglang:func_latency_seconds": "histogram",
}


# ------------------------------------------------------------------ rendering its start-up log


def _sglang_server_args(r: ResolvedConfig, args: dict[str, Any]) -> str:
    """ServerArgs after __post_init__, as `logger.info(f"{server_args=}")` prints it."""
    values = dict(args)
    values["tp_size"] = args["tensor_parallel_size"]
    values["dp_size"] = args["data_parallel_size"]
    values["ep_size"] = args["expert_parallel_size"]
    values["tokenizer_path"] = args["tokenizer_path"] or r.model
    values["served_model_name"] = r.served_model_name
    if values["random_seed"] is None:
        values["random_seed"] = int(token("sglang-seed", *r.flags)[:8], 16) % (1 << 30)
    values["mem_fraction_static"] = r.memory_fraction
    if r.chunk_size is not None:
        values["chunked_prefill_size"] = r.chunk_size
    values["cuda_graph_max_bs"] = r.cuda_graph_max_bs
    values["attention_backend"] = args["attention_backend"] or "flashinfer"
    values["sampling_backend"] = args["sampling_backend"] or "flashinfer"
    if args["enable_dp_attention"]:
        values["dp_size"] = values["tp_size"]
        values["schedule_conservativeness"] = args["schedule_conservativeness"] * 0.3
        values["disable_overlap_schedule"] = True
        if r.chunk_size is None:
            values["chunked_prefill_size"] = args["chunked_prefill_size"] // 2
    if args["enable_ep_moe"]:
        values["ep_size"] = values["tp_size"]
    body = ", ".join(
        f"{name}={values[name]!r}" for name in _cli_tables.SGLANG_0_4_1_SERVER_ARGS_FIELDS
    )
    return f"server_args=ServerArgs({body})"


@dataclass(frozen=True)
class StartupLogStyle:
    """What an SGLang release family prints where its start-up logs differ; `render_log` prints
    the rest the same for 0.4.1 and 0.5.23. One renderer for both families is servelab's (each
    release prints its lines from its own server, model_runner.py and scheduler.py).

    `engine` seeds the log's made-up numbers (pid, client port); `parsed` and `runtime_limits` are
    the family's own. `rank_always`: scheduler lines carry ` TP0` whatever the tensor-parallel
    size (0.4.1; 0.5's scheduler.py prefixes it only when tp > 1). `server_args` prints the
    resolved server arguments. `weights_lines` are the messages once the weights are loaded,
    before `Memory pool end`: (dtype, memory left after the weights, weights GiB, KV GiB, KV
    tokens). `req_to_token_gib`, when the family counts it, is the request-to-token pool that
    also comes out of the memory left. `captures_cuda_graph` tells whether CUDA graphs are
    captured, `capture_lines` the raw lines between the capture's begin and end.
    `pool_line` is the scheduler's `max_total_num_tokens=...` message, given the memory left.
    `model_info_path` is the route the launcher's warm-up asks first; `prefill_line` is the
    warm-up request's prefill batch message.
    """

    engine: str
    parsed: Callable[[ResolvedConfig], EngineFlags]
    runtime_limits: Callable[[ResolvedConfig, int], RuntimeLimits]
    rank_always: bool
    server_args: Callable[[ResolvedConfig, dict[str, Any]], str]
    weights_lines: Callable[[str, float, float, float, int], list[str]]
    req_to_token_gib: Callable[[ResolvedConfig, RuntimeLimits], float] | None
    captures_cuda_graph: Callable[[ResolvedConfig, dict[str, Any]], bool]
    capture_lines: Callable[[ResolvedConfig], list[str]]
    pool_line: Callable[[ResolvedConfig, RuntimeLimits, float], str]
    model_info_path: str
    prefill_line: str


def render_log(
    style: StartupLogStyle,
    r: ResolvedConfig,
    kv_tokens: int,
    weights_gib: float,
    t0: datetime,
    kv_bytes: int,
) -> list[str]:
    """An SGLang family's start-up log for a resolved configuration (`StartupLogStyle`)."""
    args = dict(style.parsed(r).args)
    limits = style.runtime_limits(r, kv_tokens)
    seed = token(style.engine, *r.flags)
    lines: list[str] = []

    def log(offset_s: float, message: str, tp: bool = True) -> None:
        stamp = (t0 + timedelta(seconds=offset_s)).strftime("%Y-%m-%d %H:%M:%S")
        rank = " TP0" if tp and (style.rank_always or r.tensor_parallel_size > 1) else ""
        lines.append(f"[{stamp}{rank}] {message}")

    total_gib = r.gpu_memory_mib / 1024
    avail_begin = total_gib - CUDA_CONTEXT_GIB
    avail_weights = avail_begin - weights_gib
    kv_gib = limits.kv_capacity_tokens * kv_bytes / (1 << 30)
    avail_pool = avail_weights - kv_gib
    if style.req_to_token_gib is not None:
        avail_pool -= style.req_to_token_gib(r, limits)
    dtype = TORCH_DTYPES.get(args["dtype"], "torch.bfloat16")
    host, port = args["host"], args["port"]

    log(0, style.server_args(r, args), tp=False)
    log(7, "Init torch distributed begin.")
    log(7, f"Load weight begin. avail mem={avail_begin:.2f} GB")
    log(8, "Using model weights format ['*.safetensors']")
    lines.extend(tqdm_shards(4, 8.0))
    for message in style.weights_lines(
        dtype, avail_weights, weights_gib, kv_gib, limits.kv_capacity_tokens
    ):
        log(16, message)
    log(16, f"Memory pool end. avail mem={avail_pool:.2f} GB")
    if style.captures_cuda_graph(r, args):
        log(17, "Capture cuda graph begin. This can take up to several minutes.")
        lines.extend(style.capture_lines(r))
        log(19, "Capture cuda graph end. Time elapsed: 2.31 s")
    log(20, style.pool_line(r, limits, avail_pool))
    pid = 100 + int(seed[:4], 16) % 900
    log(20, f"INFO:     Started server process [{pid}]", tp=False)
    log(20, "INFO:     Waiting for application startup.", tp=False)
    log(20, "INFO:     Application startup complete.", tp=False)
    log(20, f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)", tp=False)
    client = 40000 + int(seed[4:8], 16) % 20000
    log(
        21,
        f'INFO:     127.0.0.1:{client} - "GET {style.model_info_path} HTTP/1.1" 200 OK',
        tp=False,
    )
    log(21, style.prefill_line)
    log(22, f'INFO:     127.0.0.1:{client + 8} - "POST /generate HTTP/1.1" 200 OK', tp=False)
    log(22, "The server is fired up and ready to roll!", tp=False)
    return lines


def _weights_lines(
    dtype: str, avail_weights: float, weights_gib: float, kv_gib: float, kv_tokens: int
) -> list[str]:
    return [
        f"Load weight end. type=LlamaForCausalLM, dtype={dtype}, avail mem={avail_weights:.2f} GB"
    ]


def _req_to_token_gib(r: ResolvedConfig, limits: RuntimeLimits) -> float:
    """The request-to-token pool: (max running requests + 1) rows of context_len + 4 int32s."""
    pool_rows = (
        r.max_running_requests
        if r.max_running_requests is not None
        else min(max(int(limits.kv_capacity_tokens / r.context_len * 512), 2048), 4096)
    ) + 1
    return pool_rows * (r.context_len + 4) * 4 / (1 << 30)


def _capture_lines(r: ResolvedConfig) -> list[str]:
    """The tqdm bar of the capture, one step per captured batch size."""
    assert r.cuda_graph_max_bs is not None
    capture = [bs for bs in [1, 2, 4, *(8 * i for i in range(1, 21))] if bs <= r.cuda_graph_max_bs]
    n = len(capture)
    return [f"100%|██████████| {n}/{n} [00:02<00:00,  {n / 2.0:.2f}it/s]"]


def _pool_line(r: ResolvedConfig, limits: RuntimeLimits, avail_pool: float) -> str:
    return (
        f"max_total_num_tokens={limits.kv_capacity_tokens}, "
        f"max_prefill_tokens={r.token_budget}, "
        f"max_running_requests={limits.max_running_requests}, "
        f"context_len={r.context_len}"
    )


STARTUP_LOG_STYLE = StartupLogStyle(
    engine="sglang",
    parsed=_parsed,
    runtime_limits=runtime_limits,
    rank_always=True,
    server_args=_sglang_server_args,
    weights_lines=_weights_lines,
    req_to_token_gib=_req_to_token_gib,
    captures_cuda_graph=lambda r, args: not args["disable_cuda_graph"],
    capture_lines=_capture_lines,
    pool_line=_pool_line,
    model_info_path="/get_model_info",
    prefill_line=(
        "Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, cache hit rate: 0.00%, "
        "token usage: 0.00, #running-req: 0, #queue-req: 0"
    ),
)


# ------------------------------------------------------------------------------- the registry entry

# A COMPLETE `ServerArgs(...)` line without any 0.5 field (a cut line tells no family).
FAMILY_MARKS = (re.compile(rf"server_args=ServerArgs\((?!.*\b{FIELDS_SINCE_0_5}=).*\)$"),)

# What the live sim server imitates of SGLang 0.4.1's OpenAI server.
# sglang/srt/openai_api/adapter.py: v1_completions answers under the request's id (a uuid4 hex,
# no prefix) and accepts stream_options without stream; its generate_stream_resp sends
# finish_reason "" on non-final chunks and, with stream_options.include_usage (default false),
# one final usage-only chunk with an id of its own (uuid.uuid4().hex), never usage on the other
# chunks. sglang/srt/openai_api/protocol.py: CompletionResponseStreamChoice.matched_stop;
# ModelCard has no max_model_len.
OPENAI = OpenAIDialect(
    request_id_prefix="",
    stream_options_need_stream=False,
    usage_by_default=False,
    continuous_usage=False,
    usage_chunk_own_id=True,
    unfinished_finish_reason="",
    stop_field="matched_stop",
    models_max_model_len=False,
)

SPEC = EngineSpec(
    name="sglang",
    # sglang/srt/server_args.py::ServerArgs.add_cli_args at v0.4.1 (`--mem-fraction-static`): the
    # fraction ModelRunner.profile_max_num_token keeps for weights and the KV pool.
    memory_fraction_flag="--mem-fraction-static",
    title="SGLang",
    product="sglang",
    family="0.4",
    family_versions=">=0.4,<0.5",
    version=VERSION,
    printed_version=PRINTED_VERSION,
    flag_table=_cli_tables.SGLANG_0_4_1,
    required_flags=REQUIRED_FLAGS,
    resolve=resolve,
    runtime_limits=runtime_limits,
    log=LogFormat(
        record=RECORD,
        markers=MARKERS,
        marker_words=MARKER_WORDS,
        marker_hint="'server_args=ServerArgs(', 'max_total_num_tokens=...'",
        ready=READY,
        read=read_log,
        facts=(
            "max_total_num_tokens",
            "max_prefill_tokens",
            "max_running_requests",
            "mem_fraction_static",
            "cuda_graph_max_bs",
            "tp_size",
        ),
        family_marks=FAMILY_MARKS,
    ),
    metric_map=METRIC_MAP,
    metric_series=METRICS,
    entrypoint=("python3", "-m", "sglang.launch_server"),
    # one renderer for both families, in this family's style
    render_startup_log=functools.partial(render_log, STARTUP_LOG_STYLE),
    openai=OPENAI,
)
