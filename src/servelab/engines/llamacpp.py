"""llama.cpp's llama-server at commit 0c1e570 (the sources vendored in llama-cpp-python 0.3.36,
built by tools/build-llama-server.sh; it prints build "b1-0c1e570"): its flags, resolution rules,
start-up log and /metrics names.

Every fact below and in the comments cites its upstream source as "<path>, <function>": read each as
"llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), <path in the llama.cpp tree>, <function>".
docs/engines.md, "llama.cpp (llama-server)", has the full list.

Flags (common/arg.cpp, common_params_parser_init and common_params_parse_ex): llama.cpp's own
parser, not argparse. An option takes its value as the next token only (`--ctx-size=4096` and
abbreviations such as `--ctx` are refused: "error: invalid argument"); underscores in `--long_names`
become dashes; boolean options come in pairs (`--cache-prompt` / `--no-cache-prompt`, `-kvu` /
`-no-kvu`, `-cb` / `-nocb`, `--warmup` / `--no-warmup`) and take no value. `normalise_flags` turns
each pair into the table's `--name=true|false` and refuses what llama-server refuses.
Environment variables (LLAMA_ARG_*) are not read here.

Resolution, in the order llama-server applies it:
1. tools/server/server.cpp, llama_server: `-np` defaults to -1 (auto; common/arg.cpp,
   common_params_parser_init, `params.n_parallel = -1` for LLAMA_EXAMPLE_SERVER), which becomes
   4 slots with kv_unified = true (overriding `--no-kv-unified`); `--embedding` caps n_batch at
   n_ubatch; `--kv-unified-per-slot N` with no `-c` sizes n_ctx = n_parallel * N.
2. common/fit.cpp, common_params_fit_impl (with `--fit on`, the default): n_ctx 0 ("from the
   model") becomes n_ctx_train x n_streams, n_streams = 1 with a unified KV cache, else n_parallel.
   It lowers n_ctx only when host memory is short; the resolver assumes it is not (the log shows
   the real value). With `--fit off`, n_ctx 0 is n_ctx_train (step 3).
3. src/llama-context.cpp, llama_context::llama_context: n_seq_max = n_parallel; n_ctx 0 -> the
   model's n_ctx_train; n_batch = min(n_ctx, n_batch) (causal attention); n_ubatch =
   min(n_batch, n_ubatch or n_batch); n_ctx rounded up to a multiple of 256; n_ctx_seq = n_ctx
   when unified, else n_ctx / n_seq_max rounded up to 256 (and n_ctx = n_ctx_seq x n_seq_max).
4. tools/server/server-context.cpp, server_context_impl::n_ctx_slot: a slot's context is
   min(n_ctx_seq, --kv-unified-per-slot if set, n_ctx_train). This is `context_len`.

Chunked prefill: server-context.cpp, update_slots builds one batch of at most n_batch tokens per
iteration: first one token for every generating slot, then prompt tokens of the slots still
prefilling, a prompt that does not fit being cut at the budget and continued next iteration
(`while (slot.prompt.n_tokens() < slot.task->n_tokens() && batch.size() < n_batch)`). So a
prompt longer than n_batch is always processed in pieces interleaved with other slots' decoding;
servelab calls that chunked prefill, on iff n_batch < n_ctx_slot (a prompt that long can reach a
slot), rule "n_batch-rule". With n_batch >= n_ctx_slot a lone prompt is never split, but one that
meets a nearly full batch still is: llama-server has no setting that never splits.

Scheduling (server-context.cpp, get_available_slot; tools/server/server-queue.cpp,
server_queue::defer / pop_deferred_task): tasks are taken in arrival order; a task with no free
slot is deferred to the back of a queue that is popped from the front when a slot is released:
fcfs. Among free slots the one whose cached prompt shares the longest prefix (above
--slot-prompt-similarity) is chosen, else the least recently used.

Start-up log (common/log.cpp, common_log_entry::print; common_init sets prefix and timestamps):
`M.SS.mmm.uuu L message`, L one of I W E D, on stderr. The llama library's own INFO lines
(llama_context:, print_info:, ...) are passed at verbosity 4 (common/log.cpp,
common_log_get_verbosity: GGML_LOG_LEVEL_INFO -> LOG_LEVEL_TRACE), so n_batch is printed only
at `-lv 4` or more; at the default 3 the log shows the server's "initializing, n_slots = N,
n_ctx_slot = M, kv_unified = '...'" line but not n_batch, and chunked prefill is not confirmed.
`render_startup_log` prints those lines for a resolved configuration (the simulator's llama-server,
servelab.sim.llamacpp), each at the verbosity the real server prints it; `server_settings` gives
what the server runs with beyond ResolvedConfig's fields (n_ubatch, the KV layout, the prompt
cache's limit), by the same rules.

/metrics (tools/server/server-task.cpp, server_task_result_metrics::to_metrics; `--metrics`):
`llamacpp:*` counters and gauges with no labels. No KV-cache usage gauge, no preemption counter,
no prefix-cache hit rate: those canonical names are absent from METRIC_MAP.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from servelab.engines.base import (
    EngineFlags,
    FlagError,
    ParsedLog,
    ResolutionError,
    ResolvedConfig,
    RuntimeLimits,
)
from servelab.engines.cmdline import parse_table
from servelab.engines.logtext import LogLine, Reader
from servelab.engines.spec import EngineSpec, LogFormat, OpenAIDialect

__all__ = [
    "HTTP_DYNAMIC_THREADS",
    "HTTP_IDLE_TIMEOUT_S",
    "SERVER_START",
    "SPEC",
    "ServerSettings",
    "http_threads",
    "log_seconds",
    "mask_timestamps",
    "micro_batch",
    "render_startup_log",
    "server_settings",
    "startup_probe_flags",
]

VERSION = "0c1e570"
# llama_build_info() (common/build-info.cpp.in): "b" + LLAMA_BUILD_NUMBER + "-" + LLAMA_COMMIT.
PRINTED_VERSION = "b1-0c1e570"
AUTO_SLOTS = 4  # tools/server/server.cpp, llama_server: n_parallel auto -> 4, kv_unified = true
CTX_PAD = 256  # src/llama-context.cpp, llama_context::llama_context: GGML_PAD(n_ctx, 256)
MAX_SEQ = 256  # src/llama-cparams.h, LLAMA_MAX_SEQ
# The lowest --log-verbosity at which llama-server prints n_batch (module docstring).
VERBOSITY_SHOWING_N_BATCH = 4


def startup_probe_flags(flags: Sequence[str]) -> list[str] | None:
    """The flags of a start-up-only launch whose log shows n_batch, or None when `flags` already
    print it.

    n_batch is a llama library INFO line, printed only at trace verbosity (module docstring). At
    that verbosity the server also traces its host prompt cache on every task: server_prompt_cache
    ::load prints one line per cached prompt and server_prompt_cache::update lists every entry
    (tools/server/server-task.cpp, SRV_TRC), and the cache keeps up to --cache-ram MiB of prompts
    (8,192 by default), thousands of them for a small model. Each task then costs time that grows
    with the server's history: docs/benchmarks/llamacpp-trace-cost.md measures it. So a deployment
    is measured at the verbosity its flags give, and its resolution is read from one start with the
    same flags at verbosity 4, which serves nothing (llama-server's parser keeps the last
    `--log-verbosity`: common/arg.cpp, common_params_parse_ex runs each option's handler in order).
    """
    verbosity = int(
        parse_table("llamacpp", FLAG_TABLE, flags, normalise=normalise_flags).args["verbosity"]
    )
    if verbosity >= VERBOSITY_SHOWING_N_BATCH:
        return None
    return [*flags, f"--log-verbosity={VERBOSITY_SHOWING_N_BATCH}"]


# ------------------------------------------------------------------------------------ flags

# is_truthy / is_falsey / is_autoy (common/arg.cpp): the values -fa and -fit accept.
_TRUTHY = ("on", "enabled", "true", "1")
_FALSEY = ("off", "disabled", "false", "0")
_AUTOY = ("auto", "-1")

# (option strings, dest, kind, type, default, nargs, const, choices) as cmdline.parse_table reads
# them, in common/arg.cpp's order, with common_params' defaults (common/common.h) and the server's
# own (common_params_parser_init). Boolean pairs are one `store_boolean` each, fed by
# normalise_flags.
FLAG_TABLE: tuple[tuple[Any, ...], ...] = (
    (("-t", "--threads"), "threads", "store", "int", -1, None, None, None),
    (("-c", "--ctx-size"), "ctx_size", "store", "int", 0, None, None, None),
    (("--kv-unified-per-slot",), "kv_unified_per_slot", "store", "int", 0, None, None, None),
    (("-n", "--predict", "--n-predict"), "n_predict", "store", "int", -1, None, None, None),
    (("-b", "--batch-size"), "batch_size", "store", "int", 2048, None, None, None),
    (("-ub", "--ubatch-size"), "ubatch_size", "store", "int", 512, None, None, None),
    (("-cram", "--cache-ram"), "cache_ram", "store", "int", 8192, None, None, None),
    (("--kv-unified",), "kv_unified", "store_boolean", None, False, "?", "True", None),
    (
        ("-fa", "--flash-attn"),
        "flash_attn",
        "store",
        "str",
        "auto",
        None,
        None,
        _TRUTHY + _FALSEY + _AUTOY,
    ),
    (("--warmup",), "warmup", "store_boolean", None, True, "?", "True", None),
    (("-np", "--parallel"), "parallel", "store", "int", -1, None, None, None),
    (("--cont-batching",), "cont_batching", "store_boolean", None, True, "?", "True", None),
    (("-fit", "--fit"), "fit", "store", "str", "on", None, None, _TRUTHY + _FALSEY),
    (("-a", "--alias"), "alias", "store", "str", None, None, None, None),
    (("-m", "--model"), "model", "store", "str", None, None, None, None),
    (("--host",), "host", "store", "str", "127.0.0.1", None, None, None),
    (("--port",), "port", "store", "int", 8080, None, None, None),
    (("--embedding", "--embeddings"), "embedding", "store_true", None, False, None, None, None),
    (("--cache-prompt",), "cache_prompt", "store_boolean", None, True, "?", "True", None),
    (("--cache-reuse",), "cache_reuse", "store", "int", 0, None, None, None),
    (("--metrics",), "metrics", "store_true", None, False, None, None, None),
    (("-lv", "--verbosity", "--log-verbosity"), "verbosity", "store", "int", 3, None, None, None),
    (("--threads-http",), "threads_http", "store", "int", -1, None, None, None),
)

# Both spellings of each boolean pair (common_arg's args and args_neg) -> (table option, value).
_BOOL_SPELLINGS: dict[str, tuple[str, bool]] = {
    "-kvu": ("--kv-unified", True),
    "--kv-unified": ("--kv-unified", True),
    "-no-kvu": ("--kv-unified", False),
    "--no-kv-unified": ("--kv-unified", False),
    "--warmup": ("--warmup", True),
    "--no-warmup": ("--warmup", False),
    "-cb": ("--cont-batching", True),
    "--cont-batching": ("--cont-batching", True),
    "-nocb": ("--cont-batching", False),
    "--no-cont-batching": ("--cont-batching", False),
    "--cache-prompt": ("--cache-prompt", True),
    "--no-cache-prompt": ("--cache-prompt", False),
}
_KNOWN_OPTIONS = frozenset(s for row in FLAG_TABLE for s in row[0]) | frozenset(_BOOL_SPELLINGS)


def normalise_flags(tokens: Sequence[str]) -> list[str]:
    """Rewrite tokens as llama-server's parser reads them (common_params_parse_ex).

    `--long_name` underscores become dashes; a boolean spelling becomes `--name=true|false`, so a
    following token is never taken as its value. `--option=value` (servelab's config form) is read
    as `--option value`, as the backend passes it; a switch given a value, and abbreviations of
    known options, are refused (FlagError), as llama-server refuses them ("error: invalid
    argument").
    """
    out: list[str] = []
    for tok in tokens:
        if tok.startswith("--"):
            tok = tok.replace("_", "-")
        if tok in _BOOL_SPELLINGS:
            option, value = _BOOL_SPELLINGS[tok]
            out.append(f"{option}={'true' if value else 'false'}")
            continue
        if tok.startswith("--") and tok not in _KNOWN_OPTIONS:
            name = tok.partition("=")[0]
            if "=" in tok and name in _KNOWN_OPTIONS:
                if name in _BOOL_SPELLINGS:
                    raise FlagError(
                        f"llamacpp: {tok!r}: {name} is a switch and takes no value in "
                        "llama-server; write it alone (or its negation)"
                    )
                # servelab's config spells every flag --name=value; the backend passes it to
                # llama-server as two tokens (servelab.deploy.llama_server.server_command),
                # the only form llama-server's parser takes.
                out += [name, tok.partition("=")[2]]
                continue
            prefixed = sorted(o for o in _KNOWN_OPTIONS if o.startswith(tok))
            if prefixed:
                raise FlagError(
                    f"llamacpp: {tok!r}: llama-server matches options exactly and refuses this "
                    f"abbreviation ('error: invalid argument'); did you mean {prefixed[0]}?"
                )
        out.append(tok)
    return out


# ------------------------------------------------------------------------------- resolution


def _pad(n: int, to: int = CTX_PAD) -> int:
    return (n + to - 1) // to * to


def micro_batch(n_batch: int, n_ubatch: int) -> int:
    """The resolved n_ubatch: min(n_batch, n_ubatch or n_batch) (src/llama-context.cpp,
    llama_context::llama_context), with n_batch already resolved."""
    return min(n_batch, n_ubatch or n_batch)


def resolve(
    f: EngineFlags, *, gpu_memory_mib: int, max_pos: int, version: str, gpu_name: str = ""
) -> ResolvedConfig:
    """llama-server's configuration from its flags (module docstring, steps 1-4). `max_pos` is the
    model's n_ctx_train (GGUF `<arch>.context_length`); `gpu_memory_mib` plays no part (CPU)."""
    a = f.args
    n_ctx_train = max_pos
    n_parallel = int(a["parallel"])
    if n_parallel == 0:  # common/arg.cpp, the -np handler
        raise ResolutionError(
            "--parallel=0: llama-server refuses it (invalid value for n_parallel)"
        )
    kv_unified = bool(a["kv_unified"])
    n_batch, n_ubatch = int(a["batch_size"]), int(a["ubatch_size"])
    if n_batch < 1:
        raise ResolutionError(
            f"--batch-size={n_batch}: llama.cpp would resolve n_batch = min(n_ctx, {n_batch}) "
            "and could not decode a prompt"
        )
    if n_ubatch < 0:
        raise ResolutionError(f"--ubatch-size={n_ubatch}: must be >= 0 (0 = the batch size)")
    # step 1: tools/server/server.cpp, llama_server
    if a["embedding"] and n_ubatch and n_batch > n_ubatch:
        n_batch = n_ubatch
    if n_parallel < 0:
        n_parallel, kv_unified = AUTO_SLOTS, True
    if n_parallel > MAX_SEQ:
        raise ResolutionError(f"--parallel={n_parallel}: n_seq_max must be <= {MAX_SEQ}")
    n_ctx = int(a["ctx_size"])
    if n_ctx < 0:
        raise ResolutionError(f"--ctx-size={n_ctx}: must be >= 0 (0 = the model's context)")
    per_slot = int(a["kv_unified_per_slot"])
    # `-c 0` given explicitly sets fit_params_min_ctx = UINT32_MAX, which keeps the pool unsized.
    if per_slot > 0 and n_ctx == 0 and not f.is_given("ctx_size"):
        n_ctx = n_parallel * per_slot
    # step 2: common/fit.cpp, common_params_fit_impl
    if n_ctx == 0 and a["fit"] in _TRUTHY:
        n_ctx = n_ctx_train * (1 if kv_unified else n_parallel)
    # step 3: src/llama-context.cpp, llama_context::llama_context
    if n_ctx == 0:
        n_ctx = n_ctx_train
    n_seq_max = max(1, n_parallel)
    n_batch = min(n_ctx, n_batch)
    n_ubatch = micro_batch(n_batch, n_ubatch)
    n_ctx = _pad(n_ctx)
    if kv_unified:
        n_ctx_seq = n_ctx
    else:
        n_ctx_seq = _pad(n_ctx // n_seq_max)
        n_ctx = n_ctx_seq * n_seq_max
    # step 4: tools/server/server-context.cpp, n_ctx_slot
    n_ctx_slot = min(n_ctx_seq, per_slot) if per_slot > 0 else n_ctx_seq
    n_ctx_slot = min(n_ctx_slot, n_ctx_train)
    chunked = n_batch < n_ctx_slot
    aliases = sorted(s.strip() for s in (a["alias"] or "").split(",") if s.strip())
    model = a["model"] or ""
    return ResolvedConfig(
        engine="llamacpp",
        version=version,
        printed_version=PRINTED_VERSION,
        model=model,
        # server-context.cpp, load_model: the first alias of the (ordered) set, else the path
        served_model_name=aliases[0] if aliases else model,
        dtype="auto",  # the weights' types come from the GGUF file; llama-server has no flag
        tensor_parallel_size=1,
        gpu_memory_mib=gpu_memory_mib,
        chunked_prefill=chunked,
        chunked_prefill_rule="n_batch-rule",
        chunk_size=n_batch if chunked else None,
        token_budget=n_batch,
        prefix_caching=bool(a["cache_prompt"]),
        context_len=n_ctx_slot,
        schedule_policy="fcfs",
        max_num_seqs=n_parallel,
        max_running_requests=n_parallel,
        max_total_tokens=n_ctx,
        block_size=None,
        memory_fraction=None,
        cuda_graph_max_bs=None,
        overlap_schedule=None,
        flags=f.flags,
    )


@dataclass(frozen=True)
class ServerSettings:
    """What llama-server runs with beyond `ResolvedConfig`'s fields, derived from the resolved
    configuration and its flags by the rules `resolve` applies (module docstring, steps 1-4).

    `n_ubatch` is llama_context's micro-batch; `kv_unified` whether the slots share one KV stream
    (auto slots force it on); `n_ctx_seq` a stream's cells; `cache_ram_mib` the host-memory prompt
    cache's limit (-1 no limit, 0 disabled; common/common.h, common_params::cache_ram_mib);
    `slot_prompt_similarity` the server's default 0.1 (common/common.h,
    common_params::slot_prompt_similarity; `-sps` is not in FLAG_TABLE); `flash_attn` as
    llama_context prints it (auto, enabled, disabled); `http_threads` the HTTP pool's fixed
    threads (`http_threads`).
    """

    n_parallel: int
    parallel_auto: bool
    kv_unified: bool
    n_ctx: int
    n_ctx_seq: int
    n_ctx_slot: int
    n_batch: int
    n_ubatch: int
    cache_ram_mib: int
    slot_prompt_similarity: float
    verbosity: int
    flash_attn: str
    threads: int
    http_threads: int
    warmup: bool
    host: str
    port: int


SLOT_PROMPT_SIMILARITY = 0.1  # common/common.h, common_params::slot_prompt_similarity

# The HTTP pool (tools/server/server-http.cpp, server_http_context::start): a cpp-httplib
# ThreadPool of `http_threads` fixed threads "plus up to 1024 dynamic threads destroyed after each
# request"; a dynamic thread left idle exits after CPPHTTPLIB_THREAD_POOL_IDLE_TIMEOUT seconds
# (vendor/cpp-httplib/httplib.h; httplib.cpp, ThreadPool::worker).
HTTP_DYNAMIC_THREADS = 1024
HTTP_IDLE_TIMEOUT_S = 3.0


def http_threads(n_parallel: int, threads_http: int, host_cpus: int | None = None) -> int:
    """The HTTP pool's fixed threads: `--threads-http` when at least 1, else
    max(n_parallel + 4, hardware_concurrency - 1) (tools/server/server-http.cpp,
    server_http_context::init). `host_cpus` is hardware_concurrency, the host's CPUs (not the
    engine's affinity); None counts a host of at most n_parallel + 5 CPUs, where the first term
    wins (the CPU pair's 2-core machine)."""
    if threads_http >= 1:
        return threads_http
    return max(n_parallel + 4, (host_cpus or 0) - 1)


def server_settings(resolved: ResolvedConfig) -> ServerSettings:
    """`resolved`'s llama-server settings (see ServerSettings)."""
    if resolved.engine != "llamacpp":
        raise ValueError(f"server_settings: a llamacpp configuration, got {resolved.engine!r}")
    a = parse_table("llamacpp", FLAG_TABLE, resolved.flags, normalise=normalise_flags).args
    assert resolved.max_total_tokens is not None
    parallel_auto = int(a["parallel"]) < 0
    n_parallel = AUTO_SLOTS if parallel_auto else int(a["parallel"])
    kv_unified = True if parallel_auto else bool(a["kv_unified"])
    n_ctx = int(resolved.max_total_tokens)
    n_batch = int(resolved.token_budget)
    fa = str(a["flash_attn"])
    return ServerSettings(
        n_parallel=n_parallel,
        parallel_auto=parallel_auto,
        kv_unified=kv_unified,
        n_ctx=n_ctx,
        n_ctx_seq=n_ctx if kv_unified else n_ctx // max(1, n_parallel),
        n_ctx_slot=int(resolved.context_len),
        n_batch=n_batch,
        n_ubatch=micro_batch(n_batch, int(a["ubatch_size"])),
        cache_ram_mib=int(a["cache_ram"]),
        slot_prompt_similarity=SLOT_PROMPT_SIMILARITY,
        verbosity=int(a["verbosity"]),
        # src/llama-context.cpp, llama_context::llama_context prints llama_flash_attn_type_name
        flash_attn="enabled" if fa in _TRUTHY else "disabled" if fa in _FALSEY else "auto",
        threads=int(a["threads"]),
        http_threads=http_threads(n_parallel, int(a["threads_http"])),
        warmup=bool(a["warmup"]),
        host=str(a["host"]),
        port=int(a["port"]),
    )


def runtime_limits(resolved: ResolvedConfig, kv_capacity_tokens: int) -> RuntimeLimits:
    """llama-server allocates n_ctx KV cells (`llama_kv_cache: ... (N cells, ...)`), bounded here
    by `kv_capacity_tokens`; every slot runs at once; a prompt must be shorter than n_ctx_slot
    (server-context.cpp, update_slots: "request (N tokens) exceeds the available context size")."""
    assert resolved.max_total_tokens is not None and resolved.max_running_requests is not None
    cells = min(kv_capacity_tokens, resolved.max_total_tokens)
    return RuntimeLimits(
        kv_capacity_tokens=cells,
        num_gpu_blocks=None,
        max_running_requests=resolved.max_running_requests,
        prompt_limit=resolved.context_len - 1,
        max_concurrency=cells / resolved.context_len,
    )


# ------------------------------------------------------------------------------ start-up log

# common/log.cpp, common_log_entry::print: "[M.SS.mmm.uuu ]L message" (the elapsed time since
# start; the level letter I, W, E or D). Continuation records (LOG_CNT) carry no prefix.
_STAMP = r"\d+\.\d\d\.\d{3}\.\d{3}"
RECORD = re.compile(rf"(?:^|[\s|]){_STAMP} (?P<level>[IWED]) (?P<msg>.*)$")
# Messages only llama-server's start-up prints (SRV_INF/COM_INF and llama_context lines).
MARKERS = (
    re.compile(r"srv +llama_server: initializing \.\.\.$"),
    re.compile(r"cmn +common_param: common_params_print_info: verbosity = \d+ "),
    re.compile(r"srv +load_model: loading model '"),
    re.compile(r"srv +load_model: initializing, n_slots = \d+, n_ctx_slot = \d+, kv_unified = "),
    re.compile(r"srv +llama_server: model loaded$"),
    re.compile(r"srv +llama_server: listening on "),
    re.compile(r"llama_context: n_batch += \d+$"),
)
MARKER_WORDS = re.compile(r"srv |cmn |llama_context: ")
# The first line a llama-server start prints (tools/server/server.cpp, main: SRV_INF
# "initializing ..."): in a log that several starts appended to, it opens each start's lines.
SERVER_START = MARKERS[0]
_STAMP_FIELDS = re.compile(r"(?:^|[\s|])(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) [IWED] ")


def log_seconds(line: str) -> float | None:
    """The seconds since the server started at which it printed `line`, from the line's stamp
    (common/log.cpp, common_log_entry::print: M.SS.mmm.uuu), or None for a line without one
    (a continuation record)."""
    match = _STAMP_FIELDS.search(line)
    if match is None:
        return None
    minutes, seconds, ms, us = (int(x) for x in match.groups())
    return minutes * 60.0 + seconds + ms / 1e3 + us / 1e6


READY = re.compile(rf"{_STAMP} I srv +llama_server: listening on (?:https?|unix)://")

_INTERESTING = re.compile(
    r"llama_context: n_|llama_context: (?:causal_attn|flash_attn|kv_unified) |"
    r"srv +load_model: |cmn +common_param: common_params_print_info: |print_info: n_ctx_train "
)
_CONTEXT_LINE = re.compile(r"llama_context: (n_seq_max|n_ctx|n_ctx_seq|n_batch|n_ubatch) += (\d+)$")


def read_log(lines: list[LogLine]) -> Reader:
    r = Reader()
    batch_line: LogLine | None = None
    slot_line: LogLine | None = None
    for line in lines:
        msg = line.msg
        if msg is None or not _INTERESTING.match(msg):
            continue
        if m := _CONTEXT_LINE.match(msg):
            r.put(m.group(1), int(m.group(2)), line)
            if m.group(1) == "n_batch":
                batch_line = line
        elif m := re.match(r"llama_context: flash_attn += (auto|enabled|disabled)$", msg):
            r.put("flash_attn", m.group(1), line)
        elif m := re.match(r"llama_context: kv_unified += (true|false)$", msg):
            r.put("kv_unified", m.group(1) == "true", line)
        elif m := re.match(r"print_info: n_ctx_train += (\d+)$", msg):
            r.put("n_ctx_train", int(m.group(1)), line)
        elif m := re.match(
            r"srv +load_model: initializing, n_slots = (\d+), n_ctx_slot = (\d+), "
            r"kv_unified = '(true|false)'$",
            msg,
        ):
            slot_line = line
            r.put("n_slots", int(m.group(1)), line)
            r.put("n_ctx_slot", int(m.group(2)), line)
            r.put("kv_unified", m.group(3) == "true", line)
            r.put("context_len", int(m.group(2)), line)
        elif m := re.match(
            r"srv +load_model: prompt cache is enabled, size limit: (\d+) MiB$", msg
        ):
            r.put("cache_ram_mib", int(m.group(1)), line)
        elif msg.rstrip().endswith("prompt cache is enabled, size limit: no limit"):
            r.put("cache_ram_mib", -1, line, "no limit (--cache-ram -1)")
        elif re.match(r"srv +load_model: prompt cache is disabled", msg):
            r.put("cache_ram_mib", 0, line, "the prompt cache is disabled (--cache-ram 0)")
        elif re.match(r"srv +load_model: cache_reuse is not supported by ", msg):
            r.put("cache_reuse", 0, line, "llama-server disabled --cache-reuse for this context")
        elif m := re.match(
            r"cmn +common_param: common_params_print_info: build (\d+) \(([0-9a-f]+|unknown)\) ",
            msg,
        ):
            r.put(
                "version",
                f"b{m.group(1)}-{m.group(2)}",
                line,
                "composed as llama_build_info() does: b<build number>-<commit>",
            )
        elif m := re.match(r"cmn +common_param: common_params_print_info: verbosity = (\d+) ", msg):
            r.put("verbosity", int(m.group(1)), line)

    # chunked prefill: a prompt longer than n_batch is split (module docstring); it needs both the
    # resolved n_batch (printed at -lv >= 4 only) and the slot context. Not shown: not confirmed.
    if batch_line is not None and slot_line is not None:
        n_batch, n_ctx_slot = r.values["n_batch"], r.values["n_ctx_slot"]
        chunked = n_batch < n_ctx_slot
        note = f"n_batch = {n_batch} {'<' if chunked else '>='} n_ctx_slot = {n_ctx_slot} " + (
            f"(line {slot_line.no}): a prompt longer than n_batch is split into n_batch-token "
            "pieces"
            if chunked
            else f"(line {slot_line.no}): a prompt a slot accepts fits in one batch"
        )
        r.put("chunked_prefill", chunked, batch_line, note)
        if chunked:
            r.put("chunk_size", n_batch, batch_line, note)
    return r


# Log levels of common/log.h: a record is printed when its level <= --log-verbosity. LOG_INF is
# INFO; LOG_TRC (SRV_TRC, SLT_TRC) and the llama library's INFO lines are TRACE (common/log.cpp,
# common_log_get_verbosity: GGML_LOG_LEVEL_INFO -> LOG_LEVEL_TRACE).
_WARN, _INFO, _TRACE = 2, 3, 4


def _elapsed(us: int) -> str:
    """common/log.cpp, common_log_entry::print: minutes.seconds.milliseconds.microseconds."""
    return f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"


def render_startup_log(
    r: ResolvedConfig, kv_tokens: int, weights_gib: float, t0: datetime, kv_bytes: int
) -> list[str]:
    """llama-server's stderr up to its readiness line, as the real build prints it for `r`'s flags
    (the captured tests/data/engine-logs/llamacpp-0c1e570-*.log): every line `read_log` reads, at
    the verbosity the flags set. As on the real server, the llama library's `llama_context:` lines
    (n_batch among them) appear only at `--log-verbosity 4` or more, so at the default 3 the log
    does not confirm chunked prefill. `t0` plays no part: llama-server stamps each line with the
    time elapsed since start (fixed illustrative offsets here). `kv_tokens` is the KV cells
    allocated (n_ctx) and `kv_bytes` the bytes one token's K and V take; the model's own lines
    (GGUF metadata, `print_info:`) are not rendered: the resolved configuration does not hold them.
    Machine-specific lines (device and system info, thread counts not given by a flag) are left out.
    """
    del t0
    st = server_settings(r)
    lines: list[str] = []

    def log(ms: float, level: int, message: str) -> None:
        if level <= st.verbosity:
            letter = "W" if level == _WARN else "I"
            lines.append(f"{_elapsed(round(ms * 1000))} {letter} {message}")

    log(1.2, _INFO, "srv  llama_server: initializing ...")
    # common/common.cpp, common_params_print_info (build line: TRACE; verbosity line: INFO)
    build, _, commit = PRINTED_VERSION.removeprefix("b").partition("-")
    log(
        3.3,
        _TRACE,
        f"cmn  common_param: common_params_print_info: build {build} ({commit}) with GNU 12.2.0 for "
        "Linux x86_64",
    )
    log(
        3.3,
        _INFO,
        f"cmn  common_param: common_params_print_info: verbosity = {st.verbosity} "
        "(adjust with the `-lv N` CLI arg)",
    )
    if st.parallel_auto:  # tools/server/server.cpp, llama_server
        log(
            3.4,
            _TRACE,
            f"srv  llama_server: n_parallel is set to auto, using n_parallel = {st.n_parallel} "
            "and kv_unified = true",
        )
    log(3.5, _TRACE, "srv  init_listene: running without SSL")
    log(
        3.6,
        _WARN,
        "srv  llama_server: security: no API key is set and CORS allows all origins "
        "(see https://github.com/ggml-org/llama.cpp/pull/25655)",
    )
    log(5.1, _INFO, f"srv    load_model: loading model '{r.model}'")
    log(5.1, _TRACE, f"srv    load_model: local path '{r.model}'")
    log(
        1352.7,
        _TRACE,
        f"load_tensors:   CPU_Mapped model buffer size = {weights_gib * 1024:8.2f} MiB",
    )
    # src/llama-context.cpp, llama_context::llama_context
    log(1357.1, _TRACE, "llama_context: constructing llama_context")
    for ms, name, value in (
        (1357.12, "n_seq_max", str(max(1, st.n_parallel))),
        (1357.14, "n_ctx", str(st.n_ctx)),
        (1357.15, "n_ctx_seq", str(st.n_ctx_seq)),
        (1357.17, "n_batch", str(st.n_batch)),
        (1357.18, "n_ubatch", str(st.n_ubatch)),
        (1357.20, "causal_attn", "1"),
        (1357.21, "flash_attn", st.flash_attn),
        (1357.23, "kv_unified", "true" if st.kv_unified else "false"),
    ):
        log(ms, _TRACE, f"llama_context: {name:<21} = {value}")
    log(
        1357.5,
        _TRACE,
        f"llama_kv_cache:        CPU KV buffer size = {kv_tokens * kv_bytes / 2**20:8.2f} MiB",
    )
    if st.threads > 0:
        log(1358.5, _INFO, f"cmn          init: llama threadpool init, n_threads = {st.threads}")
    if st.warmup:
        log(
            1358.6,
            _TRACE,
            "cmn  common_init_: warming up the model with an empty run - please wait ... "
            "(--no-warmup to disable)",
        )
    # tools/server/server-context.cpp, load_model
    unified = "true" if st.kv_unified else "false"
    log(
        1821.3,
        _INFO,
        f"srv    load_model: initializing, n_slots = {st.n_parallel}, n_ctx_slot = "
        f"{st.n_ctx_slot}, kv_unified = '{unified}'",
    )
    for i in range(st.n_parallel):
        log(
            1821.33,
            _TRACE,
            f"slot   load_model: id {i:2d} | task -1 | new slot, n_ctx = {st.n_ctx_slot}",
        )
    if st.cache_ram_mib != 0:
        limit = "no limit" if st.cache_ram_mib < 0 else f"{st.cache_ram_mib} MiB"
        log(1821.34, _TRACE, f"srv    load_model: prompt cache is enabled, size limit: {limit}")
        log(1821.34, _TRACE, "srv    load_model: use `--cache-ram 0` to disable the prompt cache")
    else:
        log(
            1821.34,
            _TRACE,
            "srv    load_model: prompt cache is disabled - use `--cache-ram N` to enable it",
        )
    log(
        1821.34,
        _TRACE,
        "srv    load_model: for more info see https://github.com/ggml-org/llama.cpp/pull/16391",
    )
    # common/common.h: n_ctx_checkpoints 32, checkpoint_min_step 8192
    log(
        1821.34,
        _TRACE,
        "srv    load_model: context checkpoints enabled, max = 32, min spacing = 8192",
    )
    if st.cache_ram_mib != 0:  # tools/server/server-context.cpp, init (cache_idle_slots, on)
        cleared = " and cleared" if st.kv_unified else ""
        log(
            1821.35,
            _TRACE,
            f"srv          init: idle slots will be saved to prompt cache{cleared} upon starting "
            "a new task",
        )
    log(1824.5, _INFO, "srv  llama_server: model loaded")
    log(1824.6, _INFO, f"srv  llama_server: listening on http://{st.host}:{st.port}")
    return lines


_STAMP_AT_START = re.compile(rf"^{_STAMP} ")


def mask_timestamps(parsed: ParsedLog) -> dict[str, Any]:
    """`parsed.to_dict()` with the per-run elapsed-time prefix of every quoted line (evidence,
    failure) replaced by `M.SS.mmm.uuu`, so a golden file does not change between captures."""
    out = parsed.to_dict()
    out["evidence"] = {
        k: _STAMP_AT_START.sub("M.SS.mmm.uuu ", v) for k, v in out["evidence"].items()
    }
    if out["failure"] is not None:
        out["failure"] = _STAMP_AT_START.sub("M.SS.mmm.uuu ", out["failure"])
    return out


# ----------------------------------------------------------------------------------- metrics

# Canonical telemetry name -> llama-server sample name. Caveats (docs/engines.md): its
# prompt_tokens_total EXCLUDES prompt tokens reused from the cache (those are
# prompt_tokens_cached_total, llamacpp:prompt_tokens_cached_total); tokens_predicted_total
# grows when a request ends (metrics_on_prediction at slot release), not per token.
METRIC_MAP = {
    "requests_running": "llamacpp:requests_processing",
    "requests_waiting": "llamacpp:requests_deferred",
    "prompt_tokens_total": "llamacpp:prompt_tokens_total",
    "generation_tokens_total": "llamacpp:tokens_predicted_total",
    "prompt_tokens_cached_total": "llamacpp:prompt_tokens_cached_total",
}
# Every series llama-server 0c1e570 exports (as its # TYPE lines name them), with its type.
METRICS = {
    "llamacpp:prompt_tokens_total": "counter",
    "llamacpp:prompt_tokens_cached_total": "counter",
    "llamacpp:prompt_seconds_total": "counter",
    "llamacpp:tokens_predicted_total": "counter",
    "llamacpp:tokens_predicted_seconds_total": "counter",
    "llamacpp:n_decode_total": "counter",
    # typed counter without a _total suffix: prometheus_client's parser reports its sample as
    # llamacpp:n_tokens_max_total, Prometheus stores it as written
    "llamacpp:n_tokens_max": "counter",
    "llamacpp:spec_decode_num_draft_tokens_total": "counter",
    "llamacpp:spec_decode_num_accepted_tokens_total": "counter",
    "llamacpp:spec_decode_num_drafts_total": "counter",
    "llamacpp:prompt_tokens_seconds": "gauge",
    "llamacpp:predicted_tokens_seconds": "gauge",
    "llamacpp:requests_processing": "gauge",
    "llamacpp:requests_deferred": "gauge",
    "llamacpp:n_busy_slots_per_decode": "gauge",
    # only with speculative decoding, one series per draft position (label `position`)
    "llamacpp:spec_decode_num_accepted_tokens_per_pos_total": "counter",
}


# ------------------------------------------------------------------------------- the registry entry

SPEC = EngineSpec(
    name="llamacpp",
    title="llama.cpp",
    version=VERSION,
    printed_version=PRINTED_VERSION,
    # The commit, or the build string llama-server prints for it (what config/llamacpp.yaml gives).
    releases=(VERSION, PRINTED_VERSION),
    flag_table=FLAG_TABLE,
    normalise_flags=normalise_flags,
    resolve=resolve,
    runtime_limits=runtime_limits,
    log=LogFormat(
        record=RECORD,
        markers=MARKERS,
        marker_words=MARKER_WORDS,
        marker_hint="'srv  load_model: initializing, n_slots = ...', 'llama_context: n_batch = ...'",
        ready=READY,
        read=read_log,
        facts=(
            "n_ctx",
            "n_ctx_seq",
            "n_ctx_slot",
            "n_ctx_train",
            "n_batch",
            "n_ubatch",
            "n_seq_max",
            "n_slots",
            "kv_unified",
            "flash_attn",
            "cache_ram_mib",
            "cache_reuse",
            "verbosity",
        ),
    ),
    metric_map=METRIC_MAP,
    metric_series=METRICS,
    entrypoint=("llama-server",),
    # server-context.cpp, process_token: one partial response (SSE chunk) per sampled token; a
    # token ending inside a UTF-8 character or a possible stop string is held back and sent with
    # the next one.
    stream_interval=1,
    render_startup_log=render_startup_log,
    startup_probe=startup_probe_flags,
    # The live sim server's default dialect (SGLang 0.4.1's): llama-server's own OpenAI answers
    # are not imitated (the local backend always runs the real binary).
    openai=OpenAIDialect(),
    history_cost=(
        "llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36): llama-server keeps every "
        "prompt it served in its host prompt cache (--cache-ram 8192 MiB by default, "
        "common/common.h, holds thousands of a small model's prompts) and scans all of them on "
        "every task: get_available_slot saves the chosen slot and loads the best entry "
        "(tools/server/server-context.cpp), server_prompt_cache::alloc scans every entry twice "
        "and ::load once (tools/server/server-task.cpp), each comparing prompts with "
        "server_tokens::get_common_prefix (tools/server/server-common.cpp), and every idle slot "
        "is saved after each launch (process_single_task, cache_idle_slots)"
    ),
)
