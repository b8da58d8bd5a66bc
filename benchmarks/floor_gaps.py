"""Does a lone sequence's decode pass grow with its context? The floor's answer (issue 26;
docs/simulator.md, "Against the real engines").

    .venv/bin/python benchmarks/floor_gaps.py [--results results] [--json out.json]

Every floor run of a results folder (`results/floor/*/runs/{arm}/{engine}/{floor}/{rep}/`), its
single requests read as the CPU platform's fit reads them (`servelab.sim.cpu_fit.observed_times`:
TTFT, and the inter-token gaps between single-token chunks, each one pass). Per run it prints the
median TTFT and the median gap; per engine, the line through every request's median gap against
its prompt length (scipy.stats.linregress: slope in µs per token of context, with its standard
error), and the same for the runs' medians. A slope within about two standard errors of zero is no
evidence that context costs a decode pass anything at these lengths, whatever a single pair of
server runs shows.

Only the floor's own files are read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from scipy import stats

from servelab.sim.cpu_fit import observed_times


def floor_runs(results: Path) -> list[dict[str, Any]]:
    """Per floor run: engine, arm, floor id, rep, prompt tokens, and its requests' medians."""
    out = []
    for run_json in sorted(results.glob("floor/*/runs/*/*/*/*/run.json")):
        rep_dir = run_json.parent
        floor, engine, arm = rep_dir.parts[-2], rep_dir.parts[-3], rep_dir.parts[-4]
        record = json.loads(run_json.read_text())
        if record.get("status") != "ok":
            continue
        ttfts, gaps, prompts = [], [], []
        for row in pq.read_table(rep_dir / "requests.parquet").to_pylist():
            observed = None if row["warmup"] else observed_times(row)
            if observed is None or not observed[1]:
                continue
            ttfts.append(observed[0])
            gaps.append(float(np.median(observed[1])))
            prompts.append(int(row["prompt_tokens"]))
        if gaps:
            out.append(
                {
                    "engine": engine,
                    "arm": arm,
                    "floor": floor,
                    "rep": rep_dir.name,
                    "prompt_tokens": int(np.median(prompts)),
                    "requests": len(gaps),
                    "ttft_p50_ms": round(1e3 * float(np.median(ttfts)), 2),
                    "gap_p50_ms": round(1e3 * float(np.median(gaps)), 3),
                    "request_gaps_ms": [round(1e3 * g, 3) for g in gaps],
                    "request_prompts": prompts,
                }
            )
    return out


def slope(x: list[float], y: list[float]) -> dict[str, float]:
    """The least-squares line of y (ms) against x (tokens), in µs a token, with its error."""
    fit = stats.linregress(x, y)
    return {
        "us_per_token": round(1e3 * float(fit.slope), 3),
        "stderr_us": round(1e3 * float(fit.stderr), 3),
        "intercept_ms": round(float(fit.intercept), 3),
        "points": len(x),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    runs = floor_runs(args.results)
    if not runs:
        print(f"no ok floor run under {args.results}/floor", file=sys.stderr)
        return 1
    print(f"{'engine':10} {'arm':9} {'floor':18} {'rep':5} {'TTFT p50 ms':>11} {'gap p50 ms':>10}")
    for r in runs:
        print(
            f"{r['engine']:10} {r['arm']:9} {r['floor']:18} {r['rep']:5} "
            f"{r['ttft_p50_ms']:11.2f} {r['gap_p50_ms']:10.3f}"
        )
    lines: dict[str, Any] = {}
    for engine in sorted({r["engine"] for r in runs}):
        mine = [r for r in runs if r["engine"] == engine]
        per_request = slope(
            [p for r in mine for p in r["request_prompts"]],
            [g for r in mine for g in r["request_gaps_ms"]],
        )
        per_run = slope([r["prompt_tokens"] for r in mine], [r["gap_p50_ms"] for r in mine])
        lines[engine] = {"requests": per_request, "runs": per_run}
        print(
            f"{engine}: gap against context, every request: {per_request['us_per_token']:+.3f} "
            f"± {per_request['stderr_us']:.3f} µs a token ({per_request['points']} requests); "
            f"the runs' medians: {per_run['us_per_token']:+.3f} ± {per_run['stderr_us']:.3f} "
            f"({per_run['points']} runs)"
        )
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "lines": lines}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
