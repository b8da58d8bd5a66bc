"""What a request's launch costs llama-server against what the server has served before, read
from a results folder's own server logs (issue 26; docs/llamacpp.md, "A fresh server for every
run").

    .venv/bin/python benchmarks/llamacpp_launch_cost.py --results results [--bin 250] [--json OUT]

Between the line get_available_slot prints when it picks a slot ("selected slot by ...") and the
line launch_slot_with_task prints ("processing task") llama-server saves the slot's prompt to its
host prompt cache, loads the best cached entry and trims the cache (llama.cpp 0c1e570 (vendored
in llama-cpp-python 0.3.36), tools/server/server-context.cpp, get_available_slot;
tools/server/server-task.cpp, server_prompt_cache::alloc, ::load, ::update). The cache keeps
every prompt (`--cache-ram 8192` MiB by default holds thousands of the tiny model's), and alloc
and load compare the prompt with every entry, so that time grows with the server's history.

Every llama.cpp deployment's `server.log` under `--results/deployments/` is split into the lives
of its server (each start's first line, `servelab.engines.llamacpp.SERVER_START`), and each
launch is numbered by the requests that server had launched before it. Printed: per
deployment, the server lives, the most requests one life launched, and the median launch time
by history bin (`--bin` requests wide), with the launches in each bin. Only the logs are read: a server started before each run has a
short history, one that served the whole campaign a long one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from servelab.engines.llamacpp import SERVER_START, log_seconds


def launch_ms(log_text: str) -> list[list[float]]:
    """Each server life's launch times in milliseconds, in order: from a slot's selection
    (get_available_slot's "selected slot" line) to its launch (launch_slot_'s line). Each start's
    first line (`SERVER_START`) begins a new life; text before the first is a life too (a log
    read from the middle)."""
    lives: list[list[float]] = [[]]
    selected: float | None = None
    for line in log_text.splitlines():
        t = log_seconds(line)
        if t is None:
            continue
        if SERVER_START.search(line):
            lives.append([])
            selected = None
        elif "get_availabl" in line and "selected slot" in line:
            selected = t
        elif "launch_slot_" in line and selected is not None:
            lives[-1].append((t - selected) * 1e3)
            selected = None
    return [life for life in lives if life]


def by_history(lives: list[list[float]], width: int) -> list[dict[str, Any]]:
    """Median launch time of the launches made after [lo, lo + width) earlier launches."""
    bins: dict[int, list[float]] = {}
    for life in lives:
        for before, ms in enumerate(life):
            bins.setdefault(before // width * width, []).append(ms)
    return [
        {
            "served_before": f"{lo}-{lo + width - 1}",
            "launches": len(bins[lo]),
            "median_ms": round(statistics.median(bins[lo]), 3),
        }
        for lo in sorted(bins)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--bin", type=int, default=250)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.bin < 1:
        parser.error(f"--bin {args.bin}: at least 1 request")
    report: dict[str, Any] = {}
    for local in sorted((args.results / "deployments").glob("*/local.json")):
        state = json.loads(local.read_text(encoding="utf-8"))
        if state.get("engine") != "llamacpp":
            continue
        log = local.parent / "server.log"
        if not log.is_file():
            raise SystemExit(f"{log}: missing (the deployment's server log)")
        lives = launch_ms(log.read_text(encoding="utf-8", errors="replace"))
        rows = by_history(lives, args.bin)
        report[local.parent.name] = {
            "server_lives": len(lives),
            "most_launches_in_a_life": max((len(x) for x in lives), default=0),
            "by_history": rows,
        }
        print(
            f"{local.parent.name}: {len(lives)} server lives, at most "
            f"{report[local.parent.name]['most_launches_in_a_life']} launches in one"
        )
        for row in rows:
            print(
                f"  after {row['served_before']:>11} launches: median {row['median_ms']:7.3f} ms"
                f" over {row['launches']} launches"
            )
    if not report:
        raise SystemExit(f"{args.results}: no llama.cpp deployment under deployments/")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
