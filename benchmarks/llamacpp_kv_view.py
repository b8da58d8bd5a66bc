"""Does llama-server attend over more KV cells than it holds? Its own allocator's record, read
from its log (issue 26; docs/simulator.md, "A fourteenth measurement").

    .venv/bin/python benchmarks/llamacpp_kv_view.py SERVER_LOG [--json OUT]

A pass attends over the KV view `llama_kv_cache::get_n_kv` gives: the highest cell in use of its
streams (`used_max_p1`) padded to 256 (llama.cpp 0c1e570, vendored in llama-cpp-python 0.3.36,
src/llama-kv-cache.cpp). The simulated llama.cpp takes a slot's view from its sequence's
positions (servelab.sim.llamacpp, `mask_work`), as if its cells were contiguous. If the allocator
(`find_slot`, `seq_rm`) left holes, the real view would be wider than the model's, and the passes
dearer.

With the environment variable LLAMA_KV_CACHE_DEBUG=1 and `--log-verbosity=5`, `find_slot` logs
every ubatch's allocation: `find_slot: stream[S], n = USED_MAX_P1, used = USED, ...`. The log was
made with the workflow itself, in a scratch clone, on one condition: a config file added after
config/cpu-pair.yaml and config/sim-vs-real.yaml that sets llamacpp's flags to the CPU pair's plus
`--log-verbosity=5`, `conditions` to rate 6.0 alone and `analysis.table_conditions` to
[rate-6.00], and `snakemake --cores 1 results/runs/defaults/llamacpp/rate-6.00/rep1/run.json
results/runs/defaults/llamacpp/rate-6.00/rep2/run.json` run with LLAMA_KV_CACHE_DEBUG=1 in its
environment (the local backend's server inherits it). The debug output slows the server, so the
timing is not the campaign's; the allocation is what is read.

This splits the log at each server start (one a run since fix 9, in the order the runs were
made) and reports, per server life, the allocation calls on a non-empty stream, how many had
`used_max_p1` above `used`, and the padded view over the padded cells in use.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

FIND_SLOT = re.compile(r"find_slot: stream\[(\d+)\], n =\s*(\d+), used =\s*(\d+)")
SERVER_START = "llama_server: initializing"
N_PAD = 256  # get_n_kv: max(n_pad, 256), n_pad 1 for Llama


def padded(cells: int) -> int:
    return max(N_PAD, -(-cells // N_PAD) * N_PAD)


def lives(log: Path) -> list[list[tuple[int, int, int]]]:
    """Per server life: every find_slot line's (stream, used_max_p1, used)."""
    out: list[list[tuple[int, int, int]]] = []
    with log.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if SERVER_START in line:
                out.append([])
            elif out and (match := FIND_SLOT.search(line)):
                stream, n, used = (int(g) for g in match.groups())
                out[-1].append((stream, n, used))
    return out


def summary(calls: list[tuple[int, int, int]]) -> dict[str, Any]:
    held = [(n, used) for _stream, n, used in calls if used > 0]
    if not held:
        return {"calls": 0}
    ratios = [padded(n) / padded(used) for n, used in held]
    return {
        "calls": len(held),
        "streams": len({s for s, _n, used in calls if used > 0}),
        "calls_with_holes": sum(1 for n, used in held if n > used),
        "most_cells_above_used": max(n - used for n, used in held),
        "padded_view_over_padded_used_mean": round(sum(ratios) / len(ratios), 4),
        "padded_view_over_padded_used_max": round(max(ratios), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("server_log", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found = lives(args.server_log)
    if not any(found):
        raise SystemExit(
            f"{args.server_log}: no find_slot line (run the server with LLAMA_KV_CACHE_DEBUG=1 "
            "and --log-verbosity=5)"
        )
    out = {"server_log": str(args.server_log), "lives": [summary(calls) for calls in found]}
    for k, life in enumerate(out["lives"], start=1):
        print(f"server life {k}: {life}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
