"""Two fresh prompts at once against one, on llama-server and on the fitted CPU platform (issue 26;
docs/simulator.md, "The light-load TTFT with the real arrivals").

    .venv/bin/python benchmarks/llamacpp_pair_cost.py [--tokens 512] [--cycles 12]
        [--idle-s 0.3] [--platform cpu_platform.json] [--out OUT.json]
    .venv/bin/python benchmarks/llamacpp_pair_cost.py --from OUT.json [--platform ...]

With the real runs' own send times held, what is left of llama.cpp's light-load TTFT miss lies in
vendor defaults' requests that meet another, and the defaults arm is the one whose pass can hold
several whole prompts (`--batch-size` 2048; matched's passes hold at most 256 tokens). The fit
prices no such pass's time to first token: the floor's single requests come one at a time, and
its warm-ups enter the fit by their gaps only. This measures that pass alone.

Two llama-servers with the CPU pair's flags, the second with `--batch-size=256` (the matched
arm), both pinned to core 1 (one computes at a time), the client on core 0. Each cycle, for each
server in an order that alternates by cycle, after `--idle-s` of idle: one fresh prompt of
`--tokens` ids (random, no prefix any server has seen) with one output token; then, after the
same idle, two such prompts in one request: llama-server makes a task of each prompt of a list and
posts them together (llama.cpp 0c1e570, vendored in llama-cpp-python 0.3.36,
tools/server/server-context.cpp, `handle_completions_impl`), so its loop takes both at once, as it
takes two requests that arrived during one pass. Read per prompt: the server's own `prompt_ms`
(from its slot's start to its first token, no HTTP); per request, the client's latency and
llama-server's `llama_decode` calls (`llamacpp:n_decode_total`, before and after), which tell
whether the pair shared its passes.

Printed per server: the single prompt's median `prompt_ms` and the pair's (the later of its two),
their llama_decode calls, how many pairs took no more calls than a single prompt (they shared
their passes), and what the second prompt added, cycle by cycle (the pair less the single just
before it, so the machine's speed on the day cancels): to the server's `prompt_ms`, also as a
share of the single prompt's, and to the client's latency. Where the pair shares its passes
(vendor defaults) both prompts' `prompt_ms` span the same pass, and the first addition is that
pass's extra cost; where it does not (matched: a pass holds at most 256 tokens, whoever's), each
prompt's `prompt_ms` spans its own passes only, and the latency is the measure. With
`--platform` (a CPU platform file), the same additions and share from its step model: the
simulated llama-server (`servelab.sim.llamacpp`, its micro-batches and calls) on the platform's
step cost, the prompts added at one instant, with the front end (`per_admitted_s`) left out for
`prompt_ms` and kept for the latency. `--from` prints a kept result again without measuring,
under any platform file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import MODEL_PRESET
from cpu_pair_engines import LLAMA_FLAGS
from llamacpp_engine import machine
from parallel_sampling import CLIENT_CORE, decode_calls, served_llama
from sim_vs_real_fit_rules import step_costs_in

from servelab.sim.cpu_platform import StepCost
from servelab.sim.run import build_engine

SETTINGS = {"defaults": (), "matched": ("--batch-size=256",)}
TOKEN_RANGE = (1000, 100_000)  # ordinary ids of the Llama-3 vocabulary (128,256)
TIMEOUT_S = 60.0
GPU_MEMORY_MIB = 24000  # config/cpu-pair.yaml's gpu.memory_mib: no bearing on llama.cpp's slots


def _completion(url: str, prompt: list[int] | list[list[int]]) -> tuple[list[float], float]:
    """(server prompt_ms of each prompt, client latency in ms) of one request of 1-token
    completions: `prompt` is one prompt's ids, or a list of several prompts' ids."""
    started = time.perf_counter()
    response = httpx.post(
        url + "/completion",
        json={"prompt": prompt, "n_predict": 1, "temperature": 0.0, "cache_prompt": False},
        timeout=TIMEOUT_S,
    )
    latency = 1e3 * (time.perf_counter() - started)
    response.raise_for_status()
    body = response.json()
    results = body if isinstance(body, list) else [body]
    return [float(r["timings"]["prompt_ms"]) for r in results], latency


def trial(url: str, prompts: list[list[int]]) -> dict[str, Any]:
    """One request with `prompts` (one, or two sent as one request's list), with the server's
    llama_decode calls around it."""
    before = decode_calls(url, "llamacpp")
    prompt_ms, latency = _completion(url, prompts[0] if len(prompts) == 1 else prompts)
    after = decode_calls(url, "llamacpp")
    assert before is not None and after is not None
    if len(prompt_ms) != len(prompts):
        raise RuntimeError(f"{url}: {len(prompts)} prompts sent, {len(prompt_ms)} results")
    return {"prompt_ms": prompt_ms, "latency_ms": latency, "calls": after - before}


def measure(tokens: int, cycles: int, idle_s: float) -> dict[str, Any]:
    os.sched_setaffinity(0, {CLIENT_CORE})
    rng = random.Random(0)

    def fresh() -> list[int]:
        return [rng.randrange(*TOKEN_RANGE) for _ in range(tokens)]

    trials: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {"single": [], "pair": []} for name in SETTINGS
    }
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, flags in SETTINGS.items():
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            urls[name] = stack.enter_context(served_llama(folder, flags)).url
        for url in urls.values():  # a prompt and a pair each first: not counted
            trial(url, [fresh()])
            trial(url, [fresh(), fresh()])
        for cycle in range(cycles):
            names = list(SETTINGS) if cycle % 2 == 0 else list(reversed(SETTINGS))
            for name in names:
                time.sleep(idle_s)
                trials[name]["single"].append(trial(urls[name], [fresh()]))
                time.sleep(idle_s)
                trials[name]["pair"].append(trial(urls[name], [fresh(), fresh()]))
            print(f"cycle {cycle + 1} of {cycles} done", flush=True)
    return {
        "settings": {k: list(v) for k, v in SETTINGS.items()},
        "tokens": tokens,
        "cycles": cycles,
        "idle_s": idle_s,
        "trials": trials,
    }


def model_prompt_s(
    cost: StepCost, tokens: int, extra_flags: tuple[str, ...], prompts: int, *, front_end: bool
) -> float:
    """The time to the last first token of `prompts` fresh prompts of `tokens` ids added at one
    instant to the simulated llama-server with the setting's flags and the platform's step cost;
    without `front_end` as llama-server's `prompt_ms` counts it (`per_admitted_s` left out)."""
    timing = cost if front_end else dataclasses.replace(cost, per_admitted_s=0.0)
    sim = build_engine(
        engine="llamacpp",
        flags=[*LLAMA_FLAGS, *extra_flags],
        gpu_name="CPU",
        gpu_memory_mib=GPU_MEMORY_MIB,
        model_preset_name=MODEL_PRESET,
        step_costs={"llamacpp": timing},
    )
    # The benchmark sends token ids, which llama-server takes as they are; the simulated one adds
    # a BOS to a prompt as to text, so it gets one id fewer for the same count.
    n = tokens - (1 if sim.model_preset.bos_token_id is not None else 0)
    waiting = set()
    for k in range(prompts):  # distinct ids: no prefix shared between them
        ids = np.arange(TOKEN_RANGE[0] + k * n, TOKEN_RANGE[0] + (k + 1) * n, dtype=np.int64)
        sim.model.add_request(f"p{k}", ids, 1, 0.0)
        waiting.add(f"p{k}")
    now = 0.0
    for _ in range(10_000):  # bounded: a few prompts' passes
        it = sim.model.step(now)
        now = it.end_s
        waiting -= set(it.emitted)
        if not waiting:
            return now
    raise RuntimeError(f"the simulated llama-server gave no first token to {sorted(waiting)}")


def summarize(result: dict[str, Any], cost: StepCost | None) -> list[dict[str, Any]]:
    """Per server: the single's and the pair's (the later prompt's) median prompt_ms and calls,
    the pairs that took no more llama_decode calls than a single prompt, and what the second
    prompt added, cycle by cycle (the pair less the single just before it): to the server's
    prompt_ms, as a share of the single's, and to the client's latency; with `cost` the model's
    same additions and share."""
    rows = []
    for name, kinds in result["trials"].items():
        singles, pairs = kinds["single"], kinds["pair"]
        single_calls = statistics.median(t["calls"] for t in singles)
        row: dict[str, Any] = {
            "server": name,
            "single_prompt_ms": round(statistics.median(t["prompt_ms"][0] for t in singles), 2),
            "pair_prompt_ms": round(statistics.median(max(t["prompt_ms"]) for t in pairs), 2),
            "single_calls": single_calls,
            "pair_calls": statistics.median(t["calls"] for t in pairs),
            "pairs_sharing_calls": sum(t["calls"] <= single_calls for t in pairs),
            "pairs": len(pairs),
            "extra_prompt_ms": round(
                statistics.median(
                    max(p["prompt_ms"]) - s["prompt_ms"][0]
                    for s, p in zip(singles, pairs, strict=True)
                ),
                2,
            ),
            "extra_latency_ms": round(
                statistics.median(
                    p["latency_ms"] - s["latency_ms"] for s, p in zip(singles, pairs, strict=True)
                ),
                2,
            ),
        }
        # the addition as a share of a single prompt, on the server's own clock
        row["extra_share"] = round(row["extra_prompt_ms"] / row["single_prompt_ms"], 3)
        if cost is not None:
            flags = tuple(result["settings"][name])
            for key, front_end in (
                ("model_extra_prompt_ms", False),
                ("model_extra_latency_ms", True),
            ):
                one, two = (
                    model_prompt_s(cost, result["tokens"], flags, k, front_end=front_end)
                    for k in (1, 2)
                )
                row[key] = round(1e3 * (two - one), 2)
                if not front_end:  # the model's share, as prompt_ms counts a prompt
                    row["model_extra_share"] = round((two - one) / one, 3)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--idle-s", type=float, default=0.3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--platform", type=Path, help="a CPU platform file: its model's ratio")
    parser.add_argument("--from", type=Path, dest="kept", help="print a kept result again")
    args = parser.parse_args()
    if args.tokens < 2 or args.cycles < 1 or args.idle_s < 0:
        raise SystemExit("--tokens must be at least 2, --cycles at least 1, --idle-s >= 0")
    cost = step_costs_in(args.platform)["llamacpp"] if args.platform else None
    if args.kept:
        result = json.loads(args.kept.read_text(encoding="utf-8"))
    else:
        print(json.dumps(machine()))
        result = measure(args.tokens, args.cycles, args.idle_s)
    rows = summarize(result, cost)
    print(
        f"{'server':9s} {'single ms':>9} {'pair ms':>8} {'calls 1/2':>9} {'shared':>7} "
        f"{'+prompt ms':>10} {'model':>6} {'share':>5} {'model':>5} {'+latency ms':>11} {'model':>6}"
    )
    for row in rows:
        print(
            f"{row['server']:9s} {row['single_prompt_ms']:9.2f} {row['pair_prompt_ms']:8.2f} "
            f"{row['single_calls']:4.0f}/{row['pair_calls']:<4.0f} "
            f"{row['pairs_sharing_calls']:3d}/{row['pairs']:<3d} "
            f"{row['extra_prompt_ms']:10.2f} {row.get('model_extra_prompt_ms', '')!s:>6} "
            f"{row['extra_share']:5.2f} {row.get('model_extra_share', '')!s:>5} "
            f"{row['extra_latency_ms']:11.2f} {row.get('model_extra_latency_ms', '')!s:>6}"
        )
    if args.out and not args.kept:
        args.out.write_text(
            json.dumps({"machine": machine(), **result, "rows": rows}, indent=1) + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
