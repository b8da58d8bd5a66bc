"""Where are a loaded run's single-request passes slower than predicted: alone, or while another
request is on its way in? (issue 26; docs/simulator.md, "Would a run's own passes have told a slow
block?").

    .venv/bin/python benchmarks/sim_vs_real_single_passes.py --results results [--min-gaps 20]
        [--json OUT.json]

Reads a sim-vs-real results folder: each loaded run's requests (`runs/ARM/ENGINE/COND/REP`) and
its prediction (`sim_vs_real/predicted/...`). In each, the engine's steps as the client saw them
(`servelab.analysis.sim_vs_real.client_steps`, the rule of the workflow's iteration profile,
warm-ups left out), and each step's time from the step before it to its own. A step that served
one request and gave no first token is a single-request pass. It is *arriving* when another
request had been sent and had not yet had its first chunk at some moment of the step (in V1 that
is the API server's work on the request, on the engine's core, and its prefill), and *alone*
otherwise.

Printed per engine, arm and light-load rate (0.5, 1 and 2 graphs/s): for each kind, the median
over repetitions of the real median gap ÷ the predicted one, each repetition's from at least
`--min-gaps` gaps on both sides, with the medians of the first repetition in ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from servelab.analysis.sim_vs_real import client_steps

LIGHT_LOAD = ("rate-0.50", "rate-1.00", "rate-2.00")
KINDS = ("alone", "arriving")


def single_pass_gaps(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The times of a run's single-request passes, by kind (module docstring). Warm-ups are left
    out: they are not the trace's."""
    measured = [r for r in rows if not r["warmup"]]
    # (sent, first chunk) of every request that had a first chunk
    arrivals = [(r["sent_s"], r["chunk_times_s"][0]) for r in measured if r["chunk_times_s"]]
    gaps: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for before, step in itertools.pairwise(client_steps(measured)):
        if step.firsts or len(step.served) != 1:
            continue
        arriving = any(sent < step.first_s and first > before.first_s for sent, first in arrivals)
        gaps["arriving" if arriving else "alone"].append(step.first_s - before.first_s)
    return gaps


def run_gaps(run_dir: Path) -> dict[str, list[float]]:
    path = run_dir / "requests.parquet"
    if not path.is_file():
        raise SystemExit(f"no {path}")
    return single_pass_gaps(pq.read_table(path).to_pylist())


def block_ratio(
    real: list[dict[str, list[float]]], predicted: list[dict[str, list[float]]], min_gaps: int
) -> dict[str, Any]:
    """Per kind, the median over repetitions of real ÷ predicted median gap, from the
    repetitions with at least `min_gaps` gaps of that kind on both sides."""
    result: dict[str, Any] = {}
    for kind in KINDS:
        ratios, medians = [], []
        for real_rep, predicted_rep in zip(real, predicted, strict=True):
            if min(len(real_rep[kind]), len(predicted_rep[kind])) < min_gaps:
                continue
            real_median = statistics.median(real_rep[kind])
            predicted_median = statistics.median(predicted_rep[kind])
            ratios.append(real_median / predicted_median)
            medians.append((round(real_median * 1e3, 2), round(predicted_median * 1e3, 2)))
        result[kind] = {
            "repetitions": len(ratios),
            "ratio": round(statistics.median(ratios), 4) if ratios else None,
            "first_ms": medians[0] if medians else None,
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--min-gaps", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs_root = args.results / "runs"
    predicted_root = args.results / "sim_vs_real" / "predicted"
    if not runs_root.is_dir() or not predicted_root.is_dir():
        raise SystemExit(f"{args.results}: no runs/ or sim_vs_real/predicted/")
    blocks = []
    for arm_dir in sorted(p for p in runs_root.iterdir() if p.is_dir()):
        for engine_dir in sorted(p for p in arm_dir.iterdir() if p.is_dir()):
            for condition in LIGHT_LOAD:
                condition_dir = engine_dir / condition
                if not condition_dir.is_dir():
                    continue
                reps = sorted(p.name for p in condition_dir.iterdir() if p.is_dir())
                relative = condition_dir.relative_to(runs_root)
                real = [run_gaps(condition_dir / rep) for rep in reps]
                predicted = [run_gaps(predicted_root / relative / rep) for rep in reps]
                blocks.append(
                    {
                        "engine": engine_dir.name,
                        "arm": arm_dir.name,
                        "condition": condition,
                        **block_ratio(real, predicted, args.min_gaps),
                    }
                )
    print("engine    arm       condition  | real ÷ predicted median gap: alone  arriving")
    for block in sorted(blocks, key=lambda b: (b["engine"], b["arm"], b["condition"])):
        cells = []
        for kind in KINDS:
            entry = block[kind]
            ratio = "  -  " if entry["ratio"] is None else f"{entry['ratio']:.3f}"
            ms = (
                ""
                if entry["first_ms"] is None
                else f" ({entry['first_ms'][0]}/{entry['first_ms'][1]} ms)"
            )
            cells.append(f"{ratio}{ms}")
        print(
            f"{block['engine']:<9} {block['arm']:<9} {block['condition']:<10} | " + "  ".join(cells)
        )
    if args.json:
        args.json.write_text(
            json.dumps({"min_gaps": args.min_gaps, "blocks": blocks}, indent=1) + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
