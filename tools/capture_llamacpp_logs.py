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

Every server it starts is stopped by its PID (SIGTERM, then SIGKILL after a bounded wait).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from servelab.deploy.llama_server import llama_server_binary, server_command
from servelab.deploy.tiny_model import TinyModelSpec, ensure_tiny_model
from servelab.engines import llamacpp
from servelab.engines.logparse import parse_startup_log

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "data" / "engine-logs"
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
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(proc: subprocess.Popen[bytes], stderr_path: Path, name: str) -> list[str]:
    """The stderr lines up to and including the readiness line (bounded by START_TIMEOUT_S)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        lines = stderr_path.read_text(encoding="utf-8", errors="replace").splitlines(True)
        for i, line in enumerate(lines):
            if llamacpp.READY.search(line):
                return lines[: i + 1]
        if proc.poll() is not None:
            tail = "".join(lines[-5:])
            raise RuntimeError(f"{name}: llama-server exited with {proc.returncode}:\n{tail}")
        time.sleep(0.2)
    raise RuntimeError(f"{name}: llama-server not ready within {START_TIMEOUT_S:.0f} s")


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


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server this script started, by its PID."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)


def post_completion(port: int, prompt: str) -> dict[str, object]:
    body = json.dumps({"prompt": prompt, "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        return dict(json.loads(response.read()))


def get_metrics(port: int) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as response:
        return str(response.read().decode("utf-8"))


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


def capture(binary: str, model: Path, name: str, flags: list[str], *, failed: bool = False) -> None:
    port = free_port()
    command = server_command(binary, model_path=model, flags=flags, host="127.0.0.1", port=port)
    with tempfile.TemporaryDirectory(prefix="capture-llamacpp-") as tmp:
        stderr_path = Path(tmp) / "stderr.txt"
        with stderr_path.open("wb") as err:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        try:
            if failed:
                lines = wait_exit(proc, stderr_path, name)
            else:
                lines = wait_ready(proc, stderr_path, name)
            log_text = source_line(flags, failed=failed) + "".join(lines)
            (LOGS / f"llamacpp-{name}.log").write_text(log_text, encoding="utf-8")
            if name == METRICS_FROM:
                prompt = "The quick brown fox jumps over the lazy dog. " * 4
                first = post_completion(port, prompt)
                second = post_completion(port, prompt)
                metrics = get_metrics(port)
                header = (
                    f"# source: GET /metrics of llama-server build {BUILD} captured by "
                    "tools/capture_llamacpp_logs.py after two identical /v1/completions "
                    f"requests (max_tokens 8; their usages: "
                    f"{json.dumps([first.get('usage'), second.get('usage')])}); "
                    f"flags: {' '.join(flags)}; unchanged below\n"
                )
                (LOGS / METRICS_FILE).write_text(header + metrics, encoding="utf-8")
        finally:
            stop(proc)
    parsed = parse_startup_log(log_text)
    golden = json.dumps(llamacpp.mask_timestamps(parsed), sort_keys=True, indent=2)
    (GOLDEN / f"{name}.json").write_text(golden + "\n", encoding="utf-8")
    print(
        f"{name}: ready={parsed.ready} chunked_prefill={parsed.chunked_prefill} "
        f"chunk_size={parsed.chunk_size} context_len={parsed.context_len}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = sorted([*CAPTURES, *FAILED_CAPTURES])
    parser.add_argument("--only", nargs="*", choices=names, default=None)
    args = parser.parse_args(argv)
    binary = llama_server_binary()
    if binary is None:
        print("capture_llamacpp_logs: no llama-server binary (make llama-server)", file=sys.stderr)
        return 2
    model = ensure_tiny_model()
    LOGS.mkdir(parents=True, exist_ok=True)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, flags in CAPTURES.items():
        if args.only is None or name in args.only:
            capture(binary, Path(model), name, flags)
    for name, flags in FAILED_CAPTURES.items():
        if args.only is None or name in args.only:
            capture(binary, Path(MISSING_MODEL), name, flags, failed=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
