"""A prompt in one llama_decode call or in 256-token calls, measured side by side (issue 26;
docs/simulator.md, "A sixth measurement").

    .venv/bin/python benchmarks/llamacpp_chunk_cost.py [--tokens 128 256 512 1024 1536]
        [--cycles 6] [--out OUT.json] [--platform cpu_platform.json]
    .venv/bin/python benchmarks/llamacpp_chunk_cost.py --from OUT.json [--platform ...]

On two measurements the CPU platform, one linear step model fitted to both arms' floors, priced
llama-server's unchunked prompts (vendor defaults: `--batch-size` 2048, so a whole prompt is one
`llama_decode` call, split by llama.cpp into micro-batches of `--ubatch-size` 512) low against its
chunked ones (matched: `--batch-size=256`, so one call per 256 tokens). But each arm's floor ran
in its own deployment, minutes apart, and this machine's speed moves on that scale. This measures
the two settings interleaved: two llama-servers with the CPU pair's flags, the second with
`--batch-size=256`, both pinned to core 1 (one computes at a time), the client on core 0. Each
cycle sends, for every prompt length in a shuffled order, one fresh prompt (random ids, no prefix
any server has seen) with one output token to each server, in an order that alternates by cycle.
Read per request: the server's own `prompt_ms` (its forward passes of the prompt, no HTTP) and
its `llama_decode` calls (`llamacpp:n_decode_total` before and after).

Printed per prompt length: each setting's median `prompt_ms` and calls, the ratio of the
chunked to the unchunked time, and in how many of the pairs (the same prompt to both) the
chunked setting was faster. A ratio below 1 means the unchunked call costs more for the same
tokens, beyond the chunked setting's extra calls. With `--platform` (a CPU platform file,
`results/sim_vs_real/platform.json` or a kept `cpu_platform-*.json`, or the `--json` of
benchmarks/sim_vs_real_fit_rules.py: its `gaps` variant's fit), also what its llama.cpp step
model gives for the same ratio: the same fresh prompt through the simulated llama-server
(`servelab.sim.llamacpp`, its micro-batches and calls) on the platform's step cost. `--from`
prints a kept result again without measuring.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import machine
from llamacpp_pair_cost import TOKEN_RANGE
from llamacpp_pair_cost import model_prompt_s as first_tokens_s
from parallel_sampling import CLIENT_CORE, decode_calls, served_llama
from sim_vs_real_fit_rules import step_costs_in

from servelab.sim.cpu_platform import StepCost

TOKENS = (128, 256, 512, 1024, 1536)
SETTINGS = {"unchunked": (), "chunked-256": ("--batch-size=256",)}
TIMEOUT_S = 60.0


def one_prompt(url: str, prompt: list[int]) -> tuple[float, float]:
    """(prompt_ms, llama_decode calls) of one 1-token completion of `prompt`."""
    before = decode_calls(url, "llamacpp")
    response = httpx.post(
        url + "/completion",
        json={"prompt": prompt, "n_predict": 1, "temperature": 0.0, "cache_prompt": False},
        timeout=TIMEOUT_S,
    )
    response.raise_for_status()
    after = decode_calls(url, "llamacpp")
    assert before is not None and after is not None
    return float(response.json()["timings"]["prompt_ms"]), after - before


def measure(tokens: tuple[int, ...], cycles: int) -> dict[str, Any]:
    os.sched_setaffinity(0, {CLIENT_CORE})
    rng = random.Random(0)
    samples: dict[str, dict[int, list[tuple[float, float]]]] = {
        name: {n: [] for n in tokens} for name in SETTINGS
    }
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, flags in SETTINGS.items():
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            urls[name] = stack.enter_context(served_llama(folder, flags)).url
        for url in urls.values():  # two long prompts each first: not counted
            for _ in range(2):
                one_prompt(url, [rng.randrange(*TOKEN_RANGE) for _ in range(1024)])
        for cycle in range(cycles):
            order = list(tokens)
            rng.shuffle(order)
            names = list(SETTINGS) if cycle % 2 == 0 else list(reversed(SETTINGS))
            for n in order:
                prompt = [rng.randrange(*TOKEN_RANGE) for _ in range(n)]
                for name in names:
                    samples[name][n].append(one_prompt(urls[name], prompt))
            print(f"cycle {cycle + 1} of {cycles} done", flush=True)
    rows = []
    for n in tokens:
        row: dict[str, Any] = {"tokens": n}
        for name in SETTINGS:
            values = samples[name][n]
            row[name] = {
                "prompt_ms": round(statistics.median(v for v, _ in values), 2),
                "calls": statistics.median(c for _, c in values),
                "prompt_ms_by_cycle": [round(v, 2) for v, _ in values],
            }
        row["chunked_over_unchunked"] = round(
            row["chunked-256"]["prompt_ms"] / row["unchunked"]["prompt_ms"], 3
        )
        rows.append(row)
    return {"settings": {k: list(v) for k, v in SETTINGS.items()}, "cycles": cycles, "rows": rows}


def model_prompt_s(cost: StepCost, tokens: int, extra_flags: tuple[str, ...]) -> float:
    """A fresh prompt of `tokens` ids on the simulated llama-server with the setting's flags and
    the platform's step cost: the passes up to its first token, as llama-server's `prompt_ms`
    counts them (no front end: `per_admitted_s` left out). benchmarks/llamacpp_pair_cost.py's
    model, for one prompt."""
    return first_tokens_s(cost, tokens, extra_flags, 1, front_end=False)


def summarize(result: dict[str, Any], cost: StepCost | None) -> None:
    """Add to each row the pairs in which the chunked setting was faster, and with `cost` the
    step model's chunked ÷ unchunked."""
    for row in result["rows"]:
        pairs = zip(
            row["unchunked"]["prompt_ms_by_cycle"],
            row["chunked-256"]["prompt_ms_by_cycle"],
            strict=True,
        )
        row["chunked_faster_pairs"] = sum(b < a for a, b in pairs)
        if cost is not None:
            n = row["tokens"]
            row["model_chunked_over_unchunked"] = round(
                model_prompt_s(cost, n, SETTINGS["chunked-256"])
                / model_prompt_s(cost, n, SETTINGS["unchunked"]),
                3,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--platform", type=Path, help="a CPU platform file or a fit-rules --json: its model's ratio"
    )
    parser.add_argument("--from", type=Path, dest="kept", help="print a kept result again")
    args = parser.parse_args()
    cost = step_costs_in(args.platform)["llamacpp"] if args.platform else None
    if args.kept:
        result = json.loads(args.kept.read_text(encoding="utf-8"))
    else:
        print(json.dumps(machine()))
        result = measure(tuple(args.tokens), args.cycles)
    summarize(result, cost)
    print(
        f"{'tokens':>6} {'unchunked ms':>12} {'calls':>5} {'chunked ms':>10} {'calls':>5} "
        f"{'÷':>6} {'faster':>6} {'model ÷':>7}"
    )
    for row in result["rows"]:
        a, b = row["unchunked"], row["chunked-256"]
        print(
            f"{row['tokens']:6d} {a['prompt_ms']:12.2f} {a['calls']:5.0f} {b['prompt_ms']:10.2f} "
            f"{b['calls']:5.0f} {row['chunked_over_unchunked']:6.3f} "
            f"{row['chunked_faster_pairs']:3d}/{len(a['prompt_ms_by_cycle']):<2} "
            f"{row.get('model_chunked_over_unchunked', '')!s:>7}"
        )
    if args.out and not args.kept:
        args.out.write_text(json.dumps({"machine": machine(), **result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
