"""SGLang 0.5 (the release family of 0.5.x; rules read at 0.5.23): flags, resolution, start-up log
and /metrics names.

Every rule cites its upstream source in the 0.5.23 wheel (`sglang/...` = `python/sglang/...` of
sgl-project/sglang at v0.5.23); docs/engines.md "SGLang 0.5" has the full list with lines.

Resolution (`ServerArgs.resolve_once` -> `arg_groups/pipeline.py::run_resolution_pipeline`; the GPU
memory rules in `arg_groups/memory_hook.py::handle_gpu_memory_settings`):
- GPU memory is nvidia-smi's memory.total in MiB (`utils/common.py::get_device_memory_capacity`),
  compared with thresholds of N * 1024 MiB.
- chunked_prefill_size, when not flagged: < 20 GiB 2048; < 35 GiB 4096 (an L4: 2048 in 0.4.x);
  < 90 GiB 4096 below 60 GiB else 8192; < 160 GiB 8192; else 16384. A value <= 0 disables chunking.
- the decode CUDA graphs' max batch (`cuda_graph_config.decode.max_bs`; `--cuda-graph-max-bs` is
  gone): < 20 GiB 8; < 35 GiB 48 (tp < 4) / 160; < 60 GiB 32 / 160; < 160 GiB 256 / 512; else 512;
  capped by `--max-running-requests` when that is smaller. Prefill CUDA graphs are on by default
  (`model_executor/cuda_graph_config.py::default_prefill_backend` returns "breakable"), with
  max_bs = chunked_prefill_size and the sizes of `cuda_graph_hook.py::
  generate_prefill_cuda_graph_batch_sizes`.
- mem_fraction_static, when not flagged: round((M - reserved) / M, 3) with reserved (MiB) = 512 +
  1.5 * max(chunked_prefill_size, 2048) + tp * pp / 8 * 1024 + 2 * decode max_bs + 8 * (number of
  prefill graph sizes) (`reserve_for_graph_mb`), at least 10 GiB on a GPU of more than 60 GiB.
- schedule_policy fcfs (`arg_groups/fields/schedule.py`); lpm/dfs-weight fall back to fcfs without
  the radix cache (`managers/schedule_policy.py::_validate_and_adjust_policy`). The radix cache on
  unless `--disable-radix-cache`; max_prefill_tokens 16384; the overlap scheduler on; page size 1.
- max_running_requests, unless flagged, from the KV pool T at run time
  (`mem_cache/kv_cache_configurator.py::resolve_max_num_reqs`): min(max(min(int(T / context_len *
  512), 4096), 2048), T // 2); the prompt limit as in 0.4.1 (min(context_len - 1, T - 1) - 5).

Start-up log: `server_args={...}`, a dict of the RESOLVED values in ServerArgs field order
(`entrypoints/engine.py::Engine._launch_subprocesses`; 0.5.0 to 0.5.4 printed `ServerArgs(...)`,
which `sglang.read_log` reads too), the scheduler's `max_total_num_tokens=..., chunked_prefill_size=
..., context_len=..., available_gpu_mem=...` line (`managers/scheduler.py`) and `KV Cache is
allocated. dtype: ..., #tokens: N, ...` (`mem_cache/memory_pool.py`). No line prints the version.

/metrics (`sglang/srt/observability/metrics_collector.py`, with `--enable-metrics`; labels
model_name, engine_type, tp_rank, ...; token counters and latency histograms add is_streaming).
`time_per_output_token_seconds` is gone (inter_token_latency_seconds and
request_time_per_output_token_seconds replace it); retractions are counted
(`num_retracted_requests_total`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

from servelab.engines import _cli_tables_sglang_v05 as tables
from servelab.engines import sglang
from servelab.engines.base import (
    EngineFlags,
    ResolutionError,
    ResolvedConfig,
    RuntimeLimits,
    model_len,
)
from servelab.engines.cmdline import parse_table
from servelab.engines.logtext import (
    LogLine,
    Reader,
    token,
)

__all__ = ["SPEC", "cuda_graph_sizes"]

VERSION = "0.5.23"
REQUIRED_FLAGS = (("model_path", "--model-path"),)
GIB = 1024  # memory_hook.py compares MiB with N * 1024

# memory_hook.py::handle_gpu_memory_settings: (below this many GiB, chunk, decode max_bs tp<4,
# decode max_bs tp>=4).
GPU_MEMORY_RULES = (
    (20, 2048, 8, 8),
    (35, 4096, 48, 160),
    (60, 4096, 32, 160),
    (90, 8192, 256, 512),
    (160, 8192, 256, 512),
)
LARGEST_GPU = (16384, 512, 512)


def _parsed(r: ResolvedConfig) -> EngineFlags:
    return parse_table("sglang_v05", tables.SGLANG_0_5_23, r.flags, required=REQUIRED_FLAGS)


# ------------------------------------------------------------------------------- resolution


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """cuda_graph_hook.py::generate_prefill_cuda_graph_batch_sizes (captured token counts)."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_bs + 1, 512),
    ]
    return [s for s in sizes if s <= max_bs]


def cuda_graph_sizes(max_bs: int) -> list[int]:
    """cuda_graph_hook.py::generate_decode_cuda_graph_batch_sizes (no speculative decoding)."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    out = [s for s in sizes if s <= max_bs]
    return out if max_bs in out else [*out, max_bs]


# The CPU engine's rules (SGLang 0.5.23, read in its wheel; docs/engines.md "SGLang 0.5 on the
# CPU"), applied by `resolve` when gpu.name is CPU: the GPU path's rules with the CPU's inputs.
# - the "device memory" is the machine's RAM per NUMA node, in MiB, capped by the cgroup's
# memory.max (`utils/common.py::get_cpu_memory_capacity` L911-927); config gpu.memory_mib
# gives it. chunked_prefill_size then follows the same memory table
# (`arg_groups/memory_hook.py::handle_gpu_memory_settings` L89-180): 24 GiB -> 4096;
# - no CUDA graphs: the decode graphs' max batch is `--torch-compile-max-bs` (default 32,
# `arg_groups/fields/exec_.py` L698-701; memory_hook.py L201-232), and a CPU graph is captured
# only with `--enable-torch-compile` (`model_runner_components/cuda_graph_setup.py` L735-736);
# - mem_fraction_static, when not flagged: round((M - reserved) / M, 3), reserved = 512 +
# 1.5 * max(chunked_prefill_size, 2048) + tp * pp / 8 * 1024 + 2 * torch_compile_max_bs
# (memory_hook.py L281-343 and `reserve_for_graph_mb` L357-368; no prefill graph on the CPU):
# 24,105 MiB -> 0.716, as the real server prints (above 60 GiB at least 10 GiB, as on a GPU);
# - schedule_policy fcfs, the radix cache on, page size 1, max_prefill_tokens 16384, as on a GPU;
# - attention: `intel_amx` on x86 falls back to `torch_native` without the AMX kernels
# (`arg_groups/platform_hook.py::handle_cpu_backends` L158-173, `arg_groups/overrides.py`
# L1300-1310), sampling `pytorch`. Not a setting servelab compares.
# The KV pool (`--max-total-tokens`, else the free RAM after the weights times the fraction) is
# a run-time fact, read from the log (`KV Cache is allocated. ... #tokens: N`).


def on_cpu(gpu_name: str) -> bool:
    """Config gpu.name CPU: SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE=1`, `--device cpu`)."""
    return gpu_name.lower() == "cpu"


def resolve(
    f: EngineFlags, *, gpu_memory_mib: int, max_pos: int, version: str, gpu_name: str = ""
) -> ResolvedConfig:
    a = f.args
    tp = int(a["tp_size"])
    pp = int(a["pp_size"]) if "pp_size" in a else 1
    if tp < 1:
        raise ResolutionError(f"--tp-size={tp}: must be >= 1")
    cpu = on_cpu(gpu_name)
    rules: dict[str, str] = {}
    mem = float(gpu_memory_mib)  # on the CPU: the machine's RAM per NUMA node (see on_cpu)
    chunk_default, bs_small, bs_large = next(
        ((c, s, lg) for below, c, s, lg in GPU_MEMORY_RULES if mem < below * GIB), LARGEST_GPU
    )
    size = a["chunked_prefill_size"]
    if size is None:
        size, rules["chunked_prefill"] = (
            chunk_default,
            "cpu-memory-rule" if cpu else "gpu-memory-rule",
        )
    else:
        rules["chunked_prefill"] = "flag"
    rules["chunk_size"] = rules["chunked_prefill"]
    chunked = size > 0  # "-1 means disable"
    if cpu:
        # no CUDA graphs; the decode graph batch, in the memory reserve, is torch_compile_max_bs
        graphs_off, max_bs = True, int(a["torch_compile_max_bs"])
        rules["cuda_graph_max_bs"] = "cpu-platform (no CUDA graphs)"
        graph_reserve = max_bs * 2.0  # reserve_for_graph_mb: no prefill graph on the CPU
    else:
        graphs_off = bool(a["disable_cuda_graph"])
        max_bs = a["cuda_graph_max_bs_decode"]
        if max_bs is None:
            max_bs = bs_small if tp < 4 else bs_large
            rules["cuda_graph_max_bs"] = "gpu-memory-rule"
            if a["max_running_requests"] is not None and max_bs > a["max_running_requests"]:
                max_bs, rules["cuda_graph_max_bs"] = a["max_running_requests"], "max-running-cap"
        else:
            rules["cuda_graph_max_bs"] = "flag"
        if a["cuda_graph_bs_decode"]:
            max_bs = max(a["cuda_graph_bs_decode"])
        graph_reserve = (
            0.0 if graphs_off else max_bs * 2 + len(prefill_graph_sizes(size if chunked else 0)) * 8
        )
    frac = a["mem_fraction_static"]
    if frac is None:
        activation = max(size if chunked else int(a["max_prefill_tokens"]), 2048)
        reserved = 512 + activation * 1.5 + tp * pp / 8 * 1024 + graph_reserve
        if mem > 60 * GIB:
            reserved = max(reserved, 10 * GIB)
        frac, rules["memory_fraction"] = round((mem - reserved) / mem, 3), "reserved-memory-rule"
        if frac <= 0.0:
            device = "machine" if cpu else "GPU"
            raise ResolutionError(
                f"--mem-fraction-static: not given, and SGLang's reserved-memory rule reserves "
                f"{reserved:.0f} MiB of the {device}'s {mem:.0f} MiB (fraction {frac}); the engine "
                "cannot start: give --mem-fraction-static (--max-total-tokens does not enter the "
                "rule)"
            )
    else:
        frac, rules["memory_fraction"] = float(frac), "flag"
    if not 0.0 < frac < 1.0:
        raise ResolutionError(f"--mem-fraction-static={frac}: must be between 0 and 1")
    context_len = model_len(a["context_length"], max_pos, "--context-length")
    prefix = not a["disable_radix_cache"]
    policy = a["schedule_policy"]
    rules["schedule_policy"] = "flag" if f.is_given("schedule_policy") else "default"
    if not prefix and policy in ("lpm", "dfs-weight"):
        policy, rules["schedule_policy"] = "fcfs", "no-radix-cache-fallback"
    sglang.check_positive_counts(a)

    def given(dest: str, default: str) -> str:
        return "flag" if f.is_given(dest) else default

    rules.update(
        token_budget=given("max_prefill_tokens", "default"),
        prefix_caching=given("disable_radix_cache", "default"),
        max_running_requests=given("max_running_requests", "run-time-pool-rule"),
        context_len=given("context_length", "model-max-position"),
    )
    return ResolvedConfig(
        engine="sglang_v05",
        version=version,
        printed_version=None,
        **sglang.model_fields(a),
        tensor_parallel_size=tp,
        gpu_memory_mib=gpu_memory_mib,
        **sglang.prefill_fields(a, chunked=chunked, rule=rules["chunked_prefill"], size=size),
        prefix_caching=prefix,
        context_len=context_len,
        schedule_policy=policy,
        **sglang.pool_fields(a),
        memory_fraction=frac,
        cuda_graph_max_bs=None if graphs_off else int(max_bs),
        overlap_schedule=not a["disable_overlap_schedule"],
        flags=f.flags,
        rules=rules,
    )


def runtime_limits(resolved: ResolvedConfig, kv_capacity_tokens: int) -> RuntimeLimits:
    """kv_cache_configurator.py::resolve_max_num_reqs, and the prompt limit of 0.4.1 (docstring)."""
    total = sglang.pool_tokens(resolved, kv_capacity_tokens)
    if resolved.max_running_requests is None:
        running = min(max(min(int(total / resolved.context_len * 512), 4096), 2048), total // 2)
    else:
        running = min(max(1, resolved.max_running_requests), total // 2)
    return sglang.pool_limits(resolved, kv_capacity_tokens, running)


# ------------------------------------------------------------------------------ start-up log

# 0.5's markers, from the one SGLang marker table (servelab.engines.sglang.MARKER).
MARKERS = tuple(
    sglang.MARKER[name]
    for name in (
        "server_args_any",
        "max_total_tokens",
        "ready",
        "batch_any",
        "load_weight",
        "kv_cache",
        "scheduler_exception",
        "sigquit",
    )
)
MARKER_WORDS = re.compile(
    r"server_args=|max_total_num_tokens=|ready to roll| batch[.,] |Load weight begin|"
    r"KV Cache is allocated|Scheduler hit an exception|Received sigquit"
)


def read_log(lines: list[LogLine]) -> Reader:
    """sglang.read_log (both server_args forms) plus the lines 0.5 adds."""
    r = sglang.read_log(lines)
    for line in lines:
        msg = line.msg
        if msg is None:
            continue
        if msg.startswith("server_args={") and (
            m := re.search(r"'decode': \{[^{}]*?'max_bs': (\d+)", msg)
        ):
            r.put("cuda_graph_max_bs", int(m.group(1)), line)
        elif m := re.match(r"KV Cache is allocated\. dtype: \S+, #tokens: (\d+),", msg):
            r.put("kv_cache_tokens", int(m.group(1)), line)
    return r


# ----------------------------------------------------------------------------------- metrics

# Canonical telemetry name -> SGLang 0.5.23 sample name (metrics_collector.py line numbers in
# docs/engines.md).
METRIC_MAP = {
    "kv_cache_usage": "sglang:token_usage",
    "requests_running": "sglang:num_running_reqs",
    "requests_waiting": "sglang:num_queue_reqs",
    "preemptions_total": "sglang:num_retracted_requests_total",
    "prompt_tokens_total": "sglang:prompt_tokens_total",
    "generation_tokens_total": "sglang:generation_tokens_total",
    "prefix_cache_hit_rate": "sglang:cache_hit_rate",
}
# The families servelab reads or whose absence it relies on (metric family name -> type).
METRICS = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:num_used_tokens": "gauge",
    "sglang:num_retracted_reqs": "gauge",
    "sglang:num_retracted_requests_total": "counter",
    "sglang:prompt_tokens_total": "counter",
    "sglang:generation_tokens_total": "counter",
    "sglang:cached_tokens_total": "counter",
    "sglang:num_requests_total": "counter",
    "sglang:num_aborted_requests_total": "counter",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:request_time_per_output_token_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
    "sglang:queue_time_seconds": "histogram",
    "sglang:func_latency_seconds": "histogram",
}


# ------------------------------------------------------------------ rendering its start-up log


def _server_args(r: ResolvedConfig, args: dict[str, Any]) -> str:
    """The resolved dict `server_args={...}` (engine.py), in ServerArgs field order. Fields no flag
    sets (bookkeeping, derived objects) are left out: the simulator knows no value for them."""
    values = dict(args)
    values["tokenizer_path"] = args["tokenizer_path"] or r.model
    values["served_model_name"] = r.served_model_name
    if values["random_seed"] is None:
        values["random_seed"] = int(token("sglang-seed", *r.flags)[:8], 16) % (1 << 30)
    values["mem_fraction_static"] = r.memory_fraction
    values["chunked_prefill_size"] = r.chunk_size if r.chunk_size is not None else -1
    values["schedule_policy"] = r.schedule_policy
    values["page_size"] = args["page_size"] or 1
    if r.cuda_graph_max_bs is not None:
        values["cuda_graph_config"] = {
            "decode": {
                "backend": "full",
                "max_bs": r.cuda_graph_max_bs,
                "bs": cuda_graph_sizes(r.cuda_graph_max_bs),
            },
            "prefill": {
                "backend": "breakable",
                "max_bs": r.chunk_size or 0,
                "bs": prefill_graph_sizes(r.chunk_size or 0),
            },
        }
    body = ", ".join(
        f"{name!r}: {values[name]!r}"
        for name in tables.SGLANG_0_5_23_SERVER_ARGS_FIELDS
        if name in values
    )
    return "server_args={" + body + "}"


def _weights_lines(
    dtype: str, avail_weights: float, weights_gib: float, kv_gib: float, kv_tokens: int
) -> list[str]:
    return [
        f"Load weight end. elapsed=8.12 s, type=LlamaForCausalLM, dtype={dtype}, "
        f"avail mem={avail_weights:.2f} GB, mem usage={weights_gib:.2f} GB.",
        f"KV Cache is allocated. dtype: {dtype}, #tokens: {kv_tokens}, "
        f"K size: {kv_gib / 2:.2f} GB, V size: {kv_gib / 2:.2f} GB",
    ]


def _pool_line(r: ResolvedConfig, limits: RuntimeLimits, avail_pool: float) -> str:
    return (
        f"max_total_num_tokens={limits.kv_capacity_tokens}, "
        f"chunked_prefill_size={r.chunk_size if r.chunk_size is not None else -1}, "
        f"max_prefill_tokens={r.token_budget}, "
        f"max_running_requests={limits.max_running_requests}, "
        f"context_len={r.context_len}, available_gpu_mem={avail_pool:.2f} GB"
    )


STARTUP_LOG_STYLE = sglang.StartupLogStyle(
    engine="sglang_v05",
    parsed=_parsed,
    runtime_limits=runtime_limits,
    # scheduler.py prefixes ` TP{n}` only when tp > 1
    rank_always=False,
    server_args=_server_args,
    weights_lines=_weights_lines,
    req_to_token_gib=None,
    captures_cuda_graph=lambda r, args: r.cuda_graph_max_bs is not None,
    capture_lines=lambda r: [],
    pool_line=_pool_line,
    model_info_path="/model_info",
    prefill_line=(
        "Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0, #pending-token: 0, "
    ),
)


# ------------------------------------------------------------------------------- the registry entry

# SGLang 0.4.1's entry with what 0.5.23 changed: its release, argument table, resolution, log
# markers and metrics. The record and ready lines, the entry point, the product and the OpenAI
# dialect the live sim server speaks (servelab's choice: 0.5.23's own server is not imitated
# there) stay 0.4.1's.
SPEC = dataclasses.replace(
    sglang.SPEC,
    name="sglang_v05",
    title="SGLang 0.5",
    family="0.5",
    family_versions=">=0.5,<0.6",
    releases=(VERSION,),
    version=VERSION,
    printed_version=None,
    flag_table=tables.SGLANG_0_5_23,
    required_flags=REQUIRED_FLAGS,
    resolve=resolve,
    runtime_limits=runtime_limits,
    log=dataclasses.replace(
        sglang.SPEC.log,
        markers=MARKERS,
        marker_words=MARKER_WORDS,
        marker_hint="'server_args={...}', 'max_total_num_tokens=...'",
        read=read_log,
        facts=(*sglang.SPEC.log.facts, "kv_cache_tokens"),
        family_marks=(
            re.compile(r"server_args=\{'model_path': "),
            re.compile(rf"server_args=ServerArgs\(.*\b{sglang.FIELDS_SINCE_0_5}="),
            # 0.4.x (to 0.4.10.post2) and 0.5.1 print "Prefill batch. #new-seq"
            re.compile(r"Prefill batch(?: \[\d+\])?, #new-seq"),
        ),
    ),
    metric_map=METRIC_MAP,
    metric_series=METRICS,
    # observability/metrics_collector.py (0.5.23): the token counters and latency histograms add
    # is_streaming, so streamed and unstreamed requests count in two series
    metric_part_labels=("is_streaming",),
    # created at the first retraction (prometheus_client's labelled counter has no series before
    # its first .labels()): a run with none, the normal case, has no such series
    metric_lazy=frozenset({"sglang:num_retracted_requests_total"}),
    # one renderer for both families, in this family's style
    render_startup_log=functools.partial(sglang.render_log, STARTUP_LOG_STYLE),
)
