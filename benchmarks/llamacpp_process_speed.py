"""Does a llama-server process run at a speed of its own? The same work on several processes of the
same binary, flags and model, interleaved (issue 26; docs/simulator.md, "The repeated miss, made
again").

    .venv/bin/python benchmarks/llamacpp_process_speed.py [--processes 6] [--rounds 4]
        [--prompt-tokens 1024] [--json OUT]

The campaign starts a fresh llama-server for every run (fix 9), and vLLM serves all of a
deployment's runs from one process. Made again and again, llama.cpp's loaded runs scatter more
than vLLM's (sd 4.7% of the ratio of two runs, against 2.2%). If each llama-server process draws a
speed of its own at start-up (where its buffers land in memory, for one), a run's speed is its
process's, and a fresh process a run makes that scatter run-to-run.

This starts `--processes` llama-servers at once, all pinned to the engine's core (1) with the CPU
pair's flags and `--cache-ram 0` (no host prompt cache, so that a process's cost does not grow
with what it served), the client on core 0. Only one works at a time. Each round gives every
process, in turn, the same work: six requests one at a time (a 1,024-token prompt, 32 output
tokens; the server's own `timings`, prompt_ms + predicted_ms, summed), then four requests at once,
twice (1,024-token prompts, 64 output tokens; the wall time). Every process gets the same prompts
in a round, new ones each round, distinct from each other (servelab.workload.warmup_prompts), so
no prompt is cached. Interleaving puts the machine's drift into every process alike.
It prints each process's time per round, relative to the mean of all, the spread of process
means against the spread of rounds within a process, and a one-way analysis of variance across
processes (scipy.stats.f_oneway): a small p says the processes differ by more than rounds do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import TOKENIZER, complete, machine
from parallel_sampling import CLIENT_CORE, served_llama
from scipy import stats

from servelab.workload import warmup_prompts

SINGLES = 6
SINGLE_OUTPUT = 32
CONCURRENT = 4
CONCURRENT_OUTPUT = 64
CONCURRENT_BATCHES = 2


def single_ms(url: str, prompts: list[str]) -> float:
    """The server's own milliseconds for `prompts`, one at a time."""
    total = 0.0
    for text in prompts:
        timings = complete(url, text, SINGLE_OUTPUT, cache_prompt=False)["timings"]
        total += float(timings["prompt_ms"]) + float(timings["predicted_ms"])
    return total


def concurrent_ms(url: str, batches: list[list[str]]) -> float:
    """Wall milliseconds for each batch of requests sent at once, summed."""
    total = 0.0
    with ThreadPoolExecutor(CONCURRENT) as pool:
        for batch in batches:
            start = time.perf_counter()
            list(pool.map(lambda t: complete(url, t, CONCURRENT_OUTPUT, cache_prompt=False), batch))
            total += (time.perf_counter() - start) * 1e3
    return total


def relative_spread(values: list[float]) -> float:
    """Standard deviation over mean."""
    return statistics.stdev(values) / statistics.fmean(values)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.processes < 2 or args.rounds < 2:
        raise SystemExit("--processes and --rounds: at least 2 each")
    os.sched_setaffinity(0, {CLIENT_CORE})
    started = time.time()
    kinds = ("one at a time", "four at once")
    times: dict[str, list[list[float]]] = {k: [[] for _ in range(args.processes)] for k in kinds}
    with (
        tempfile.TemporaryDirectory(prefix="servelab-process-speed-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        servers = []
        for p in range(args.processes):
            folder = Path(tmp) / f"p{p}"
            folder.mkdir()
            servers.append(stack.enter_context(served_llama(folder, ("--cache-ram", "0"))))
        per_round = SINGLES + CONCURRENT * CONCURRENT_BATCHES
        for r in range(args.rounds):
            texts = [
                t for t, _ in warmup_prompts(7000 + r, per_round, args.prompt_tokens, TOKENIZER)
            ]
            singles = texts[:SINGLES]
            rest = texts[SINGLES:]
            batches = [rest[i : i + CONCURRENT] for i in range(0, len(rest), CONCURRENT)]
            for p, server in enumerate(servers):
                times["one at a time"][p].append(single_ms(server.url, singles))
                times["four at once"][p].append(concurrent_ms(server.url, batches))
            print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    out: dict[str, Any] = {
        "machine": machine(),
        "processes": args.processes,
        "rounds": args.rounds,
        "prompt_tokens": args.prompt_tokens,
        "wall_s": round(time.time() - started, 1),
        "kinds": {},
    }
    for kind in kinds:
        rows = times[kind]
        grand = statistics.fmean(v for row in rows for v in row)
        means = [statistics.fmean(row) for row in rows]
        within = statistics.fmean(relative_spread(row) for row in rows)
        # one-way analysis of variance: do the processes differ by more than their rounds do?
        anova = stats.f_oneway(*rows)
        out["kinds"][kind] = {
            "ms_by_process_and_round": [[round(v, 1) for v in row] for row in rows],
            "process_mean_over_all": [round(m / grand, 4) for m in means],
            "between_processes_sd": round(relative_spread(means), 4),
            "within_process_sd_of_rounds": round(within, 4),
            "anova_f": round(float(anova.statistic), 3),
            "anova_p": float(f"{anova.pvalue:.3g}"),
        }
        print(f"\n{kind}: ms a round, by process (rounds in order), and its mean ÷ the mean of all")
        for p, row in enumerate(rows):
            print(f"  process {p + 1}: {[round(v) for v in row]}  {means[p] / grand:.3f}")
        print(
            f"  sd of process means {relative_spread(means):.4f}; "
            f"mean sd of rounds within a process {within:.4f}; "
            f"one-way ANOVA across processes F {anova.statistic:.2f}, p {anova.pvalue:.3g}"
        )
    print(f"\n{out['wall_s']} s; machine {out['machine']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
