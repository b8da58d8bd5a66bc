"""Two requests sent together, the dispatcher's way: does llama-server take them in one pass?
(issue 26; docs/simulator.md, "A floor of prompts sent together").

    .venv/bin/python benchmarks/llamacpp_pair_sends.py [--tokens 512] [--pairs 12]
        [--idle-s 0.3] [--out OUT.json]

The floor's pairs (config `floor.shapes[].together`) and a loaded run's workers released by one
planner reach llama-server as separate requests sent at one instant. The simulator takes them
into one pass (servelab.sim.llamacpp: both are posted before its loop's next iteration). With two
client threads, llama-server's loop often started the first prompt alone
(benchmarks/llamacpp_pair_cost.py, which therefore sends its pairs as one request). The
dispatcher sends from one asyncio loop, writing both connections back to back; this sends
`--pairs` pairs of fresh `--tokens`-token prompts that way (httpx.AsyncClient, one output token
each, `--idle-s` apart) to a llama-server with the CPU pair's flags on the engine's core, and
reads its `llama_decode` calls (`llamacpp:n_decode_total`) before and after each pair: 1 is one
pass for both, 2 the first prompt alone. Printed per pair: the calls and each request's client
latency and server `prompt_ms`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import machine
from llamacpp_pair_cost import TIMEOUT_S, TOKEN_RANGE
from parallel_sampling import CLIENT_CORE, decode_calls, served_llama


async def _pair(client: httpx.AsyncClient, url: str, prompts: list[list[int]]) -> list[dict]:
    """Both prompts sent at once, each its own request: (latency ms, server prompt_ms) each."""

    async def one(prompt: list[int]) -> dict[str, float]:
        started = time.perf_counter()
        response = await client.post(
            url + "/completion",
            json={"prompt": prompt, "n_predict": 1, "temperature": 0.0, "cache_prompt": False},
            timeout=TIMEOUT_S,
        )
        response.raise_for_status()
        latency = 1e3 * (time.perf_counter() - started)
        return {"latency_ms": latency, "prompt_ms": float(response.json()["timings"]["prompt_ms"])}

    return list(await asyncio.gather(*(one(p) for p in prompts)))


async def measure(url: str, tokens: int, pairs: int, idle_s: float) -> list[dict[str, Any]]:
    rng = random.Random(1)
    out = []
    # no kept-alive connection: each request opens its own, as the dispatcher's do under load
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits) as client:
        for _ in range(pairs):
            await asyncio.sleep(idle_s)
            prompts = [[rng.randrange(*TOKEN_RANGE) for _ in range(tokens)] for _ in range(2)]
            before = decode_calls(url, "llamacpp")
            requests = await _pair(client, url, prompts)
            after = decode_calls(url, "llamacpp")
            assert before is not None and after is not None
            out.append({"calls": after - before, "requests": requests})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--idle-s", type=float, default=0.3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.tokens < 2 or args.pairs < 1 or args.idle_s < 0:
        raise SystemExit("--tokens must be at least 2, --pairs at least 1, --idle-s >= 0")
    os.sched_setaffinity(0, {CLIENT_CORE})
    print(json.dumps(machine()))
    with tempfile.TemporaryDirectory() as folder, served_llama(Path(folder)) as server:
        pairs = asyncio.run(measure(server.url, args.tokens, args.pairs, args.idle_s))
    for k, pair in enumerate(pairs):
        each = "  ".join(
            f"{r['latency_ms']:6.1f} ms ({r['prompt_ms']:5.1f})" for r in pair["requests"]
        )
        print(f"pair {k + 1:2d}: {pair['calls']:.0f} llama_decode call(s); {each}")
    one_pass = sum(1 for p in pairs if p["calls"] == 1)
    print(f"{one_pass} of {len(pairs)} pairs in one pass")
    if args.out:
        record = {"machine": machine(), "tokens": args.tokens, "idle_s": args.idle_s}
        record |= {"pairs": pairs, "one_pass": one_pass}
        args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
