"""Start-up logs in each engine's real line formats, rendered from a ResolvedConfig.

The simulator and the live sim server print exactly this text, so the one parser
(`logparse.parse_startup_log`) confirms the resolved configuration on every backend.

Formats (research/engines.md A2 and B2; line numbers from the vLLM 0.6.3 / SGLang 0.4.1 wheels):
- vLLM: `%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s` with date format
  `%m-%d %H:%M:%S`, the OpenAI server's sequence (version "dev", the unresolved
  `args: Namespace(...)`, the multiprocessing frontend, "Chunked prefill is enabled with
  max_num_batched_tokens=N." from both the frontend and the engine process, the engine-config line
  with its missing comma before `multi_step_stream_outputs`, weights, KV blocks, CUDA graphs, routes,
  uvicorn).
- SGLang: `[%Y-%m-%d %H:%M:%S] message` in the main process and `[... TP0] message` in the scheduler
  process: `server_args=ServerArgs(...)` (the resolved dataclass repr in field order), weights,
  memory pool, CUDA graphs, `max_total_num_tokens=..., max_prefill_tokens=...,
  max_running_requests=..., context_len=...`, uvicorn, the warm-up request, "ready to roll".

Run-time facts the caller supplies: the KV capacity, the weights' size and a fixed start time.
Everything else a real engine randomises (IPC path, PIDs, SGLang's random seed when not flagged)
is derived from the flags, so the same inputs always give the same bytes. Durations (weight
loading, graph capture) are fixed illustrative values; free-memory figures in SGLang's lines are
derived from the GPU memory, weights and pool sizes (a 0.5 GiB CUDA context is assumed).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from servelab.engines import _cli_tables
from servelab.engines.resolve import ResolvedConfig, runtime_limits

__all__ = ["render_startup_log"]

# Llama-3.1-8B in bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes (engines.md D).
LLAMA_31_8B_KV_BYTES_PER_TOKEN = 131072
_CUDA_CONTEXT_GIB = 0.5

_TORCH_DTYPES = {
    "auto": "torch.bfloat16",  # Llama-3.1's config.json says bfloat16
    "bfloat16": "torch.bfloat16",
    "half": "torch.float16",
    "float16": "torch.float16",
    "float": "torch.float32",
    "float32": "torch.float32",
}

# vLLM 0.6.3 api_server routes in registration order (FastAPI docs routes first; /metrics is a
# mount and is not listed).
_VLLM_ROUTES = (
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


def _token(*parts: object) -> str:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()


def _tqdm_shards(total: int, seconds: float) -> list[str]:
    """safetensors shard loading bars as vLLM's/SGLang's loaders print them (one line per update)."""
    lines = [f"Loading safetensors checkpoint shards:   0% Completed | 0/{total} [00:00<?, ?it/s]"]
    per = seconds / total
    for done in range(1, total + 1):
        pct = int(100 * done / total)
        elapsed = int(per * done)
        left = int(per * (total - done))
        lines.append(
            f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {done}/{total} "
            f"[00:{elapsed:02d}<00:{left:02d}, {1 / per:5.2f}it/s]"
        )
    lines.append(lines[-1])  # tqdm prints the final state again when it closes
    lines.append("")
    return lines


def render_startup_log(
    resolved: ResolvedConfig,
    *,
    kv_capacity_tokens: int,
    weights_gib: float,
    timestamp: datetime,
    kv_bytes_per_token: int = LLAMA_31_8B_KV_BYTES_PER_TOKEN,
) -> str:
    """The engine's start-up log for `resolved`, ending when the server is ready.

    `kv_capacity_tokens` is vLLM's num_gpu_blocks * block_size or SGLang's max_total_num_tokens
    (before --max-total-tokens caps it); `weights_gib` the loaded weights; `timestamp` the first
    line's time (later lines follow at fixed offsets).
    """
    if weights_gib <= 0:
        raise ValueError(f"weights_gib={weights_gib}: must be positive")
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token={kv_bytes_per_token}: must be positive")
    if resolved.engine == "vllm":
        text = _render_vllm(
            resolved, kv_capacity_tokens, weights_gib, timestamp, kv_bytes_per_token
        )
    elif resolved.engine == "sglang":
        text = _render_sglang(
            resolved, kv_capacity_tokens, weights_gib, timestamp, kv_bytes_per_token
        )
    else:
        raise ValueError(f"unknown engine {resolved.engine!r}")
    return "\n".join(text) + "\n"


# --------------------------------------------------------------------------------------- vLLM


def _vllm_namespace(args: dict[str, Any]) -> str:
    body = ", ".join(f"{dest}={args[dest]!r}" for _, dest, *_ in _cli_tables.VLLM_0_6_3)
    return f"Namespace({body})"


def _render_vllm(
    r: ResolvedConfig, kv_tokens: int, weights_gib: float, t0: datetime, kv_bytes: int
) -> list[str]:
    parsed = r.parsed_flags()
    a = dict(parsed.args)
    limits = runtime_limits(r, kv_capacity_tokens=kv_tokens)
    assert r.block_size is not None and limits.num_gpu_blocks is not None
    swap_bytes = float(a["swap_space"]) * (1 << 30)
    cpu_blocks = int(swap_bytes // (r.block_size * kv_bytes))
    seed = _token("vllm", *r.flags)
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
        f"dtype={_TORCH_DTYPES.get(a['dtype'], 'torch.bfloat16')}, max_seq_len={r.context_len}, "
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
    lines.extend(_tqdm_shards(4, 8.0))
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
    for path, methods in _VLLM_ROUTES:
        log(31, "INFO", "launcher.py:27", f"Route: {path}, Methods: {methods}")
    lines.append("INFO:     Started server process [1]")
    lines.append("INFO:     Waiting for application startup.")
    lines.append("INFO:     Application startup complete.")
    lines.append(
        f"INFO:     Uvicorn running on socket ('0.0.0.0', {a['port']}) (Press CTRL+C to quit)"
    )
    return lines


# ------------------------------------------------------------------------------------- SGLang


def _sglang_server_args(r: ResolvedConfig, args: dict[str, Any]) -> str:
    """ServerArgs after __post_init__, as `logger.info(f"{server_args=}")` prints it."""
    values = dict(args)
    values["tp_size"] = args["tensor_parallel_size"]
    values["dp_size"] = args["data_parallel_size"]
    values["ep_size"] = args["expert_parallel_size"]
    values["tokenizer_path"] = args["tokenizer_path"] or r.model
    values["served_model_name"] = r.served_model_name
    if values["random_seed"] is None:
        values["random_seed"] = int(_token("sglang-seed", *r.flags)[:8], 16) % (1 << 30)
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


def _render_sglang(
    r: ResolvedConfig, kv_tokens: int, weights_gib: float, t0: datetime, kv_bytes: int
) -> list[str]:
    args = dict(r.parsed_flags().args)
    limits = runtime_limits(r, kv_capacity_tokens=kv_tokens)
    seed = _token("sglang", *r.flags)
    lines: list[str] = []

    def log(offset_s: float, message: str, tp: bool = True) -> None:
        stamp = (t0 + timedelta(seconds=offset_s)).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"[{stamp}{' TP0' if tp else ''}] {message}")

    total_gib = r.gpu_memory_mib / 1024
    avail_begin = total_gib - _CUDA_CONTEXT_GIB
    avail_weights = avail_begin - weights_gib
    pool_rows = (
        r.max_running_requests
        if r.max_running_requests is not None
        else min(max(int(limits.kv_capacity_tokens / r.context_len * 512), 2048), 4096)
    ) + 1
    req_to_token_gib = pool_rows * (r.context_len + 4) * 4 / (1 << 30)
    kv_gib = limits.kv_capacity_tokens * kv_bytes / (1 << 30)
    avail_pool = avail_weights - kv_gib - req_to_token_gib
    dtype = _TORCH_DTYPES.get(args["dtype"], "torch.bfloat16")
    host, port = args["host"], args["port"]
    capture = [bs for bs in [1, 2, 4, *(8 * i for i in range(1, 21))] if bs <= r.cuda_graph_max_bs]

    log(0, _sglang_server_args(r, args), tp=False)
    log(7, "Init torch distributed begin.")
    log(7, f"Load weight begin. avail mem={avail_begin:.2f} GB")
    log(8, "Using model weights format ['*.safetensors']")
    lines.extend(_tqdm_shards(4, 8.0))
    log(
        16,
        f"Load weight end. type=LlamaForCausalLM, dtype={dtype}, avail mem={avail_weights:.2f} GB",
    )
    log(16, f"Memory pool end. avail mem={avail_pool:.2f} GB")
    if not args["disable_cuda_graph"]:
        log(17, "Capture cuda graph begin. This can take up to several minutes.")
        n = len(capture)
        lines.append(f"100%|██████████| {n}/{n} [00:02<00:00,  {n / 2.0:.2f}it/s]")
        log(19, "Capture cuda graph end. Time elapsed: 2.31 s")
    log(
        20,
        f"max_total_num_tokens={limits.kv_capacity_tokens}, "
        f"max_prefill_tokens={r.token_budget}, "
        f"max_running_requests={limits.max_running_requests}, "
        f"context_len={r.context_len}",
    )
    pid = 100 + int(seed[:4], 16) % 900
    log(20, f"INFO:     Started server process [{pid}]", tp=False)
    log(20, "INFO:     Waiting for application startup.", tp=False)
    log(20, "INFO:     Application startup complete.", tp=False)
    log(20, f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)", tp=False)
    client = 40000 + int(seed[4:8], 16) % 20000
    log(21, f'INFO:     127.0.0.1:{client} - "GET /get_model_info HTTP/1.1" 200 OK', tp=False)
    log(
        21,
        "Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, cache hit rate: 0.00%, "
        "token usage: 0.00, #running-req: 0, #queue-req: 0",
    )
    log(22, f'INFO:     127.0.0.1:{client + 8} - "POST /generate HTTP/1.1" 200 OK', tp=False)
    log(22, "The server is fired up and ready to roll!", tp=False)
    return lines
