"""An engine's steps rebuilt from what its clients received, real against predicted (issue 26;
docs/simulator.md, "The front end's work, step by step").

    .venv/bin/python benchmarks/sim_vs_real_steps.py --results results \\
        --run defaults/vllm_v1/rate-6.00 [--run ...] [--predicted DIR] [--passes PASSES] \\
        [--gap-ms 2] [--merge-ms 10] [--json OUT]

vLLM V1 streams the tokens of one engine step to every request it served in the step together,
so the client's chunks (`chunk_times_s` of requests.parquet, one token each) come in bursts, one
a step. The engines' own counters give only totals (benchmarks/sim_vs_real_passes.py); the bursts
give each step: `servelab.analysis.sim_vs_real.client_steps`, the rule the workflow's iteration
profile uses, with its silence (`--gap-ms`) and merge window (`--merge-ms`) as options. The
predicted runs (`--predicted`, the workflow's results/sim_vs_real/predicted) hold the simulated steps' tokens at the steps' ends, and the same
rebuilding gives back the simulator's own count of steps with output (`sim.steps_with_output` of
their run.json), which the script checks.

For every repetition of each `--run`, on both sides:
- the steps, and the real engine's own count of its steps with output where `--passes` (the JSON
  of benchmarks/sim_vs_real_passes.py on the same results) gives it;
- each step's time (from the burst before it to its own) by kind: steps that only decode, by the
  requests served, and steps that emit first tokens, by how many;
- for the requests sent while another was in flight: how many steps ended between a request's
  send and its first token (median), and its time to first token;
- a least-squares line through the decode-only steps: time = base + per_seq x requests served
  + per_sent x requests sent while the step ran, with each coefficient's standard error. A
  request's front-end work (tokenising, on the engine's core) slows the step running while it is
  done: that is `per_sent`.

Only the runs' artifacts are read; nothing is fitted to them but the line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from servelab.analysis.sim_vs_real import STEP_GAP_S, STEP_MERGE_S, ClientStep, client_steps

# The decode-only steps' groups (requests served), and the most first tokens a group separates.
SERVED_BIN = 5
MOST_FIRSTS = 4


def step_kind(step: ClientStep) -> str:
    """`dNN`: decode only, NN and more requests served (SERVED_BIN a group); `fN`: N first
    tokens (MOST_FIRSTS: that many or more)."""
    if step.firsts:
        return f"f{min(step.firsts, MOST_FIRSTS)}"
    return f"d{SERVED_BIN * (len(step.served) // SERVED_BIN):02d}"


def decode_line(steps: list[ClientStep], sent_s: np.ndarray) -> dict[str, Any]:
    """time = base + per_seq x served + per_sent x requests sent during the step, over the
    decode-only steps (least squares), with standard errors (seconds)."""
    rows, times = [], []
    for before, step in itertools.pairwise(steps):
        if step.firsts:
            continue
        sent = int(np.count_nonzero((sent_s >= before.first_s) & (sent_s < step.first_s)))
        rows.append([1.0, float(len(step.served)), float(sent)])
        times.append(step.first_s - before.first_s)
    x, y = np.array(rows).reshape(-1, 3), np.array(times)
    if len(y) <= x.shape[1] or np.linalg.matrix_rank(x) < x.shape[1]:
        return {"steps": len(y), "coefficients_s": None}
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ coef
    sigma2 = float(residual @ residual) / (len(y) - x.shape[1])
    se = np.sqrt(np.diag(sigma2 * np.linalg.inv(x.T @ x)))
    names = ("base", "per_seq", "per_sent")
    return {
        "steps": len(y),
        "steps_with_sends": int(np.count_nonzero(x[:, 2])),
        "coefficients_s": {n: round(float(c), 7) for n, c in zip(names, coef, strict=True)},
        "standard_errors_s": {n: round(float(s), 7) for n, s in zip(names, se, strict=True)},
    }


def step_times_by_kind(steps: list[ClientStep]) -> dict[str, dict[str, float]]:
    """Per kind (step_kind): the steps, their median and their total time (seconds)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for before, step in itertools.pairwise(steps):
        groups[step_kind(step)].append(step.first_s - before.first_s)
    return {
        kind: {
            "steps": len(times),
            "median_s": round(float(np.median(times)), 6),
            "total_s": round(float(np.sum(times)), 4),
        }
        for kind, times in sorted(groups.items())
    }


def busy_waits(requests: list[dict[str, Any]], steps: list[ClientStep]) -> dict[str, Any]:
    """For the requests sent while another was in flight (sent before, its last token after):
    how many steps ended between a request's send and its first token (the other requests'
    bursts), and its time to first token, as medians. A request the engine admits in the step
    after the one running at its send has 1; each step it waits longer adds one."""
    measured = [
        r for r in requests if not r["warmup"] and r["status"] == "ok" and r["chunk_times_s"]
    ]
    spans = [(float(r["sent_s"]), r["chunk_times_s"][-1]) for r in measured]
    ends = np.array([s.first_s for s in steps])
    waits, ttfts = [], []
    for r in measured:
        sent, first = float(r["sent_s"]), r["chunk_times_s"][0]
        if not any(a < sent < b for a, b in spans):
            continue
        # the request's own first burst is the step that gave its first token: not counted
        waits.append(int(np.count_nonzero((ends > sent) & (ends < first - 1e-4))))
        ttfts.append(first - sent)
    if not waits:
        return {"requests": 0}
    return {
        "requests": len(waits),
        "median_steps_before_first_token": float(np.median(waits)),
        "median_ttft_s": round(float(np.median(ttfts)), 6),
    }


def engine_passes(path: Path | None) -> dict[str, int]:
    """run id -> the real engine's own count of its passes (for vLLM V1: steps with output), from
    benchmarks/sim_vs_real_passes.py's JSON; empty without one."""
    if path is None:
        return {}
    return {row["run_id"]: int(row["real_passes"]) for row in json.loads(path.read_text())}


def one_side(run_dir: Path, gap_s: float, merge_s: float) -> dict[str, Any]:
    requests = pq.read_table(run_dir / "requests.parquet").to_pylist()
    steps = client_steps([r for r in requests if r["status"] == "ok"], gap_s, merge_s)
    sent = np.array(
        sorted(float(r["sent_s"]) for r in requests if r["sent_s"] is not None), dtype=float
    )
    run = json.loads((run_dir / "run.json").read_text())
    sim = run.get("sim") or {}
    return {
        "steps": len(steps),
        "steps_of_the_simulator": sim.get("steps_with_output"),
        "mean_served": round(float(np.mean([len(s.served) for s in steps])), 3),
        "by_kind": step_times_by_kind(steps),
        "decode_line": decode_line(steps, sent),
        "sent_while_busy": busy_waits(requests, steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument(
        "--run", action="append", required=True, help="ARM/ENGINE/CONDITION, every repetition"
    )
    parser.add_argument(
        "--predicted", type=Path, help="predicted runs (default RESULTS/sim_vs_real/predicted)"
    )
    parser.add_argument(
        "--passes",
        type=Path,
        help="benchmarks/sim_vs_real_passes.py's JSON of the same results: the engine's own counts",
    )
    parser.add_argument("--gap-ms", type=float, default=1e3 * STEP_GAP_S)
    parser.add_argument("--merge-ms", type=float, default=1e3 * STEP_MERGE_S)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    predicted = args.predicted or args.results / "sim_vs_real" / "predicted"
    gap_s, merge_s = args.gap_ms / 1e3, args.merge_ms / 1e3
    out: dict[str, Any] = {
        "results": str(args.results),
        "predicted": str(predicted),
        "gap_ms": args.gap_ms,
        "merge_ms": args.merge_ms,
        "runs": {},
    }
    counted_by_engine = engine_passes(args.passes)
    for run in args.run:
        reps = sorted(p.name for p in (args.results / "runs" / run).glob("rep*") if p.is_dir())
        if not reps:
            raise SystemExit(f"--run {run}: no repetition under {args.results / 'runs' / run}")
        for rep in reps:
            name = f"{run}/{rep}"
            sides = {
                "real": {
                    **one_side(args.results / "runs" / name, gap_s, merge_s),
                    "steps_of_the_engine": counted_by_engine.get(name),
                },
                "predicted": one_side(predicted / name, gap_s, merge_s),
            }
            rebuilt, counted = (
                sides["predicted"]["steps"],
                sides["predicted"]["steps_of_the_simulator"],
            )
            if counted is not None and rebuilt != counted:
                print(
                    f"{name}: the predicted bursts give {rebuilt} steps, the simulator counted "
                    f"{counted}",
                    file=sys.stderr,
                )
            out["runs"][name] = sides
            print_run(name, sides)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


def print_run(name: str, sides: dict[str, dict[str, Any]]) -> None:
    real, pred = sides["real"], sides["predicted"]
    print(
        f"{name}: steps real {real['steps']} (engine {real['steps_of_the_engine']}), "
        f"predicted {pred['steps']} (simulator {pred['steps_of_the_simulator']}); "
        f"requests a step {real['mean_served']} and {pred['mean_served']}"
    )
    for label, side in (("real", real), ("predicted", pred)):
        line = side["decode_line"]
        if line["coefficients_s"] is None:
            print(f"  {label:9s} decode-only line: too few steps ({line['steps']})")
            continue
        c, se = line["coefficients_s"], line["standard_errors_s"]
        print(
            f"  {label:9s} decode-only steps {line['steps']:4d}: base {1e3 * c['base']:.2f} ms, "
            f"per request served {1e3 * c['per_seq']:.3f} ms, per request sent "
            f"{1e3 * c['per_sent']:.2f} ± {1e3 * se['per_sent']:.2f} ms "
            f"({line['steps_with_sends']} steps with a send)"
        )
    busy = [side["sent_while_busy"] for side in (real, pred)]
    if busy[0]["requests"]:
        print(
            f"  sent while another was in flight: {busy[0]['requests']} requests; steps before "
            f"the first token (median) real {busy[0]['median_steps_before_first_token']:g}, "
            f"predicted {busy[1].get('median_steps_before_first_token', float('nan')):g}; "
            f"TTFT {1e3 * busy[0]['median_ttft_s']:.1f} and "
            f"{1e3 * busy[1].get('median_ttft_s', float('nan')):.1f} ms"
        )
    kinds = sorted(set(real["by_kind"]) | set(pred["by_kind"]))
    print(f"  {'kind':5s} {'real: steps, median ms, total s':>34s} {'predicted':>28s}")
    for kind in kinds:
        cells = []
        for side in (real, pred):
            k = side["by_kind"].get(kind)
            cells.append(
                f"{k['steps']:5d} {1e3 * k['median_s']:7.1f} {k['total_s']:7.2f}"
                if k
                else f"{'-':>5s} {'-':>7s} {'-':>7s}"
            )
        print(f"  {kind:5s} {cells[0]:>34s} {cells[1]:>28s}")


if __name__ == "__main__":
    main()
