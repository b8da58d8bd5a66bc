"""Where llama.cpp's `llama-server` binary and its tiny model are, and the command that serves them.

The binary is built from the llama.cpp sources vendored in a pinned llama-cpp-python sdist by
`tools/build-llama-server.sh` (`make llama-server`), cached under
`~/.cache/servelab/llama-server/<version>/bin/llama-server`; `SERVELAB_LLAMA_SERVER` names another
binary. The model is the seeded tiny Llama-3-tokenizer GGUF of `servelab.deploy.tiny_model`.

Only what a deployment cannot carry in its flags is added here: the model file (a machine-local
path, so never part of a measurement's identity; its SHA-256 is recorded instead), the address,
and `--metrics`, without which the backend has nothing to scrape.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "LLAMA_CPP_PYTHON_VERSION",
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
