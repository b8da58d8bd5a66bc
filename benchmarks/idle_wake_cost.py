"""Does a lone request take longer after the engine has idled? (issue 26;
docs/benchmarks/sim-vs-real.md, "Light load on the fifth measurement")

    .venv/bin/python benchmarks/idle_wake_cost.py [--engine llamacpp|vllm] [--idle 0 0.1 1]
        [--cycles 3] [--requests 8] [--after 1] [--fresh-tokens 512] [--engine-flag=FLAG ...]
        [--out OUT.json]
    .venv/bin/python benchmarks/idle_wake_cost.py --from OUT.json

The CPU platform is fitted from the floor, a closed-loop chain of single requests: each is sent
as soon as the one before it ends, so the engine never idles between them. In a loaded run at
light load most lone requests (nothing else in flight) come after the engine idled for a tenth of
a second or more (benchmarks/sim_vs_real_lone.py bins them by that idle time). This measures the
idle time alone. The engine (the CPU pair's flags, `parallel_sampling.served`) runs on core 1, the
client on core 0. Each request has the sweep's condition shape: 1,024 tokens, the first 512 a
prefix shared by every request (cached after the first) and the rest fresh (`--fresh-tokens`, 512),
one output token, not streamed, so its latency is its time to first token and the engine computes
the fresh tokens. Two fresh sizes tell a fixed wake-up cost from a slower pass. Before
each request the client sleeps the setting's idle time; the settings are interleaved in a
shuffled order over `--cycles` cycles, `--requests` each. With `--after K` each sleep is
followed by K requests back to back, and the server's `prompt_ms` is also printed by position
after the sleep: how many requests the engine takes to come back to speed.

Printed per idle time: the median client latency (and each cycle's) and, for llama-server, the
server's own `timings.prompt_ms` (its forward passes of the prompt, no HTTP), each as a ratio to
idle 0; then in how many cycles the first idle setting (0) had the lowest median, and how many
cycle medians after `LONG_IDLE_S` or more lie above that cycle's first setting. `--from` prints
a kept result again without measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import machine
from parallel_sampling import CLIENT_CORE, served
from vllm_bench_peer import MODEL

PREFIX_TOKENS = 512
FRESH_TOKENS = 512
TIMEOUT_S = 60.0
IDLE_S = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)
TOKEN_RANGE = (1000, 100_000)  # ordinary ids of the Llama-3 vocabulary (128,256)
LONG_IDLE_S = 0.3


def one_request(client: httpx.Client, prompt: list[int]) -> tuple[float, float | None]:
    """(client latency, the server's prompt_ms or None) of one 1-token completion."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": False,
    }
    start = time.perf_counter()
    response = client.post("/v1/completions", json=body)
    latency = time.perf_counter() - start
    response.raise_for_status()
    timings = response.json().get("timings")  # llama-server only
    return latency, float(timings["prompt_ms"]) if timings else None


def measure(
    engine: str,
    idle: tuple[float, ...],
    cycles: int,
    requests: int,
    flags: tuple[str, ...],
    fresh_tokens: int = FRESH_TOKENS,
    after: int = 1,
) -> dict[str, Any]:
    os.sched_setaffinity(0, {CLIENT_CORE})
    rng = random.Random(0)
    prefix = [rng.randrange(*TOKEN_RANGE) for _ in range(PREFIX_TOKENS)]

    def prompt() -> list[int]:
        return prefix + [rng.randrange(*TOKEN_RANGE) for _ in range(fresh_tokens)]

    samples: dict[float, list[tuple[float, float | None]]] = {s: [] for s in idle}
    per_cycle: dict[float, list[float]] = {s: [] for s in idle}
    by_position: dict[float, list[list[float]]] = {s: [[] for _ in range(after)] for s in idle}
    with (
        tempfile.TemporaryDirectory() as scratch,
        served(engine, Path(scratch), flags) as url,
        httpx.Client(base_url=url, timeout=TIMEOUT_S) as client,
    ):
        for _ in range(4):  # the prefix enters the cache; not counted
            one_request(client, prompt())
        for cycle in range(cycles):
            order = list(idle)
            rng.shuffle(order)
            for setting in order:
                latencies = []
                for _ in range(requests):
                    time.sleep(setting)
                    for position in range(after):
                        sample = one_request(client, prompt())
                        if position == 0:
                            samples[setting].append(sample)
                            latencies.append(sample[0])
                        if sample[1] is not None:
                            by_position[setting][position].append(sample[1])
                per_cycle[setting].append(round(1e3 * statistics.median(latencies), 2))
            print(f"cycle {cycle + 1} of {cycles} done", flush=True)
    base_latency = statistics.median(lat for lat, _ in samples[idle[0]])
    base_prompt = [p for _, p in samples[idle[0]] if p is not None]
    rows = []
    for setting, values in samples.items():
        latency = statistics.median(lat for lat, _ in values)
        prompt_ms = [p for _, p in values if p is not None]
        row: dict[str, Any] = {
            "idle_s": setting,
            "requests": len(values),
            "latency_ms": round(1e3 * latency, 2),
            "latency_ratio": round(latency / base_latency, 3),
            "latency_ms_by_cycle": per_cycle[setting],
        }
        if prompt_ms and base_prompt:
            row["prompt_ms"] = round(statistics.median(prompt_ms), 2)
            row["prompt_ratio"] = round(
                statistics.median(prompt_ms) / statistics.median(base_prompt), 3
            )
        rows.append(row)
    result: dict[str, Any] = {
        "engine": engine,
        "flags": list(flags),
        "prefix_tokens": PREFIX_TOKENS,
        "fresh_tokens": fresh_tokens,
        "cycles": cycles,
        "rows": rows,
    }
    if after > 1 and base_prompt:
        base = statistics.median(base_prompt)
        result["after"] = after
        result["prompt_ratio_by_position"] = {
            str(setting): [round(statistics.median(v) / base, 3) if v else None for v in positions]
            for setting, positions in by_position.items()
        }
    return result


def cycle_counts(result: dict[str, Any]) -> dict[str, int]:
    """Cycle by cycle, against the first setting's median (idle 0): the cycles where it is the
    lowest of all settings, and the long-idle settings' medians above it (of how many)."""
    rows = result["rows"]
    base = rows[0]["latency_ms_by_cycle"]
    long_rows = [r["latency_ms_by_cycle"] for r in rows if r["idle_s"] >= LONG_IDLE_S]
    lowest = sum(
        base[c] == min(r["latency_ms_by_cycle"][c] for r in rows) for c in range(len(base))
    )
    above = sum(row[c] > base[c] for row in long_rows for c in range(len(base)))
    return {
        "cycles": len(base),
        "first_setting_lowest": lowest,
        "long_idle_above": above,
        "long_idle_cycle_medians": len(long_rows) * len(base),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    parser.add_argument("--idle", type=float, nargs="+", default=list(IDLE_S))
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--after", type=int, default=1, help="requests back to back after a sleep")
    parser.add_argument("--fresh-tokens", type=int, default=FRESH_TOKENS)
    parser.add_argument("--engine-flag", action="append", default=[], dest="flags")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--from", type=Path, dest="kept", help="print a kept result again")
    args = parser.parse_args()
    if args.kept:
        result = json.loads(args.kept.read_text(encoding="utf-8"))
    else:
        print(json.dumps(machine()))
        result = measure(
            args.engine,
            tuple(args.idle),
            args.cycles,
            args.requests,
            tuple(args.flags),
            args.fresh_tokens,
            args.after,
        )
    print(f"{'idle s':>7} {'n':>4} {'latency ms':>11} {'ratio':>6} {'prompt_ms':>10} {'ratio':>6}")
    for row in result["rows"]:
        print(
            f"{row['idle_s']:7.3f} {row['requests']:4d} {row['latency_ms']:11.2f} "
            f"{row['latency_ratio']:6.3f} {row.get('prompt_ms', float('nan')):10.2f} "
            f"{row.get('prompt_ratio', float('nan')):6.3f}  by cycle {row['latency_ms_by_cycle']}"
        )
    for setting, ratios in result.get("prompt_ratio_by_position", {}).items():
        print(f"prompt_ms ratio by position after {float(setting):g} s idle: {ratios}")
    counts = cycle_counts(result)
    print(
        f"idle {result['rows'][0]['idle_s']:g} s lowest in {counts['first_setting_lowest']} of "
        f"{counts['cycles']} cycles; after {LONG_IDLE_S:g} s or more, {counts['long_idle_above']} "
        f"of {counts['long_idle_cycle_medians']} cycle medians above it"
    )
    if args.out and not args.kept:
        args.out.write_text(json.dumps({"machine": machine(), **result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
