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
leads, after a bounded wait): SGLang's scheduler and detokenizer are its children.
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

from servelab.deploy import sglang_cpu
from servelab.deploy.tiny_model import SHARED_SPEC, ensure_tiny_hf_model
from servelab.engines.logparse import parse_startup_log
from servelab.engines.registry import engine_spec

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "data" / "engine-logs"
GOLDEN = REPO / "tests" / "golden" / "sglang_cpu"
RELEASE = sglang_cpu.SGLANG_CPU_VERSION
READY = engine_spec("sglang_v05").log.ready
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
            if READY.search(line):  # as the local backend cuts the start-up log
                return lines[: i + 1]
        if proc.poll() is not None:
            raise RuntimeError(
                f"{name}: SGLang exited with {proc.returncode}:\n{''.join(lines[-8:])}"
            )
        time.sleep(0.5)
    raise RuntimeError(f"{name}: SGLang not ready within {START_TIMEOUT_S:.0f} s")


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


def source_line(flags: list[str]) -> str:
    return (
        f"# source: SGLang {RELEASE} CPU engine (PyPI sglang with servelab's stand-in sgl_kernel, "
        f"tools/build-sglang-cpu.sh), captured by tools/capture_sglang_cpu_logs.py serving the "
        f"tiny model {SHARED_SPEC.hf_dir_name} (servelab.deploy.tiny_model); env "
        f"SGLANG_USE_CPU_ENGINE=1; flags: --model-path PATH {' '.join(flags)} --device cpu "
        "--enable-metrics --log-level info --host 127.0.0.1 --port PORT; output up to the "
        "readiness line, unchanged\n"
    )


def capture(python: str, model: Path, name: str, flags: list[str]) -> None:
    port = free_port()
    command = sglang_cpu.server_command(
        python, model_dir=model, flags=flags, host="127.0.0.1", port=port
    )
    with tempfile.TemporaryDirectory(prefix="capture-sglang-cpu-") as tmp:
        env = sglang_cpu.server_env(Path(tmp) / "calls.txt")
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
            log_text = source_line(flags) + "".join(lines)
            (LOGS / f"sglang-cpu-{name}.log").write_text(log_text, encoding="utf-8")
            if name == METRICS_FROM:
                prompt = "The quick brown fox jumps over the lazy dog. " * 40
                first = post_completion(port, prompt)
                second = post_completion(port, prompt)
                metrics = get_metrics(port)
                header = (
                    f"# source: GET /metrics of SGLang {RELEASE} (CPU engine) captured by "
                    "tools/capture_sglang_cpu_logs.py after two identical /v1/completions "
                    f"requests (max_tokens 8; their usages: "
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
        f"chunk_size={parsed.chunk_size} schedule_policy={parsed.schedule_policy}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CAPTURES), default=None)
    args = parser.parse_args(argv)
    python = sglang_cpu.sglang_cpu_python()
    if python is None:
        print(
            "capture_sglang_cpu_logs: no SGLang-CPU environment (make sglang-cpu)", file=sys.stderr
        )
        return 2
    model = ensure_tiny_hf_model()
    LOGS.mkdir(parents=True, exist_ok=True)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, flags in CAPTURES.items():
        if args.only is None or name in args.only:
            capture(python, model, name, flags)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
