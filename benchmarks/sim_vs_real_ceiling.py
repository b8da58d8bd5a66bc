"""How many of the goal's checks could a perfect model meet on this machine? The ceiling that the
engines' run-to-run speed sets for a floor-only prediction (issue 26; docs/simulator.md, "The
floor's prices on the engine's own steps").

    .venv/bin/python benchmarks/sim_vs_real_ceiling.py --results results \\
        [--run-sd 0.033] [--deployment-sd 0.02] [--draws 200] [--seed 0] \\
        [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml] [--json OUT] \\
        [--grid [--repetitions N]]

A real step costs its floor-fitted price times a level that belongs to the run: two repetitions
of one condition a minute apart differ by rms 0.047 in ln, so one run's level has an sd of about
0.047 / sqrt(2) = 0.033 in ln, and each deployment's runs share a level of their own against the
pooled fit (vllm_request_trace.py --platform on a traced engine). This takes the prediction as the
truth and asks how often the goal's checks would hold if the real runs were that prediction run at
such levels:
- every loaded run of `--results` is predicted on its fitted platform (`sim_vs_real/platform.json`)
  at each slowdown of a grid (0.90 to 1.10 by 0.02: `sim_vs_real_slowdown.py`'s `slowed_by`, every
  linear coefficient of the step cost times the slowdown);
- each draw gives every deployment (engine and arm) a level exp(N(0, deployment_sd²)) and each run
  its own exp(N(0, run_sd²)) on top, both seeded by `--seed`; the run's "real" side is its
  prediction at the grid's slowdown nearest its level, and its predicted side the prediction at 1;
- `servelab.analysis.sim_vs_real.compare_runs` scores the draw exactly as the workflow scores a
  measurement (`sim_vs_real_fit_rules.py`'s `tally`: the saturation checks included).

It prints the checks met over the draws (mean, the 5th, 50th and 95th percentiles, the share of
draws that meet them all) and each check's share of draws met. A check met in few draws is one the
machine's speed alone decides; a perfect model misses it as often. The levels are the only thing
drawn: everything else of a real run (its arrivals, its engine's batching) is the prediction's, so
this is a ceiling, not a forecast. Nothing under `--results` is written.

The runs are the real loaded runs under `--results`. With `--grid` they are the configured grid's
instead (`servelab.grid.config.runs`; `--repetitions` as `--config repetitions=N` gives the
workflow), so the ceiling of a measurement can be computed and stated before its loaded runs are
made: it needs only the floors' fitted platform and the compiled traces.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_fit_rules import loaded_runs, run_pair, tally
from sim_vs_real_slowdown import (
    add_config_arguments,
    config_of,
    platform_file,
    predict_into,
    slowed_by,
    trace_folder,
)

from servelab.analysis.sim_vs_real import compare_runs
from servelab.grid.config import analysis_settings, conditions
from servelab.grid.config import runs as grid_runs
from servelab.sim.cpu_fit import read_step_costs

GRID = tuple(round(0.90 + 0.02 * k, 2) for k in range(11))  # 0.90 ... 1.10

Run = tuple[str, str, str, str]  # (arm, engine, condition, rep)


def nearest_scale(level: float, grid: Sequence[float]) -> float:
    """The grid's slowdown nearest `level` in ln (the grid's ends for a level beyond them)."""
    return min(grid, key=lambda g: abs(math.log(g) - math.log(level)))


def draw_levels(
    rng: np.random.Generator, runs: Sequence[Run], run_sd: float, deployment_sd: float
) -> dict[Run, float]:
    """One draw: each deployment's (engine, arm) level times each run's own, every run."""
    deployments = sorted({(engine, arm) for arm, engine, _, _ in runs})
    shared = dict(zip(deployments, rng.normal(0.0, deployment_sd, len(deployments)), strict=True))
    own = rng.normal(0.0, run_sd, len(runs))
    return {run: math.exp(shared[(run[1], run[0])] + e) for run, e in zip(runs, own, strict=True)}


def ceiling_summary(
    met: Sequence[int], checked: Sequence[int], per_check: Mapping[str, Sequence[bool]]
) -> dict[str, Any]:
    """The checks met over the draws (a draw's checks can number fewer than another's: the TTFT
    checks are the rates under 90% of the draw's real saturation rate), the share of draws that
    meet all theirs, and per check the draws that had it and the share of them that met it."""
    a, n = np.asarray(met, dtype=float), np.asarray(checked, dtype=float)
    return {
        "draws": len(a),
        "checked_min": int(n.min()),
        "checked_max": int(n.max()),
        "met_mean": round(float(a.mean()), 2),
        "met_p5": float(np.percentile(a, 5)),
        "met_p50": float(np.percentile(a, 50)),
        "met_p95": float(np.percentile(a, 95)),
        "all_met_share": round(float(np.mean(a == n)), 4),
        "per_check": {
            k: {"draws": len(v), "met_share": round(float(np.mean(v)), 4)}
            for k, v in sorted(per_check.items())
        },
    }


def ceiling_runs(
    config: Mapping[str, Any], results: Path, grid: bool, repetitions: int | None
) -> list[Run]:
    """The runs a ceiling draws: the configured grid's (`repetitions` in place of the config's,
    when given), or else the real loaded runs under `results`."""
    if not grid:
        return loaded_runs(results)
    if repetitions is not None:
        config = {**config, "repetitions": repetitions}
    return sorted((r.arm, r.engine, r.condition, r.rep) for r in grid_runs(config))


def check_outcomes(summary: Mapping[str, Any]) -> dict[str, bool]:
    """Each check of one `compare_runs` summary by name (ENGINE/ARM CONDITION METRIC, and the
    series' saturation): met or not."""
    out = {}
    for s in summary["series"]:
        series = f"{s['engine']}/{s['arm']}"
        for c in s["checks"]:
            out[f"{series} {c['condition']} {c['metric']}"] = bool(c["met"])
        out[f"{series} saturation"] = bool(s["saturation_met"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--run-sd", type=float, default=0.033, help="a run's own level, sd in ln")
    parser.add_argument(
        "--deployment-sd", type=float, default=0.02, help="a deployment's level, sd in ln"
    )
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--grid",
        action="store_true",
        help="draw the configured grid's runs, not the real runs under --results",
    )
    parser.add_argument(
        "--repetitions", type=int, help="with --grid: the grid's repetitions (the config's if not)"
    )
    args = parser.parse_args()
    if args.draws < 1 or args.run_sd < 0 or args.deployment_sd < 0:
        parser.error("--draws must be at least 1, and the sds at least 0")
    if args.repetitions is not None and (not args.grid or args.repetitions < 1):
        parser.error("--repetitions needs --grid and is at least 1")
    config = config_of(args)
    platform = platform_file(args.results)
    costs = read_step_costs(platform)
    runs = ceiling_runs(config, args.results, args.grid, args.repetitions)
    if not runs:
        raise SystemExit(f"no loaded run under {args.results / 'runs'}")
    traces = {
        trace_folder(args.results, condition, rep) / "trace.parquet" for *_, condition, rep in runs
    }
    missing = sorted(str(t) for t in traces if not t.is_file())
    if missing:
        raise SystemExit(
            f"no compiled trace {missing[0]} ({len(missing)} missing): make the traces"
        )
    by_condition = conditions(config)
    keeps_pace = analysis_settings(config)["keeps_pace"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="servelab-ceiling-") as tmp:
        for scale in GRID:
            slowed = {engine: slowed_by(cost, scale) for engine, cost in costs.items()}
            for arm, engine, condition, rep in runs:
                out = Path(tmp) / f"x{scale:.2f}" / arm / engine / condition / rep
                out.mkdir(parents=True)
                name = f"{arm}/{engine}/{condition}/{rep}"
                predict_into(args.results, config, name, platform, out, step_costs=slowed)
        predicted_s = time.perf_counter() - started
        rng = np.random.default_rng(args.seed)
        met: list[int] = []
        checked: list[int] = []
        per_check: dict[str, list[bool]] = {}
        for _ in range(args.draws):
            levels = draw_levels(rng, runs, args.run_sd, args.deployment_sd)
            pairs = [
                run_pair(
                    by_condition,
                    run,
                    Path(tmp) / f"x{nearest_scale(level, GRID):.2f}" / Path(*run),
                    Path(tmp) / "x1.00" / Path(*run),
                )
                for run, level in levels.items()
            ]
            _, summary, _ = compare_runs(pairs, keeps_pace=keeps_pace)
            counted = tally(summary)
            met.append(counted["met"])
            checked.append(counted["checked"])
            for name, ok in check_outcomes(summary).items():
                per_check.setdefault(name, []).append(ok)
    result = ceiling_summary(met, checked, per_check)
    result.update(
        results=str(args.results),
        runs_from="grid" if args.grid else "loaded runs",
        runs=len(runs),
        run_sd=args.run_sd,
        deployment_sd=args.deployment_sd,
        seed=args.seed,
        grid=list(GRID),
        predict_s=round(predicted_s, 1),
        total_s=round(time.perf_counter() - started, 1),
    )
    print(
        f"{args.results}: run sd {args.run_sd}, deployment sd {args.deployment_sd}, "
        f"{result['draws']} draws: {result['met_mean']} of {result['checked_min']}-"
        f"{result['checked_max']} checks met on average (5%-95%: {result['met_p5']:g}-"
        f"{result['met_p95']:g}); all of a draw's met in {100 * result['all_met_share']:.1f}% "
        f"of draws (predictions {result['predict_s']} s, in all {result['total_s']} s)"
    )
    for name, check in result["per_check"].items():
        if check["met_share"] < 1.0:
            print(f"  {name}: met in {100 * check['met_share']:.1f}% of {check['draws']} draws")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
