"""Capture SGLang-CPU's real start-up logs and /metrics text as test fixtures, with their goldens.

    .venv/bin/python tools/capture_sglang_cpu_logs.py [--only NAME ...]

For each flag set in CAPTURES it starts SGLang 0.5.23's CPU engine from the environment
`make sglang-cpu` builds (`servelab.deploy.sglang_cpu`, with servelab's stand-in sgl_kernel),
serving the shared tiny model in Hugging Face format (`servelab.deploy.tiny_model`), on a free
127.0.0.1 port, with the environment and command the local backend gives it. It saves the output up
to and including the readiness line (the sglang_v05 spec's `ready`, where the local backend cuts a
start-up log too) as `tests/data/engine-logs/sglang-cpu-<name>.log` (first line: a `# source:`
line naming the release and the flags; the rest unchanged: timestamps, pids and the model path
included), and its parse as `tests/golden/sglang_cpu/<name>.json` (`ParsedLog.to_dict()`). On the
METRICS_FROM run it sends two identical completion requests (the second hits the radix cache) and
saves GET /metrics as `tests/data/engine-logs/sglang-cpu-0.5.23-metrics-01.txt`.

Every server it starts is stopped by its PID (SIGTERM, then SIGKILL of its process group, which it
leads, after a bounded wait): SGLang's scheduler and detokenizer are its children. What the three
capture tools share is in tools/capture_common.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from capture_common import LOGS, REPO, capture_server, main, python_engine, save_golden

from servelab.deploy import sglang_cpu
from servelab.deploy.processes import free_port
from servelab.deploy.tiny_model import SHARED_SPEC, ensure_tiny_hf_model
from servelab.engines.registry import engine_spec

GOLDEN = REPO / "tests" / "golden" / "sglang_cpu"
RELEASE = sglang_cpu.SGLANG_CPU_VERSION
# Every capture's flags (the server's command adds --model-path, --device, --enable-metrics,
# --log-level, --host, --port): cpu-study.yaml's.
BASE = [
    "--served-model-name=servelab/tiny-llama3-2x64-hd32",
    "--context-length=8192",
    "--dtype=float32",
    "--max-total-tokens=65536",
]
# name -> flags
CAPTURES: dict[str, list[str]] = {
    "0.5.23-defaults": [*BASE],
    "0.5.23-chunk256": [*BASE, "--chunked-prefill-size=256"],
    # without chunking SGLang reserves for a 16,384-token prefill: 25,280 MiB of 24,105, a negative
    # fraction (the server refuses to start, as servelab's resolver does): the fraction is given
    "0.5.23-no-chunked-prefill": [*BASE, "--chunked-prefill-size=-1", "--mem-fraction-static=0.5"],
    "0.5.23-lpm": [*BASE, "--schedule-policy=lpm"],
}
METRICS_FROM = "0.5.23-defaults"
METRICS_FILE = "sglang-cpu-0.5.23-metrics-01.txt"
MISSING = "capture_sglang_cpu_logs: no SGLang-CPU environment (make sglang-cpu)"
STOP_TIMEOUT_S = 20.0
ENGINE = python_engine(
    "SGLang",
    engine_spec("sglang_v05").log.ready,
    "tools/capture_sglang_cpu_logs.py",
    f"SGLang {RELEASE} (CPU engine)",
)


def source_line(flags: list[str]) -> str:
    return (
        f"# source: SGLang {RELEASE} CPU engine (PyPI sglang with servelab's stand-in sgl_kernel, "
        f"tools/build-sglang-cpu.sh), captured by tools/capture_sglang_cpu_logs.py serving the "
        f"tiny model {SHARED_SPEC.hf_dir_name} (servelab.deploy.tiny_model); env "
        f"SGLANG_USE_CPU_ENGINE=1; flags: --model-path PATH {' '.join(flags)} --device cpu "
        "--enable-metrics --log-level info --host 127.0.0.1 --port PORT; output up to the "
        "readiness line, unchanged\n"
    )


def capture(python: str, name: str) -> None:
    flags = CAPTURES[name]
    port = free_port()
    command = sglang_cpu.server_command(
        python, model_dir=ensure_tiny_hf_model(), flags=flags, host="127.0.0.1", port=port
    )
    with tempfile.TemporaryDirectory(prefix="capture-sglang-cpu-") as tmp:
        log_text = capture_server(
            command,
            sglang_cpu.server_env(Path(tmp) / "calls.txt"),
            Path(tmp) / "out.txt",
            name,
            ENGINE,
            stop_timeout_s=STOP_TIMEOUT_S,
            source=source_line(flags),
            log_path=LOGS / f"sglang-cpu-{name}.log",
            port=port,
            flags=flags,
            metrics_path=LOGS / METRICS_FILE if name == METRICS_FROM else None,
        )
    save_golden(GOLDEN, name, log_text, shown="schedule_policy")


if __name__ == "__main__":
    raise SystemExit(main(__doc__, CAPTURES, sglang_cpu.sglang_cpu_python, MISSING, capture))
