"""Where does llama-server's core go in each repetition of a loaded condition? A sampled CPU profile
of the engine's core, split by run (issue 26; docs/simulator.md, "The repeated miss, made again").

    .venv/bin/python benchmarks/llamacpp_perf_profile.py --perf-script PROFILE.txt --made DIR \\
        [--top 30] [--json OUT]

PROFILE.txt is `perf script -F time,comm,tid,ip,sym,dso` of a `perf record -k CLOCK_REALTIME -a
-C 1` (the engine's core, config `local`) taken while the workflow made the runs in DIR (rep1/,
rep2/, ... as results/runs/ARM/ENGINE/CONDITION), with perf itself on the client's core:

    taskset -c 0 perf record -k CLOCK_REALTIME -a -C 1 -F 1999 -o run.perf -- snakemake ...
    perf script -i run.perf -F time,comm,tid,ip,sym,dso > PROFILE.txt

Samples are given to a repetition by its run.json window (`start_unix_s` to `end_unix_s`; the
realtime clock makes them comparable). The engine's busiest thread in a window is its main loop
(server_context's update_slots, which calls llama_decode); the others are its HTTP threads. Each
sample is grouped by thread and by what its function does (matrix products, flash attention,
sampling, the mask and inputs, the host prompt cache, the kernel, ...); the counts and the
repetitions' ratios are printed, then the functions with the most samples. Sampling has a cost:
at 1,999 Hz on this VM the profiled making's engine seconds ran 1.26-1.33 times the prediction,
against 1.07-1.26 over ten makings without it (docs), so a profile compares repetitions with each
other, not with a run made without it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

# `perf script -F time,comm,tid,ip,sym,dso`: comm, tid, time:, ip, symbol, (dso).
SAMPLE = re.compile(r"\s*(.+?)\s+(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*?)\s+\((\S+)\)\s*$")
ENGINE_COMM = "llama-server"


def function_group(symbol: str, dso: str) -> str:
    """What a sampled function does, from its name (ggml-cpu's ops, llamafile's tinyBLAS, the
    server's sampling and prompt cache) or, for the kernel and the C/C++ runtime, its object."""
    if "kernel" in dso:
        return "kernel"
    if "flash_attn" in symbol:
        return "flash attention"
    if any(k in symbol for k in ("tinyBLAS", "mul_mat", "vec_dot", "gemm", "gemv")):
        return "matrix products"
    if "kq_mask" in symbol or "set_input" in symbol:
        return "mask and inputs"
    if "prompt_cache" in symbol or "common_prefix" in symbol:
        return "host prompt cache"
    if any(k in symbol for k in ("sampl", "heap", "token_data", "sort")):
        return "sampling"
    if symbol.startswith("ggml"):
        return "other ggml ops"
    if any(k in dso for k in ("libc.", "libstdc++", "libm.")):
        return "C/C++ runtime"
    return "other"


def windows(made: Path) -> dict[str, tuple[float, float]]:
    """Each repetition's run window in unix seconds, from its run.json."""
    out: dict[str, tuple[float, float]] = {}
    for run_json in sorted(made.glob("rep*/run.json")):
        record = json.loads(run_json.read_text(encoding="utf-8"))
        out[run_json.parent.name] = (float(record["start_unix_s"]), float(record["end_unix_s"]))
    if not out:
        raise SystemExit(f"{made}: no rep*/run.json")
    return out


def read_samples(
    profile: Path, spans: dict[str, tuple[float, float]]
) -> dict[str, list[tuple[str, int, str, str]]]:
    """Per repetition, its window's samples as (comm, tid, symbol, dso)."""
    out: dict[str, list[tuple[str, int, str, str]]] = {rep: [] for rep in spans}
    with profile.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            m = SAMPLE.match(line)
            if not m:
                continue
            comm, tid, t, symbol, dso = m.groups()
            at = float(t)
            for rep, (start, end) in spans.items():
                if start <= at <= end:
                    out[rep].append((comm, int(tid), symbol, dso))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--perf-script", type=Path, required=True)
    parser.add_argument("--made", type=Path, required=True)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    spans = windows(args.made)
    samples = read_samples(args.perf_script, spans)
    reps = sorted(spans)
    groups: dict[str, Counter[str]] = {}
    functions: dict[str, Counter[str]] = {}
    for rep in reps:
        engine = Counter(tid for comm, tid, _s, _d in samples[rep] if comm == ENGINE_COMM)
        if not engine:
            raise SystemExit(f"{args.perf_script}: no {ENGINE_COMM} sample in {rep}'s window")
        main_tid = engine.most_common(1)[0][0]
        groups[rep], functions[rep] = Counter(), Counter()
        for comm, tid, symbol, dso in samples[rep]:
            if comm != ENGINE_COMM:
                groups[rep]["not the engine (idle, kernel threads)"] += 1
                continue
            thread = "main loop" if tid == main_tid else "HTTP threads"
            groups[rep][f"{thread}: {function_group(symbol, dso)}"] += 1
            functions[rep][f"{thread}: {symbol}"] += 1
    first = reps[0]

    def table(counts: dict[str, Counter[str]], keys: list[str]) -> list[dict[str, Any]]:
        rows = []
        for key in keys:
            row: dict[str, Any] = {"what": key, **{rep: counts[rep][key] for rep in reps}}
            for rep in reps[1:]:
                base = counts[first][key]
                row[f"{rep}_over_{first}"] = round(counts[rep][key] / base, 3) if base else None
            rows.append(row)
        return rows

    group_keys = sorted({k for c in groups.values() for k in c}, key=lambda k: -groups[first][k])
    top = {k for c in functions.values() for k, _n in c.most_common(args.top)}
    function_keys = sorted(top, key=lambda k: -functions[first][k])
    out: dict[str, Any] = {
        "perf_script": str(args.perf_script),
        "made": str(args.made),
        "samples": {rep: len(samples[rep]) for rep in reps},
        "groups": table(groups, group_keys),
        "functions": table(functions, function_keys),
    }
    print("samples in each window: " + ", ".join(f"{r} {n}" for r, n in out["samples"].items()))
    for title, rows in (("by thread and kind", out["groups"]), ("by function", out["functions"])):
        print(
            f"\n{title}: "
            + " | ".join(reps)
            + " | "
            + " | ".join(f"{r} ÷ {first}" for r in reps[1:])
        )
        for row in rows:
            ratios = " | ".join(str(row[f"{r}_over_{first}"]) for r in reps[1:])
            print(f"  {' | '.join(str(row[r]) for r in reps)} | {ratios} | {row['what'][:100]}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
