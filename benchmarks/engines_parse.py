"""Benchmark: how long `servelab.engines.parse_startup_log` takes on real and long logs.

Prints one line per case: lines parsed, milliseconds per parse (best of several repeats).
    .venv/bin/python benchmarks/engines_parse.py
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

from servelab.engines import parse_startup_log

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "engine-logs"
STATS = (
    "INFO 10-18 10:09:12 metrics.py:349] Avg prompt throughput: 0.0 tokens/s, Avg generation "
    "throughput: 48.5 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache "
    "usage: 0.1%, CPU KV cache usage: 0.0%.\n"
)


def best_ms(text: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        parse_startup_log(text)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main() -> None:
    print(f"python {platform.python_version()} on {platform.machine()}")
    for name in ("vllm-0.6.4dev-chunked-on-01.log", "sglang-0.4.1-01.log"):
        text = (DATA / name).read_text()
        print(f"{name}: {len(text.splitlines())} lines, {best_ms(text, 50):.2f} ms")
    long = (DATA / "vllm-0.6.4dev-chunked-on-01.log").read_text() + STATS * 100_000
    print(
        f"vLLM log + 100000 stats lines: {len(long.splitlines())} lines, {best_ms(long, 3):.0f} ms"
    )


if __name__ == "__main__":
    main()
