"""How close can any model come? The real side of sim-vs-real measured twice, against the goal
(issue 26; docs/simulator.md, "Against the real engines").

    .venv/bin/python benchmarks/sim_vs_real_repeatability.py A.csv B.csv [C.csv ...] [--json OUT]

Every measurement of `make sim-vs-real` replays the same seeded traces, and the simulator is
deterministic: a fixed model gives the same prediction against each. So where the real engine's
own value differs between measurements by more than the goal allows, no prediction meets the goal
against all of them. A goal of ±t around the real value r is met by p when |p / r - 1| <= t; one p
meets it for every measurement only when the largest real value is at most (1 + t) / (1 - t)
times the smallest (the intervals overlap).

Each given results/sim_vs_real.csv holds the real side of one measurement. For each (engine, arm,
rate) and each goal metric (TTFT p50 and p95, X), this prints the real values, their largest ratio
and whether one prediction could meet the goal on all. A TTFT cell counts as a goal check where
some measurement checks it (its rate is at most 90% of that measurement's real saturation rate:
servelab.analysis.sim_vs_real). The saturation rate, a check of its own, is compared the same way.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

from servelab.analysis.sim_vs_real import GOALS, TTFT_GOAL_LOAD, saturation_rate

METRICS = ("ttft_p50", "ttft_p95", "throughput")


def read(path: Path) -> dict[tuple[str, str], list[dict[str, str]]]:
    series: dict[tuple[str, str], list[dict[str, str]]] = {}
    with path.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            series.setdefault((row["engine"], row["arm"]), []).append(row)
    return series


def meetable(values: list[float], tolerance: float) -> bool:
    return max(values) <= (1 + tolerance) / (1 - tolerance) * min(values)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("csv", nargs="+", type=Path, help="sim_vs_real.csv of each measurement")
    parser.add_argument("--keeps-pace", type=float, default=0.97, help="as config sim_vs_real")
    parser.add_argument("--json", type=Path, help="also write the cells here")
    args = parser.parse_args()
    if len(args.csv) < 2:
        parser.error("give two or more measurements")
    measurements = [read(path) for path in args.csv]
    keys = sorted(measurements[0])
    cells: list[dict[str, Any]] = []
    totals = {"checks": 0, "unmeetable": 0}
    for key in keys:
        series = [m[key] for m in measurements]
        saturation = [
            saturation_rate(
                [float(r["rate"]) for r in rows],
                [float(r["throughput_real"]) for r in rows],
                [float(r["arrivals_rps"]) for r in rows],
                args.keeps_pace,
            )
            for rows in series
        ]
        if all(math.isfinite(s) for s in saturation):
            ok = meetable(saturation, GOALS["saturation"])
            print(f"{key[0]:9s} {key[1]:9s} saturation {saturation} {'' if ok else 'UNMEETABLE'}")
            cells.append(
                {
                    "engine": key[0],
                    "arm": key[1],
                    "metric": "saturation",
                    "real": saturation,
                    "meetable": ok,
                }
            )
        for rate in sorted({r["rate"] for r in series[0]}, key=float):
            rows = [next(r for r in s if r["rate"] == rate) for s in series]
            for metric in METRICS:
                values = [float(r[f"{metric}_real"]) for r in rows]
                checked = metric == "throughput" or any(
                    not math.isfinite(s) or float(rate) <= TTFT_GOAL_LOAD * s for s in saturation
                )
                ok = meetable(values, GOALS[metric])
                if checked:
                    totals["checks"] += 1
                    totals["unmeetable"] += not ok
                ratio = max(values) / min(values)
                print(
                    f"{key[0]:9s} {key[1]:9s} {float(rate):4.1f} {metric:10s} "
                    + " ".join(f"{v:8.3f}" for v in values)
                    + f"  x{ratio:.2f}"
                    + ("" if checked else "  (not a check)")
                    + ("" if ok else "  UNMEETABLE")
                )
                cells.append(
                    {
                        "engine": key[0],
                        "arm": key[1],
                        "rate": float(rate),
                        "metric": metric,
                        "real": values,
                        "checked": checked,
                        "meetable": ok,
                    }
                )
    print(
        f"{totals['unmeetable']} of {totals['checks']} goal checks cannot be met by any one "
        "prediction against every measurement"
    )
    if args.json is not None:
        record = {
            "measurements": [str(p) for p in args.csv],
            "goals": GOALS,
            **totals,
            "cells": cells,
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
