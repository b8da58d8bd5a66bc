"""Does the engine's pinned core slow down when the client's core is busy? (issue 26)

    .venv/bin/python benchmarks/core_interference.py [--cycles 4] [--requests 12] [--json out.json]

The sim-vs-real campaign pins the engine to core 1 and the dispatcher and Prometheus to core 0
(config `local`), and fits the CPU platform from floors, where the client's core is nearly idle.
If the two vCPUs share execution units or memory bandwidth on the host (a VM cannot see whether
its vCPUs are hyperthreads of one physical core), the engine is slower in a loaded run for the
same work, and no floor-only fit can know it.

One llama-server with the CPU pair's flags (4 slots of 2,048 tokens, one thread) is pinned to core
1; this script pins itself to core 0. It sends requests one at a time (fresh 512-token prompts, 16
output tokens, not streamed) and reads the server's own timings (`prompt_ms`, the forward passes of
the prompt; `predicted_per_token_ms`, one decode pass each), which exclude HTTP and the client.
The load on core 0 cycles through three settings, `--cycles` times, `--requests` each:
- `idle`: nothing but this client;
- `spin`: a pinned Python loop of integer arithmetic (a busy interpreter, as the dispatcher is);
- `memory`: a pinned loop copying a 256 MiB array (memory bandwidth and the shared L3).

Printed: each setting's median prompt_ms and decode ms per token, and the ratio to `idle`. Every
load process is started pinned to core 0 and stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import LlamaServer, machine

from servelab.deploy.processes import pinned

FLAGS = ("--ctx-size", "8192", "--parallel", "4", "--threads", "1")
ENGINE_CPUS = (1,)
CLIENT_CPUS = (0,)
PROMPT_TOKENS = 512
OUTPUT_TOKENS = 16
TIMEOUT_S = 60.0
SETTLE_S = 0.5  # a load process reaches its steady state before the first request

LOADS: dict[str, str | None] = {
    "idle": None,
    "spin": "x = 0\nwhile True:\n    for i in range(1_000_000):\n        x = (x * 31 + i) % 1_000_003\n",
    "memory": (
        "import numpy as np\n"
        "a = np.ones(256 * 2**20 // 8)\n"
        "b = np.empty_like(a)\n"
        "while True:\n    np.copyto(b, a)\n    np.copyto(a, b)\n"
    ),
}


def _prompt(rng: random.Random) -> list[int]:
    # distinct random token ids: no prompt shares a prefix with another (no cache hit)
    return [rng.randrange(1000, 100_000) for _ in range(PROMPT_TOKENS)]


def _timings(client: httpx.Client, prompt: list[int]) -> tuple[float, float]:
    response = client.post(
        "/completion",
        json={
            "prompt": prompt,
            "n_predict": OUTPUT_TOKENS,
            "ignore_eos": True,
            "temperature": 0.0,
        },
    )
    response.raise_for_status()
    timings = response.json()["timings"]
    return float(timings["prompt_ms"]), float(timings["predicted_per_token_ms"])


def _start_load(name: str) -> subprocess.Popen[bytes] | None:
    code = LOADS[name]
    if code is None:
        return None
    proc = subprocess.Popen(
        pinned([sys.executable, "-c", code], CLIENT_CPUS),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(SETTLE_S)
    return proc


def _stop_load(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)


def measure(cycles: int, requests: int, seed: int) -> dict[str, Any]:
    os.sched_setaffinity(0, set(CLIENT_CPUS))
    rng = random.Random(seed)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in LOADS}
    server = LlamaServer(flags=FLAGS)
    server.command = pinned(server.command, ENGINE_CPUS)
    with server, httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as client:
        for _ in range(4):  # warm-ups, not counted
            _timings(client, _prompt(rng))
        for cycle in range(cycles):
            for name in LOADS:
                load = _start_load(name)
                try:
                    samples[name] += [_timings(client, _prompt(rng)) for _ in range(requests)]
                finally:
                    _stop_load(load)
            print(f"cycle {cycle + 1} of {cycles} done", flush=True)
    rows = []
    base_prompt = statistics.median(p for p, _ in samples["idle"])
    base_decode = statistics.median(d for _, d in samples["idle"])
    for name, values in samples.items():
        prompt_ms = statistics.median(p for p, _ in values)
        decode_ms = statistics.median(d for _, d in values)
        rows.append(
            {
                "load": name,
                "requests": len(values),
                "prompt_ms": round(prompt_ms, 2),
                "decode_ms_per_token": round(decode_ms, 3),
                "prompt_ratio": round(prompt_ms / base_prompt, 3),
                "decode_ratio": round(decode_ms / base_decode, 3),
            }
        )
    return {"prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(json.dumps(machine()))
    result = measure(args.cycles, args.requests, args.seed)
    print(
        f"{'load on core 0':16} {'n':>4} {'prompt_ms':>10} {'ratio':>6} {'decode ms':>10} {'ratio':>6}"
    )
    for row in result["rows"]:
        print(
            f"{row['load']:16} {row['requests']:4d} {row['prompt_ms']:10.2f} "
            f"{row['prompt_ratio']:6.3f} {row['decode_ms_per_token']:10.3f} {row['decode_ratio']:6.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), **result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
