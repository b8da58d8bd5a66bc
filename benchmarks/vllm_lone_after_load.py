"""Is a lone request slower on a vLLM engine that has just served load? (issue 26;
docs/simulator.md, "Against the real engines": the lone-request excess).

    .venv/bin/python benchmarks/vllm_lone_after_load.py [--arm matched|defaults] [--lone 12]
        [--burst 48] [--cycles 2] [--out FILE]

In the sim-vs-real sweep a vLLM request that met no other request in a loaded run took 1.08-1.24
times as long to its first token as the floor's requests of the same shape. This asks whether the
engine's own state after load is the cause, with no dispatcher and no trace: one vLLM V1 server
(the CPU pair's flags; `--arm matched` adds `--max-num-batched-tokens=256`) pinned to core 1, the
client on core 0, and fresh 1,024-token prompts (no shared prefix), 16 output tokens. Per cycle:

1. `lone`: `--lone` requests, one at a time (the floor's protocol);
2. `burst`: `--burst` requests sent together (the loaded state);
3. `after`: `--lone` requests one at a time, at once;
4. `reset`: the prefix cache emptied (`POST /reset_prefix_cache`, served with
   VLLM_SERVER_DEV_MODE=1: vllm/entrypoints/serve/dev/cache/api_router.py at 0.32.0), then
   `--lone` requests one at a time;
5. `idle`: 10 s with nothing sent, then `--lone` requests one at a time.

It prints each phase's median TTFT and its ratio to the first cycle's `lone`. A ratio near the
loaded runs' excess in `after` that falls back in `reset` points at the prefix cache's state; one
that stays in `reset` and falls in `idle` at something that time undoes; one near 1 everywhere
says the engine's state after load is not the cause.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_bench_peer import MODEL, TOKENIZER, VLLM_PYTHON, VllmServer, _free_port

from servelab.workload import warmup_prompts

PROMPT_TOKENS = 1024
OUTPUT_TOKENS = 16
IDLE_S = 10.0
REQUEST_TIMEOUT_S = 120.0
ENGINE_CORE, CLIENT_CORE = "1", 0
MATCHED_FLAG = "--max-num-batched-tokens=256"


def ttft_s(url: str, text: str) -> float:
    """Seconds from sending one greedy streamed request to its first token's chunk."""
    body = {
        "model": MODEL,
        "prompt": text,
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
    }
    start = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and '"text":""' not in line:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError(f"{url}: a request streamed no token")
    return first


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--arm", choices=("defaults", "matched"), default="matched")
    parser.add_argument("--lone", type=int, default=12, help="lone requests per phase")
    parser.add_argument("--burst", type=int, default=48, help="requests sent together")
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the measurement as JSON here")
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CORE})
    per_cycle = 4 * args.lone + args.burst
    texts = iter(
        text for text, _ in warmup_prompts(4242, per_cycle * args.cycles, PROMPT_TOKENS, TOKENIZER)
    )
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # the server inherits it: /reset_prefix_cache
    phases: list[dict[str, Any]] = []
    wall0 = time.perf_counter()
    with (
        TemporaryDirectory() as scratch,
        VllmServer(
            VLLM_PYTHON,
            Path(scratch),
            _free_port(),
            cpus=ENGINE_CORE,
            extra_flags=(MATCHED_FLAG,) if args.arm == "matched" else (),
        ) as vllm,
    ):
        url = vllm.url

        def lone(phase: str, cycle: int) -> None:
            times = [ttft_s(url, next(texts)) for _ in range(args.lone)]
            phases.append({"cycle": cycle, "phase": phase, "ttft_s": times})

        for cycle in range(1, args.cycles + 1):
            lone("lone", cycle)
            burst = [next(texts) for _ in range(args.burst)]
            with ThreadPoolExecutor(max_workers=args.burst) as pool:
                times = list(pool.map(lambda t: ttft_s(url, t), burst))
            phases.append({"cycle": cycle, "phase": "burst", "ttft_s": times})
            lone("after", cycle)
            httpx.post(url + "/reset_prefix_cache", timeout=30).raise_for_status()
            lone("reset", cycle)
            time.sleep(IDLE_S)
            lone("idle", cycle)
    base = statistics.median(phases[0]["ttft_s"])
    print(f"vLLM V1, {args.arm}: {PROMPT_TOKENS}-token fresh prompts, median TTFT a phase")
    print(f"{'cycle':>5} {'phase':6} {'requests':>8} {'TTFT p50 ms':>11} {'÷ first lone':>12}")
    for p in phases:
        p["ttft_p50_ms"] = round(1e3 * statistics.median(p["ttft_s"]), 2)
        p["ratio"] = round(statistics.median(p["ttft_s"]) / base, 3)
        print(
            f"{p['cycle']:>5} {p['phase']:6} {len(p['ttft_s']):>8} {p['ttft_p50_ms']:>11.2f}"
            f" {p['ratio']:>12.3f}"
        )
    record = {
        "arm": args.arm,
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
        "machine": {"nproc": os.cpu_count(), "loadavg": os.getloadavg()},
        "phases": phases,
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
