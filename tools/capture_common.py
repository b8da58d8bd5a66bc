"""What the capture tools share: capture_llamacpp_logs.py, capture_vllm_cpu_logs.py and
capture_sglang_cpu_logs.py (scripts; this module is imported from their folder, never installed).

Each tool starts a real engine server on a free 127.0.0.1 port (by `servelab.deploy.processes` or
`servelab.deploy.llama_server.LlamaServerProcess`), and stops it by its PID, then its process
group. What they share is here: waiting (bounded) for the server's readiness line in its output,
saving that output up to the line as `tests/data/engine-logs/<name>.log` under a `# source:` line,
on one capture sending two identical completion requests and saving GET /metrics under its own
`# source:` line, and writing a log's golden parse.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.deploy.processes import start_logged, stop_process
from servelab.engines.base import ParsedLog
from servelab.engines.logparse import parse_startup_log

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "data" / "engine-logs"
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Engine:
    """What a capture tool says of the server it starts."""

    title: str  # the server, in messages: "llama-server", "vLLM", "SGLang"
    ready: re.Pattern[str]  # its readiness line (where the local backend cuts a start-up log)
    start_timeout_s: float
    poll_s: float  # how often its output is read while it starts
    tail_lines: int  # its last lines quoted when it exits while starting
    tool: str  # the capturing script, as its `# source:` lines name it
    metrics_of: str  # the server, as the /metrics file's `# source:` line names it
    metrics_prompt: str  # the prompt of the two identical completion requests
    model: str | None = None  # the completion requests' "model", if the server needs one
    echo_chars: int = 0  # this much of its output's end printed to stderr when it never got ready


def python_engine(title: str, ready: re.Pattern[str], tool: str, metrics_of: str) -> Engine:
    """How vLLM's and SGLang's CPU servers are captured: up to 180 s to start, their output read
    every 0.5 s, its last 8 lines quoted and its last 3,000 characters echoed if they exit first;
    the completion requests name the shared tiny model and repeat a 40-sentence prompt."""
    return Engine(
        title=title,
        ready=ready,
        start_timeout_s=180.0,
        poll_s=0.5,
        tail_lines=8,
        tool=tool,
        metrics_of=metrics_of,
        metrics_prompt="The quick brown fox jumps over the lazy dog. " * 40,
        model="servelab/tiny-llama3-2x64-hd32",
        echo_chars=3000,
    )


def wait_ready(
    proc: subprocess.Popen[bytes], out_path: Path, name: str, engine: Engine
) -> list[str]:
    """The output lines up to and including the readiness line (bounded by start_timeout_s)."""
    deadline = time.monotonic() + engine.start_timeout_s
    while time.monotonic() < deadline:
        lines = out_path.read_text(encoding="utf-8", errors="replace").splitlines(True)
        for i, line in enumerate(lines):
            if engine.ready.search(line):  # as the local backend cuts the start-up log
                return lines[: i + 1]
        if proc.poll() is not None:
            tail = "".join(lines[-engine.tail_lines :])
            raise RuntimeError(f"{name}: {engine.title} exited with {proc.returncode}:\n{tail}")
        time.sleep(engine.poll_s)
    raise RuntimeError(f"{name}: {engine.title} not ready within {engine.start_timeout_s:.0f} s")


def post_completion(port: int, prompt: str, model: str | None = None) -> dict[str, Any]:
    body = json.dumps(
        {
            **({"model": model} if model else {}),
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


def save_metrics(port: int, path: Path, engine: Engine, flags: Sequence[str]) -> None:
    """Two identical completion requests (the second reuses the first's cached prompt), then GET
    /metrics, saved to `path` under a `# source:` line naming the requests' usages."""
    first = post_completion(port, engine.metrics_prompt, engine.model)
    second = post_completion(port, engine.metrics_prompt, engine.model)
    metrics = get_metrics(port)
    header = (
        f"# source: GET /metrics of {engine.metrics_of} captured by {engine.tool} after two "
        "identical /v1/completions requests (max_tokens 8; their usages: "
        f"{json.dumps([first.get('usage'), second.get('usage')])}); flags: {' '.join(flags)}; "
        "unchanged below\n"
    )
    path.write_text(header + metrics, encoding="utf-8")


def save_startup(
    proc: subprocess.Popen[bytes],
    out_path: Path,
    name: str,
    engine: Engine,
    *,
    source: str,
    log_path: Path,
    port: int,
    flags: Sequence[str],
    metrics_path: Path | None = None,
) -> str:
    """Wait for the server's readiness line, save its output up to it under `source` as `log_path`
    and, with `metrics_path`, its /metrics text (save_metrics); return the saved log. The caller
    stops the server."""
    try:
        lines = wait_ready(proc, out_path, name, engine)
    except RuntimeError:
        if engine.echo_chars:
            print(out_path.read_text(errors="replace")[-engine.echo_chars :], file=sys.stderr)
        raise
    log_text = source + "".join(lines)
    log_path.write_text(log_text, encoding="utf-8")
    if metrics_path is not None:
        save_metrics(port, metrics_path, engine, flags)
    return log_text


def capture_server(
    command: Sequence[str],
    env: Mapping[str, str],
    out_path: Path,
    name: str,
    engine: Engine,
    *,
    stop_timeout_s: float,
    **save: Any,
) -> str:
    """Start `command` with `env` (its output in `out_path`), save its start-up log
    (save_startup, with `save`), stop it by its PID, then its process group; return the log."""
    proc = start_logged(command, out_path, env=env)
    try:
        return save_startup(proc, out_path, name, engine, **save)
    finally:
        stop_process(proc, stop_timeout_s)


def save_golden(
    golden: Path,
    name: str,
    log_text: str,
    *,
    to_dict: Callable[[ParsedLog], dict[str, Any]] = ParsedLog.to_dict,
    shown: str = "context_len",
) -> None:
    """The saved log's parse (`to_dict`) as `golden`/NAME.json, and a line saying what it shows."""
    parsed = parse_startup_log(log_text)
    golden.mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_dict(parsed), sort_keys=True, indent=2) + "\n"
    (golden / f"{name}.json").write_text(text, encoding="utf-8")
    print(
        f"{name}: ready={parsed.ready} chunked_prefill={parsed.chunked_prefill} "
        f"chunk_size={parsed.chunk_size} {shown}={getattr(parsed, shown)}"
    )


def main(
    doc: str,
    names: Iterable[str],
    find: Callable[[], str | None],
    missing: str,
    capture: Callable[[str, str], None],
    argv: list[str] | None = None,
) -> int:
    """A capture tool's command line: `--only NAME ...` of `names`, else all; `find()` the server
    (`missing` said and exit status 2 without it), then `capture(server, name)` each in turn."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(names), default=None)
    args = parser.parse_args(argv)
    server = find()
    if server is None:
        print(missing, file=sys.stderr)
        return 2
    LOGS.mkdir(parents=True, exist_ok=True)
    for name in names:
        if args.only is None or name in args.only:
            capture(server, name)
    return 0
