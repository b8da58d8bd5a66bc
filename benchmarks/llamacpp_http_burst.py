"""How many of a burst of requests does llama-server hold? (issue 26; docs/simulator.md, "A tenth
measurement").

    .venv/bin/python benchmarks/llamacpp_http_burst.py [--requests 64] [--spacing 0 0.002 0.005]
        [--cycles 2] [--out OUT.json]

llama-server's HTTP pool (cpp-httplib's ThreadPool, as llama.cpp 0c1e570 vendors it) spawns a
thread for a new connection only when it counts no idle thread, and a thread it has notified counts
as idle until it runs (vendor/cpp-httplib/httplib.cpp, ThreadPool::enqueue, ThreadPool::worker).
So a burst of connections gets only about as many threads as were idle; the rest wait, with no
task, until a thread is free. A request is held by the server (a task in a slot or deferred) only
once it has a thread. This sends `--requests` streamed greedy requests of fresh 1,024-token prompts
and 16 tokens each (a floor's warm-ups) to llama-server as the CPU pair runs it (four slots, one
thread, core 1), the k-th at k x `--spacing` from client threads on core 0 released together, and
reads the server's `llamacpp:requests_processing + llamacpp:requests_deferred` 0.25 s after the
last was sent: the requests it holds. Settings are interleaved over `--cycles`; between two, the
pool's dynamic threads are left 4 s to exit (3 s idle timeout), so every burst meets the fixed
threads alone.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_waiting_cost import interleaved, write_record
from parallel_sampling import CLIENT_CORE, served_llama

from servelab.engines.metrics import parse_metrics_text
from servelab.workload import warmup_prompts

PROMPT_TOKENS = 1024
OUTPUT_TOKENS = 16
SETTLE_S = 0.25  # after the last send: every connection has been accepted or queued
IDLE_EXIT_S = 4.0  # > CPPHTTPLIB_THREAD_POOL_IDLE_TIMEOUT (3 s)


def held(url: str) -> int:
    """Requests the server holds: in a slot or deferred (its /metrics)."""
    values = {
        s.name: s.value for s in parse_metrics_text(httpx.get(url + "/metrics", timeout=30).text)
    }
    return int(values["llamacpp:requests_processing"] + values["llamacpp:requests_deferred"])


def one_request(url: str, text: str, start: threading.Barrier, delay: float, out: list) -> None:
    """Wait for the release, then `delay`, then one streamed completion over a new connection."""
    start.wait()
    time.sleep(delay)
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    body = {
        "prompt": text,
        "max_tokens": OUTPUT_TOKENS,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    conn.close()
    out.append(response.status)


def one_setting(url: str, texts: list[str], spacing: float) -> dict[str, Any]:
    statuses: list[int] = []
    start = threading.Barrier(len(texts) + 1)
    threads = [
        threading.Thread(target=one_request, args=(url, text, start, k * spacing, statuses))
        for k, text in enumerate(texts)
    ]
    for t in threads:
        t.start()
    start.wait()
    time.sleep((len(texts) - 1) * spacing + SETTLE_S)
    count = held(url)
    for t in threads:
        t.join(timeout=600)
    if len(statuses) != len(texts) or set(statuses) != {200}:
        raise RuntimeError(
            f"spacing {spacing}: statuses {sorted(set(statuses))} of {len(statuses)}"
        )
    return {"spacing_s": spacing, "requests": len(texts), "held": count}


def after_idle(server: Any, texts: list[str], spacing: float) -> dict[str, Any]:
    """One setting, after the pool's dynamic threads have had time to exit."""
    time.sleep(IDLE_EXIT_S)
    return one_setting(server.url, texts, spacing)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--spacing", type=float, nargs="+", default=[0.0, 0.002, 0.005])
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the measurement as JSON here")
    args = parser.parse_args()
    if args.requests < 1 or args.cycles < 1 or any(s < 0 for s in args.spacing):
        parser.error("--requests >= 1, --cycles >= 1 and --spacing >= 0")
    os.sched_setaffinity(0, {CLIENT_CORE})
    count = args.cycles * len(args.spacing) * args.requests
    texts = [text for text, _ in warmup_prompts(19, count, PROMPT_TOKENS)]
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="servelab-burst-") as tmp,
        served_llama(Path(tmp)) as server,
    ):
        rows = interleaved(
            server, texts, list(args.spacing), args.cycles, args.requests, after_idle
        )
    write_record(args, started, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
