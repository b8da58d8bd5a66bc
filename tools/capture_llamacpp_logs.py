"""Capture llama-server's real start-up logs and /metrics text as test fixtures, with their goldens.

    .venv/bin/python tools/capture_llamacpp_logs.py [--only NAME ...]

For each flag set in CAPTURES it starts the llama-server binary that
`servelab.deploy.llama_server.llama_server_binary()` finds, serving the tiny GGUF model of
`servelab.deploy.tiny_model`, on a free 127.0.0.1 port, and saves its stderr up to and including
the readiness line ("srv  llama_server: listening on ...") as
`tests/data/engine-logs/llamacpp-<name>.log` (first line: a `# source:` line naming the build
and flags; the rest unchanged, timings and the model path included). It writes the parse of each
saved log as `tests/golden/llamacpp/<name>.json` (`ParsedLog.to_dict()` with the per-run elapsed
times of the evidence lines masked: `servelab.engines.llamacpp.mask_timestamps`). On the
METRICS_FROM run it sends two identical completion requests (the second reuses the cached
prompt) and saves GET /metrics as `tests/data/engine-logs/llamacpp-0c1e570-metrics-01.txt`.

Every server it starts (`servelab.deploy.llama_server.LlamaServerProcess`) is stopped by its PID
(SIGTERM, then SIGKILL after a bounded wait), then its process group. What the three capture tools
share is in tools/capture_common.py.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from capture_common import LOGS, REPO, Engine, main, save_golden, save_startup

from servelab.deploy.llama_server import LlamaServerProcess, llama_server_binary
from servelab.deploy.tiny_model import TinyModelSpec, ensure_tiny_model
from servelab.engines import llamacpp

GOLDEN = REPO / "tests" / "golden" / "llamacpp"
BUILD = llamacpp.PRINTED_VERSION

# --log-verbosity at which llama-server prints n_batch (the config passes it; module docstring).
LV = ["--log-verbosity", str(llamacpp.VERBOSITY_SHOWING_N_BATCH)]
# name -> llama-server flags (server_command adds --model, --host, --port and --metrics).
CAPTURES: dict[str, list[str]] = {
    "0c1e570-lv4-defaults": [*LV],
    "0c1e570-lv4-batch256": [*LV, "--batch-size", "256"],
    "0c1e570-lv4-np1-ctx4096": [*LV, "--parallel", "1", "--ctx-size", "4096"],
    "0c1e570-lv4-np2-ctx4096": [*LV, "--parallel", "2", "--ctx-size", "4096"],
    "0c1e570-lv4-no-cache-prompt": [*LV, "--no-cache-prompt"],
    "0c1e570-lv3-defaults": [],  # the default verbosity: n_batch is not printed
}
# name -> flags of a start-up that fails (the model file does not exist): its whole stderr is kept.
FAILED_CAPTURES: dict[str, list[str]] = {"0c1e570-lv3-missing-model": []}
MISSING_MODEL = "/nonexistent/model.gguf"
METRICS_FROM = "0c1e570-lv4-defaults"
METRICS_FILE = "llamacpp-0c1e570-metrics-01.txt"
MISSING = "capture_llamacpp_logs: no llama-server binary (make llama-server)"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
ENGINE = Engine(
    title="llama-server",
    ready=llamacpp.READY,
    start_timeout_s=START_TIMEOUT_S,
    poll_s=0.2,
    tail_lines=5,
    tool="tools/capture_llamacpp_logs.py",
    metrics_of=f"llama-server build {BUILD}",
    metrics_prompt="The quick brown fox jumps over the lazy dog. " * 4,
)


def wait_exit(proc: subprocess.Popen[bytes], stderr_path: Path, name: str) -> list[str]:
    """All stderr lines of a start-up that must fail (bounded by START_TIMEOUT_S)."""
    try:
        proc.wait(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"{name}: llama-server still running after {START_TIMEOUT_S:.0f} s"
        ) from None
    lines = stderr_path.read_text(encoding="utf-8", errors="replace").splitlines(True)
    if any(llamacpp.READY.search(line) for line in lines):
        raise RuntimeError(f"{name}: llama-server became ready; expected a failed start-up")
    return lines


def source_line(flags: list[str], *, failed: bool) -> str:
    spec = TinyModelSpec()
    shown = " ".join(flags) if flags else "(none)"
    model = (
        f"the missing model file {MISSING_MODEL}"
        if failed
        else f"the tiny GGUF model {spec.file_name} (servelab.deploy.tiny_model)"
    )
    kept = (
        "the whole stderr of the failed start-up" if failed else "stderr up to the readiness line"
    )
    return (
        f"# source: llama-server build {BUILD} (llama.cpp 0c1e570 vendored in llama-cpp-python "
        f"0.3.36, CPU build by tools/build-llama-server.sh), captured by "
        f"tools/capture_llamacpp_logs.py serving {model}; flags: {shown}, then --model PATH "
        f"--host 127.0.0.1 --port PORT --metrics; {kept}, unchanged\n"
    )


def capture(binary: str, name: str) -> None:
    failed = name in FAILED_CAPTURES
    flags = FAILED_CAPTURES[name] if failed else CAPTURES[name]
    with tempfile.TemporaryDirectory(prefix="capture-llamacpp-") as tmp:
        stderr_path = Path(tmp) / "stderr.txt"
        server = LlamaServerProcess(
            binary,
            model_path=MISSING_MODEL if failed else ensure_tiny_model(),
            flags=flags,
            log_path=stderr_path,
            stop_timeout_s=STOP_TIMEOUT_S,
            stdout_to_log=False,  # the log is its stderr
        )
        proc = server.start()
        try:
            log_path = LOGS / f"llamacpp-{name}.log"
            source = source_line(flags, failed=failed)
            if failed:
                log_text = source + "".join(wait_exit(proc, stderr_path, name))
                log_path.write_text(log_text, encoding="utf-8")
            else:
                log_text = save_startup(
                    proc,
                    stderr_path,
                    name,
                    ENGINE,
                    source=source,
                    log_path=log_path,
                    port=server.port,
                    flags=flags,
                    metrics_path=LOGS / METRICS_FILE if name == METRICS_FROM else None,
                )
        finally:
            server.stop()
    save_golden(GOLDEN, name, log_text, to_dict=llamacpp.mask_timestamps)


if __name__ == "__main__":
    raise SystemExit(
        main(__doc__, [*CAPTURES, *FAILED_CAPTURES], llama_server_binary, MISSING, capture)
    )
