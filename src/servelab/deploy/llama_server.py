"""Where llama.cpp's `llama-server` binary and its tiny model are, and the command that serves them.

The binary is built from the llama.cpp sources vendored in a pinned llama-cpp-python sdist by
`tools/build-llama-server.sh` (`make llama-server`), cached under
`~/.cache/servelab/llama-server/<version>/bin/llama-server`; `SERVELAB_LLAMA_SERVER` names another
binary. The model is the seeded tiny Llama-3-tokenizer GGUF of `servelab.deploy.tiny_model`.

Only what a deployment cannot carry in its flags is added here: the model file (a machine-local
path, so never part of a measurement's identity; its SHA-256 is recorded instead), the address,
and `--metrics`, without which the backend has nothing to scrape.

`LlamaServerProcess` is one llama-server a benchmark, a tool or a test holds while it works: started
on a free port of 127.0.0.1 with the given flags, its output in the given log, waited for on
/health (bounded), and stopped by its PID, then its process group. (The local backend's servers
are detached and found again from their state files: `servelab.deploy.local`.)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from servelab.deploy.processes import (
    HOST,
    free_port,
    start_logged,
    stop_process,
    tail,
    wait_healthy,
)

__all__ = [
    "LLAMA_CPP_PYTHON_VERSION",
    "LlamaServerProcess",
    "build_script",
    "file_sha256",
    "llama_server_binary",
    "servelab_cache",
    "server_command",
]

# The pinned llama-cpp-python release whose vendored llama.cpp is built (tools/build-llama-server.sh).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"


def build_script() -> Path:
    """The build script in a source checkout (absent from an installed wheel)."""
    return Path(__file__).resolve().parents[3] / "tools" / "build-llama-server.sh"


def servelab_cache() -> Path:
    """servelab's folder in the user cache ($XDG_CACHE_HOME, else ~/.cache): the llama-server
    build (as tools/build-llama-server.sh places it) and the tiny model."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servelab"


def cached_env_python(variable: str, name: str, version: str) -> str | None:
    """The interpreter of an engine's own environment: ${variable} if it names an executable,
    else the build cached under servelab_cache()/name/version (complete once its build script
    wrote lock.sha256: tools/build-vllm-cpu.sh, build-sglang-cpu.sh), else None."""
    named = os.environ.get(variable)
    if named:
        return named if os.access(named, os.X_OK) else None
    cached = servelab_cache() / name / version
    python = cached / "venv" / "bin" / "python"
    if (cached / "lock.sha256").is_file() and os.access(python, os.X_OK):
        return str(python)
    return None


def llama_server_binary() -> str | None:
    """The llama-server binary: $SERVELAB_LLAMA_SERVER, else the cached build, else None."""
    named = os.environ.get("SERVELAB_LLAMA_SERVER")
    if named:
        return named if os.access(named, os.X_OK) else None
    cached = servelab_cache() / "llama-server" / LLAMA_CPP_PYTHON_VERSION / "bin" / "llama-server"
    if os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("llama-server")


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def server_command(
    binary: str,
    *,
    model_path: str | os.PathLike[str],
    flags: Sequence[str],
    host: str,
    port: int,
) -> list[str]:
    """llama-server's command line: the deployment's flags, then the model, address and metrics.

    A config flag is `--name=value`; llama.cpp's parser takes the value as the next argument and
    refuses `--name=value` as an unknown option (llama.cpp 0c1e570, common/arg.cpp,
    common_params_parse_ex), so each is split in two.
    """
    command = [binary]
    for flag in flags:
        name, sep, value = str(flag).partition("=")
        command += [name, value] if sep and name.startswith("--") else [str(flag)]
    command += ["--model", str(model_path), "--host", host, "--port", str(int(port))]
    if "--metrics" not in command:
        command.append("--metrics")
    return command


class LlamaServerProcess:
    """One llama-server on 127.0.0.1 serving `model_path` with `flags` (`server_command`), on
    `port` or a free one, its output (stderr only, without `stdout_to_log`) written to `log_path`.

    As a context manager it starts the server and waits until GET /health answers 200 (llama-server
    answers 503 while it loads the model), at most `start_timeout_s` (LocalError, with the log's
    tail, if it exits or does not answer by then), and stops it on exit. `start`, `wait_healthy`
    and `stop` do each step alone; `command` may be changed before `start` (pinned to cores, say).
    """

    def __init__(
        self,
        binary: str,
        *,
        model_path: str | os.PathLike[str],
        flags: Sequence[str],
        log_path: str | os.PathLike[str],
        port: int | None = None,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 15.0,
        stdout_to_log: bool = True,
    ) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.command = server_command(
            binary, model_path=model_path, flags=flags, host=HOST, port=self.port
        )
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.stdout_to_log = stdout_to_log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "llama-server not started"
        return self.proc.pid

    def start(self) -> subprocess.Popen[bytes]:
        """Start the server (a process group of its own); do not wait for it."""
        self.proc = start_logged(self.command, self.log_path, stdout_to_log=self.stdout_to_log)
        return self.proc

    def wait_healthy(self, timeout_s: float | None = None) -> None:
        """Return once /health answers 200 (bounded by `timeout_s`, else `start_timeout_s`)."""
        assert self.proc is not None, "llama-server not started"
        wait_healthy(
            self.url,
            self.proc,
            timeout_s=self.start_timeout_s if timeout_s is None else timeout_s,
            log_path=self.log_path,
            what="llama-server",
        )

    def stop(self) -> None:
        """Stop it by its PID, then its process group (`processes.stop_process`); bounded."""
        if self.proc is not None:
            stop_process(self.proc, self.stop_timeout_s)

    def log_tail(self, lines: int = 20) -> str:
        return tail(self.log_path, lines)

    def __enter__(self) -> LlamaServerProcess:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
