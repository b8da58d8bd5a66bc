"""Did the floor move with the loaded runs? Two sim-vs-real measurements of the same code on the
same machine, deployment by deployment (issue 26; docs/simulator.md, "A fourteenth look").

    .venv/bin/python benchmarks/sim_vs_real_floor_drift.py --results A/results B/results \\
        [--passes A_passes.json B_passes.json] [--json OUT]

The platform is fitted from each measurement's floor alone, so a prediction can only follow the
machine as far as its floor saw it. This sets the two measurements' floors side by side, as
observed and before any fit: for every (engine, arm, shape), each repetition's median TTFT and
median inter-token gap of its own single requests (warm-ups left out, times read as the fit reads
them: `servelab.sim.cpu_fit.observed_times`), and the ratio B ÷ A of their means over the
repetitions. Per deployment (engine, arm), and per engine over both arms (the fit pools them),
it gives the geometric mean of those ratios.

With `--passes`, the two measurements' `sim_vs_real_passes.py` outputs, it sets beside them what
the loaded runs did: per deployment and per load, B ÷ A of the real and of the predicted time a
pass, as geometric means over each load's runs. A time a pass there is the run's window over the
engine's own pass count (over the simulated passes for the prediction). At heavy load, 3
graphs/s and over, the engine's core was busy 0.56-0.96 of the window on the thirteenth, and it
is mostly a pass's cost; at light load, 2 graphs/s and under, it is mostly idle time, shown only
beside the heavy rows. If the
floor and the heavy passes moved together, the real and predicted ratios agree; where the floor
moved and the heavy passes did not, the predicted ratio moves alone, and so does the miss. A
pass's time depends on the tokens in it, which the same trace keeps about equal; the output has
both measurements' real tokens a pass too.

Only artifacts are read: each run's run.json and requests.parquet, and the given JSON files.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import floor_runs

from servelab.sim.cpu_fit import observed_times

LIGHT_MAX_RATE = 2.0  # graphs/s; the loads the TTFT goal checks on every measurement so far


def floor_medians(results: Path) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
    """Per (engine, arm, shape): each repetition's (median TTFT, median gap) in ms."""
    out: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for run in floor_runs(results):
        ttft, gaps = [], []
        for row in pq.read_table(run.run_dir / "requests.parquet").to_pylist():
            observed = observed_times(row)
            if row["warmup"] or observed is None:
                continue
            ttft.append(observed[0])
            gaps.extend(observed[1])
        key = (run.engine, run.arm, run.run_dir.parent.name)
        out.setdefault(key, []).append((float(np.median(ttft)) * 1e3, float(np.median(gaps)) * 1e3))
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def compare_floors(a: Path, b: Path) -> dict[str, Any]:
    first, second = floor_medians(a), floor_medians(b)
    shared = sorted(set(first) & set(second))
    if not shared:
        raise SystemExit(f"{a} and {b}: no floor (engine, arm, shape) in common")
    shapes = []
    for key in shared:
        mean_a = np.mean(first[key], axis=0)
        mean_b = np.mean(second[key], axis=0)
        shapes.append(
            {
                "engine": key[0],
                "arm": key[1],
                "shape": key[2],
                "a_ms": [round(float(v), 3) for v in mean_a],
                "b_ms": [round(float(v), 3) for v in mean_b],
                "ttft_ratio": round(float(mean_b[0] / mean_a[0]), 3),
                "gap_ratio": round(float(mean_b[1] / mean_a[1]), 3),
            }
        )
    deployments: dict[str, dict[str, float]] = {}
    for engine, arm in sorted({(s["engine"], s["arm"]) for s in shapes}):
        mine = [s for s in shapes if (s["engine"], s["arm"]) == (engine, arm)]
        deployments[f"{engine}/{arm}"] = {
            "floor_ttft_ratio": round(_geomean([s["ttft_ratio"] for s in mine]), 3),
            "floor_gap_ratio": round(_geomean([s["gap_ratio"] for s in mine]), 3),
        }
    engines = {
        engine: {
            "floor_ttft_ratio": round(
                _geomean([s["ttft_ratio"] for s in shapes if s["engine"] == engine]), 3
            ),
            "floor_gap_ratio": round(
                _geomean([s["gap_ratio"] for s in shapes if s["engine"] == engine]), 3
            ),
        }
        for engine in sorted({s["engine"] for s in shapes})
    }
    return {"shapes": shapes, "deployments": deployments, "engines": engines}


def _rate(run_id: str) -> float:
    condition = run_id.split("/")[2]
    if not condition.startswith("rate-"):
        raise SystemExit(f"{run_id}: not a loaded run of a rate sweep")
    return float(condition.removeprefix("rate-"))


def compare_passes(a: Path, b: Path) -> dict[str, dict[str, dict[str, float]]]:
    """Per deployment and load: B ÷ A of the real and the predicted time a pass."""
    first = {r["run_id"]: r for r in json.loads(a.read_text(encoding="utf-8"))}
    second = {r["run_id"]: r for r in json.loads(b.read_text(encoding="utf-8"))}
    grouped: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for run_id in sorted(set(first) & set(second)):
        arm, engine = run_id.split("/")[:2]
        load = "light" if _rate(run_id) <= LIGHT_MAX_RATE else "heavy"
        grouped.setdefault((f"{engine}/{arm}", load), []).append((first[run_id], second[run_id]))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (deployment, load), pairs in sorted(grouped.items()):
        out.setdefault(deployment, {})[load] = {
            "runs": len(pairs),
            "real_ms_ratio": round(
                _geomean([y["real_ms_per_pass"] / x["real_ms_per_pass"] for x, y in pairs]), 3
            ),
            "predicted_ms_ratio": round(
                _geomean(
                    [y["predicted_ms_per_pass"] / x["predicted_ms_per_pass"] for x, y in pairs]
                ),
                3,
            ),
            "a_real_tokens_per_pass": round(
                float(np.mean([x["real_tokens_per_pass"] for x, _ in pairs])), 1
            ),
            "b_real_tokens_per_pass": round(
                float(np.mean([y["real_tokens_per_pass"] for _, y in pairs])), 1
            ),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, nargs=2, required=True, metavar=("A", "B"))
    parser.add_argument("--passes", type=Path, nargs=2, metavar=("A_JSON", "B_JSON"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    a, b = args.results
    out: dict[str, Any] = {"a": str(a), "b": str(b), **compare_floors(a, b)}
    print(f"B = {b}, A = {a}")
    print(f"{'engine/arm/shape':42} {'TTFT B/A':>9} {'gap B/A':>9}")
    for s in out["shapes"]:
        name = f"{s['engine']}/{s['arm']}/{s['shape']}"
        print(f"{name:42} {s['ttft_ratio']:9.3f} {s['gap_ratio']:9.3f}")
    if args.passes:
        out["passes"] = compare_passes(*args.passes)
    print(
        f"\n{'deployment':20} {'floor TTFT':>10} {'floor gap':>10}"
        + (
            f" {'load':>6} {'real/pass':>10} {'pred/pass':>10} {'tok/pass A, B':>14}"
            if args.passes
            else ""
        )
    )
    for deployment, floor in out["deployments"].items():
        head = f"{deployment:20} {floor['floor_ttft_ratio']:10.3f} {floor['floor_gap_ratio']:10.3f}"
        loads = out.get("passes", {}).get(deployment, {})
        if not loads:
            print(head)
        for i, (load, p) in enumerate(sorted(loads.items(), key=lambda kv: kv[0] != "light")):
            print(
                (head if i == 0 else " " * len(head))
                + f" {load:>6} {p['real_ms_ratio']:10.3f} {p['predicted_ms_ratio']:10.3f}"
                + f" {p['a_real_tokens_per_pass']:6.1f}, {p['b_real_tokens_per_pass']:6.1f}"
            )
    for engine, floor in out["engines"].items():
        print(
            f"{engine + ' (both arms)':20} {floor['floor_ttft_ratio']:10.3f}"
            f" {floor['floor_gap_ratio']:10.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
