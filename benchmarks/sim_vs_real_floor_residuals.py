"""The CPU platform against its own floor, shape by shape (issue 26; docs/simulator.md,
"Against the real engines").

    .venv/bin/python benchmarks/sim_vs_real_floor_residuals.py --results results \\
        [--platform results/sim_vs_real/platform.json] \\
        [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml] [--json OUT]

The fit (`servelab.sim.cpu_fit`) pools every floor run of an engine, both arms and every shape,
into one least-squares problem, and its report keeps only the pooled errors. A prediction of a
loaded run at light load is mostly the condition's shape alone, so the pooled error hides what
matters there. This replays every `ok` floor run of `--results` as the fit does
(`floor_rows`, on the fitted platform's own timing), prices each row with the platform's
coefficients, and prints per floor run, in the order the runs were made (UTC start time):
- the median observed and predicted time to first token of its single requests, and their
  ratio (predicted ÷ observed);
- the same for its single requests' inter-token gaps (each request's median gap) and for its
  warm-ups' gaps, the fit's only passes of several sequences;
- on a floor with idle gaps (config `floor.idle_gaps`), the requests after each gap apart
  (`after_idle_ttft`), priced on the linear model alone: what the after-idle term is fitted to;
then, per engine and arm, the median of its floor runs' TTFT ratios (`by_arm` in `--json`): a
direction that the pooled fit gives one arm's floor and not the other's.

Nothing is fitted here: the coefficients are the platform file's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import floor_runs
from sim_vs_real_fit_rules import step_costs_in
from sim_vs_real_slowdown import add_config_arguments, config_of, platform_file

from servelab.sim.cpu_fit import FloorRun, floor_rows
from servelab.sim.cpu_platform import StepCost


def _ratio(predicted: list[float], observed: list[float]) -> dict[str, float] | None:
    if not observed:
        return None
    p, o = float(np.median(predicted)), float(np.median(observed))
    return {
        "n": len(observed),
        "observed_ms": round(1e3 * o, 2),
        "predicted_ms": round(1e3 * p, 2),
        "ratio": round(p / o, 3),
    }


def residuals(run: FloorRun, cost: StepCost, config: dict[str, Any]) -> dict[str, Any]:
    """One floor run's median predicted and observed times, by kind of row."""
    warmup_ids = {
        r["request_id"]
        for r in pq.read_table(
            run.run_dir / "requests.parquet", columns=["request_id", "warmup"]
        ).to_pylist()
        if r["warmup"]
    }
    rows = floor_rows(
        run,
        gpu_memory_mib=int(config["gpu"]["memory_mib"]),
        model_preset=str(config["model"]["preset"]),
        timing=cost,
    )
    weights = np.array(list(cost.coefficients().values()))
    kinds: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    gaps: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        predicted = float(row.features @ weights)
        if row.after_idle:  # after a floor's idle gap: the linear model's miss there, apart
            if row.kind == "ttft":
                kinds["after_idle_ttft"][0].append(predicted)
                kinds["after_idle_ttft"][1].append(row.observed_s)
            continue
        if row.kind == "ttft":
            kinds["ttft"][0].append(predicted)
            kinds["ttft"][1].append(row.observed_s)
        else:
            gaps[row.request_id].append((predicted, row.observed_s))
    for request_id, pairs in gaps.items():
        kind = "warmup_gap" if request_id in warmup_ids else "gap"
        kinds[kind][0].append(float(np.median([p for p, _ in pairs])))
        kinds[kind][1].append(float(np.median([o for _, o in pairs])))
    record = json.loads((run.run_dir / "run.json").read_text(encoding="utf-8"))
    started = datetime.fromtimestamp(float(record["start_unix_s"]), tz=UTC)
    return {
        "engine": run.engine,
        "arm": run.arm,
        "shape": run.run_dir.parent.name,
        "rep": run.run_dir.name,
        "started_utc": started.strftime("%Y-%m-%dT%H:%M:%S"),
        **{kind: _ratio(*kinds[kind]) for kind in ("ttft", "gap", "warmup_gap", "after_idle_ttft")},
    }


def by_arm(rows: list[dict[str, Any]]) -> dict[str, float]:
    """ENGINE/ARM -> the median TTFT ratio of its floor runs."""
    ratios: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["ttft"] is not None:
            ratios[f"{r['engine']}/{r['arm']}"].append(r["ttft"]["ratio"])
    return {k: round(float(np.median(v)), 3) for k, v in sorted(ratios.items())}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument(
        "--platform",
        type=Path,
        help="default: RESULTS/sim_vs_real/platform.json; or sim_vs_real_fit_rules.py's --json",
    )
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = config_of(args)
    platform = platform_file(args.results, args.platform)
    costs = step_costs_in(platform)
    runs = [r for r in floor_runs(args.results) if r.engine in costs]
    if not runs:
        raise SystemExit(f"{args.results}: no ok floor run of an engine in {platform}")
    out = sorted(
        (residuals(run, costs[run.engine], config) for run in runs),
        key=lambda r: (r["engine"], r["started_utc"]),
    )
    print(
        "engine    arm       shape                 rep   started (UTC)        TTFT ÷   gap ÷  warm-up gap ÷"
        "  after-idle TTFT ÷"
    )
    for r in out:
        cells = [
            "" if r[k] is None else f"{r[k]['ratio']:.3f} ({r[k]['observed_ms']:.1f})"
            for k in ("ttft", "gap", "warmup_gap", "after_idle_ttft")
        ]
        print(
            f"{r['engine']:9} {r['arm']:9} {r['shape']:21} {r['rep']:5} {r['started_utc']}  "
            + "  ".join(f"{c:15}" for c in cells)
        )
    print("(predicted ÷ observed, the observed median in ms in brackets)")
    arms = by_arm(out)
    for name, ratio in arms.items():
        print(f"{name:20} median TTFT ÷ over its floor runs: {ratio}")
    if args.json is not None:
        record = {"runs": out, "by_arm": arms}
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
