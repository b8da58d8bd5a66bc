"""Where the SGLang-CPU environment is, and the command and environment that serve the tiny model.

The environment is SGLang 0.5.23 from PyPI in a virtual environment of its own, built from
`requirements/sglang-cpu.lock` by `tools/build-sglang-cpu.sh` (`make sglang-cpu`) with servelab's
stand-in `sgl_kernel` (`servelab.deploy.standins.sgl_kernel`: PyPI has no CPU build of
sgl-kernel), cached under `~/.cache/servelab/sglang-cpu/0.5.23/venv`; `SERVELAB_SGLANG_CPU_PYTHON`
names another interpreter that has SGLang. The model is the shared tiny model of
`servelab.deploy.tiny_model` in Hugging Face format.

The command adds to a deployment's flags only what a deployment cannot carry: the model folder (a
machine-local path; the weights' SHA-256 is recorded instead), the device, the address and the
metrics endpoint. The environment is fixed here and defines no measurement:
- `SGLANG_USE_CPU_ENGINE=1`: SGLang's CPU engine is on only with it, read once at import
  (`sglang/srt/utils/common.py::is_cpu` L220-224; `srt/platforms/__init__.py` L49-50, L152-155);
- `HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1`: nothing is fetched from a hub;
- `SERVELAB_SGL_KERNEL=servelab-standin`: names the kernel package the environment holds (read by
  nothing; it makes run.json's server_command say it);
- `SERVELAB_SGL_KERNEL_CALLS`: the file the stand-in records any call of its names in (a
  campaign's test reads it: plain serving calls none).
`--device cpu` is given too, though the CPU engine implies it (`get_device`, common.py L1073-1081).
`--enable-metrics` exports the `sglang:*` series the telemetry reads (observability/
metrics_collector.py); `--log-level info` is SGLang's default, named so that the start-up lines the
gate reads are certain to print.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from servelab.deploy.llama_server import cached_env_python

__all__ = [
    "CALLS_FILE",
    "SGLANG_CPU_VERSION",
    "build_script",
    "describe",
    "server_command",
    "server_env",
    "sglang_cpu_python",
]

SGLANG_CPU_VERSION = "0.5.23"
ENTRYPOINT = "sglang.launch_server"
CALLS_FILE = "sgl-kernel-calls.txt"  # in the deployment's folder: the stand-in's call record


def build_script() -> Path:
    """The build script in a source checkout (absent from an installed wheel)."""
    return Path(__file__).resolve().parents[3] / "tools" / "build-sglang-cpu.sh"


def sglang_cpu_python() -> str | None:
    """The interpreter of the SGLang-CPU environment: $SERVELAB_SGLANG_CPU_PYTHON, else the cached
    build (tools/build-sglang-cpu.sh), else None."""
    return cached_env_python("SERVELAB_SGLANG_CPU_PYTHON", "sglang-cpu", SGLANG_CPU_VERSION)


# What the environment's sgl_kernel is, named in the server's environment, so that run.json's
# server_command and the deployment's local.json say it wherever the command appears.
SGL_KERNEL = "servelab-standin"


def server_env(calls_file: str | os.PathLike[str]) -> dict[str, str]:
    return {
        "SGLANG_USE_CPU_ENGINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "SERVELAB_SGL_KERNEL": SGL_KERNEL,
        "SERVELAB_SGL_KERNEL_CALLS": str(calls_file),
    }


def server_command(
    python: str,
    *,
    model_dir: str | os.PathLike[str],
    flags: Sequence[str],
    host: str,
    port: int,
) -> list[str]:
    """The server's command line: the module entrypoint, the model folder, the deployment's flags,
    the device, the address, the metrics endpoint. A `--model-path` among the flags names the model
    (SGLang requires one, and servelab's resolver with it: config `engines.sglang_v05.flags`); the
    folder that holds that model on this machine replaces it."""
    kept: list[str] = []
    skip = False
    for flag in (str(f) for f in flags):
        if skip:
            skip = False
        elif flag == "--model-path":
            skip = True  # its value is the next token
        elif not flag.startswith("--model-path="):
            kept.append(flag)
    return [
        python,
        "-m",
        ENTRYPOINT,
        "--model-path",
        str(model_dir),
        *kept,
        "--device",
        "cpu",
        "--enable-metrics",
        "--log-level",
        "info",
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
