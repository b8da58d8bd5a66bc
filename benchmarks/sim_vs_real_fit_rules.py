"""Which floor rows make the best CPU platform? One sim-vs-real measurement scored under several
rules of the fit (issue 26; docs/simulator.md, "Against the real engines").

    .venv/bin/python benchmarks/sim_vs_real_fit_rules.py --results results \\
        [--variant gaps] [--variant gaps_and_ttft] [--variant none] \\
        [--variant vllm_v1=gaps,llamacpp=none] [--without per_mask_cell_s per_mask_check_s] \\
        [--fixed llamacpp.per_wakeup_s=5e-6] [--without-floor floor-s0.00-L512-x2] \\
        [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml] [--json OUT] [--keep KEEP]

A variant names the warm-up rows of the fit (`servelab.sim.cpu_fit.WarmupRows`), for every
engine or per engine: `gaps` is the workflow's rule, `gaps_and_ttft` the rule before it, `none`
a floor without its warm-up batch. For each variant this fits every engine from the results
folder's floor runs (as the `cpu_platform` rule does: `floor_runs` of
benchmarks/cpu_fit_stability.py, both arms pooled), predicts every loaded real run under
`--results` on it (benchmarks/sim_vs_real_slowdown.py's `predict_into`, as the `predict_run` rule
does) and compares them with the analysis's own reduction
(`servelab.analysis.sim_vs_real.compare_runs`). It prints the goal checks met per engine and arm
and the saturation ratios, and writes every variant's coefficients, fit errors and checks to
`--json`. The `gaps` variant is the workflow's prediction: where `--results` holds a
sim_vs_real.json, the script says whether its own summary is the same, judged with the
workflow's bracket. The test is exact. Before 2026-12-07 (the twenty-second measurement) the
script took the floor runs in path order and the workflow in run order, and the fit's
coefficients moved with that order by about 1e-6 of themselves, which could move a ratio's
fourth decimal (the twentieth: one ratio, 0.8664 against 0.8663); `fit_step_cost` now sorts
them, so a results folder made since says True. `--without` holds the
named coefficients at 0 in every variant: the step model without those terms (with the mask
terms named, the model before 2026-12-05). `--fixed ENGINE.COEFFICIENT=VALUE` holds one engine's
coefficient at a value measured elsewhere (a benchmark's) and fits the rest to what it leaves: on
a floor that cannot measure a term, what the term would have done. `--without-floor FLOOR_ID`
leaves that floor shape's runs out of every fit: the same day's floor without it (the pairs of
config `floor.shapes[].together`, say), which tells what the shape changes from the day's level.
Every check's ratio goes to `--json` (`ratios`), the misses also to `missed`. Everything it predicts goes to
a temporary folder (with `--keep KEEP`, to KEEP/VARIANT, for the other benchmarks to read);
nothing under `--results` is written.

The variants are a comparison of calibration rules on a measurement that has been seen: a rule
chosen by this score is fitted to the loaded runs, and must be checked on a measurement made
after the choice.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import floor_runs
from sim_vs_real_slowdown import add_config_arguments, config_of, predict_into

from servelab.analysis.sim_vs_real import RunPair, compare_runs
from servelab.grid.config import Condition, analysis_settings, conditions
from servelab.sim.cpu_fit import WARMUP_ROWS, FloorRun, WarmupRows, fit_step_cost, read_step_costs
from servelab.sim.cpu_platform import StepCost


def parse_variant(text: str, engines: list[str]) -> dict[str, WarmupRows]:
    """`RULE` for every engine, or `ENGINE=RULE,ENGINE=RULE` naming each."""
    if "=" not in text:
        rules = dict.fromkeys(engines, text)
    else:
        rules = dict(part.split("=", 1) for part in text.split(","))
        if sorted(rules) != sorted(engines):
            raise SystemExit(f"--variant {text}: name every engine of the floor, {engines}")
    for engine, rule in rules.items():
        if rule not in WARMUP_ROWS:
            raise SystemExit(f"--variant {text}: {engine}'s {rule!r} is not one of {WARMUP_ROWS}")
    return {engine: cast(WarmupRows, rule) for engine, rule in rules.items()}


def fit_platform(
    runs: list[FloorRun],
    rules: dict[str, WarmupRows],
    config: dict[str, Any],
    without: tuple[str, ...] = (),
    fixed: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """The platform file's form (`write_cpu_platform`), each engine fitted on its rule, with the
    workflow's GPU memory and model preset (the `cpu_platform` rule's params), `without` those
    coefficients and with an engine's `fixed` ones held at their values."""
    gpu_memory_mib, model_preset = int(config["gpu"]["memory_mib"]), config["model"]["preset"]
    engines: dict[str, Any] = {}
    for engine, rule in sorted(rules.items()):
        cost, report = fit_step_cost(
            engine,
            runs,
            gpu_memory_mib=gpu_memory_mib,
            model_preset=model_preset,
            warmup_rows=rule,
            without=without,
            fixed=(fixed or {}).get(engine),
        )
        engines[engine] = {"step_cost": cost.coefficients() | cost.after_idle(), "fit": report}
    return {"model_preset": model_preset, "engines": engines}


def parse_fixed(texts: list[str], engines: list[str]) -> dict[str, dict[str, float]]:
    """`ENGINE.COEFFICIENT=VALUE` arguments: engine -> coefficient -> value."""
    fixed: dict[str, dict[str, float]] = {}
    for text in texts:
        name, _, value = text.partition("=")
        engine, _, coefficient = name.partition(".")
        if engine not in engines or not coefficient or not value:
            raise SystemExit(
                f"--fixed {text}: expected ENGINE.COEFFICIENT=VALUE, ENGINE of {engines}"
            )
        try:
            fixed.setdefault(engine, {})[coefficient] = float(value)
        except ValueError:
            raise SystemExit(f"--fixed {text}: {value!r} is not a number") from None
    return fixed


def without_floors(runs: list[FloorRun], floor_ids: list[str]) -> list[FloorRun]:
    """`runs` less those of the floor shapes `floor_ids` (each must have runs: a misspelt id
    would leave the fit as it was, silently)."""
    shapes = {r.trace_dir.parent.name for r in runs}
    unknown = sorted(set(floor_ids) - shapes)
    if unknown:
        raise SystemExit(
            f"--without-floor {' '.join(unknown)}: no floor run of that shape "
            f"(the floor has {', '.join(sorted(shapes))})"
        )
    return [r for r in runs if r.trace_dir.parent.name not in floor_ids]


def step_costs_in(path: Path) -> dict[str, StepCost]:
    """The step costs of a CPU platform file (`write_cpu_platform`), or of this script's `--json`
    (its `gaps` variant's fit), for a benchmark that prices passes on either."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if "variants" not in data:
        return read_step_costs(path)
    fitted = data["variants"]["gaps"]["coefficients"]
    return {
        engine: StepCost.from_mapping(engine, values, f"{path}: variants.gaps.coefficients")
        for engine, values in fitted.items()
    }


def loaded_runs(results: Path) -> list[tuple[str, str, str, str]]:
    """(arm, engine, condition, rep) of every real loaded run under results/runs."""
    return [
        (p.parts[-5], p.parts[-4], p.parts[-3], p.parts[-2])
        for p in sorted((results / "runs").glob("*/*/*/rep*/run.json"))
    ]


def run_pair(
    by_condition: Mapping[str, Condition],
    run: tuple[str, str, str, str],
    real_dir: Path,
    predicted_dir: Path,
) -> RunPair:
    """The comparison's pair of one loaded run (ARM, ENGINE, CONDITION, REP): its condition's rate
    and window from config (`conditions`), the two sides' folders."""
    arm, engine, condition, rep = run
    return RunPair(
        engine=engine,
        arm=arm,
        condition=condition,
        rep=rep,
        rate=float(by_condition[condition].rate),
        duration_s=float(by_condition[condition].duration_s),
        real_dir=real_dir,
        predicted_dir=predicted_dir,
    )


def score(
    platform: dict[str, Any], results: Path, config: dict[str, Any], tmp: Path
) -> dict[str, Any]:
    """Every loaded run predicted on `platform` and compared with its real run: the summary of
    `compare_runs` (its `series`, each with its checks and saturation), with the workflow's
    bracket (results/sim_vs_real/floor_drift.json) where there is one."""
    platform_path = tmp / "platform.json"
    platform_path.write_text(json.dumps(platform), encoding="utf-8")
    by_condition = conditions(config)
    pairs = []
    for arm, engine, condition, rep in loaded_runs(results):
        out = tmp / "predicted" / arm / engine / condition / rep
        out.mkdir(parents=True)
        predict_into(results, config, f"{arm}/{engine}/{condition}/{rep}", platform_path, out)
        real = results / "runs" / arm / engine / condition / rep
        pairs.append(run_pair(by_condition, (arm, engine, condition, rep), real, out))
    # the workflow's bracket, where it made one: each variant judged as the workflow's prediction
    drift_path = results / "sim_vs_real" / "floor_drift.json"
    drift = json.loads(drift_path.read_text(encoding="utf-8")) if drift_path.is_file() else None
    _, summary, _ = compare_runs(
        pairs, keeps_pace=analysis_settings(config)["keeps_pace"], floor_drift=drift
    )
    return cast(dict[str, Any], summary)


def tally(summary: dict[str, Any]) -> dict[str, Any]:
    """Checks met per engine and arm (the saturation check included), in all, and the misses."""
    series = {}
    for s in summary["series"]:
        series[f"{s['engine']}/{s['arm']}"] = {
            "met": s["met"] + s["saturation_met"],
            "checked": s["checked"] + 1,
            "saturation_ratio": s["saturation_ratio"],
            "ratios": {f"{c['condition']} {c['metric']}": c["ratio"] for c in s["checks"]},
            "missed": [
                f"{c['condition']} {c['metric']} {c['ratio']}" for c in s["checks"] if not c["met"]
            ]
            + ([] if s["saturation_met"] else [f"saturation {s['saturation_ratio']}"]),
        }
    return {
        "met": sum(s["met"] for s in series.values()),
        "checked": sum(s["checked"] for s in series.values()),
        "series": series,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument(
        "--variant",
        action="append",
        help="RULE or ENGINE=RULE,ENGINE=RULE (default: each rule for every engine)",
    )
    parser.add_argument(
        "--without", nargs="+", default=[], help="coefficients held at 0 in every variant"
    )
    parser.add_argument(
        "--fixed",
        nargs="+",
        default=[],
        help="ENGINE.COEFFICIENT=VALUE held at VALUE in every variant (the rest fitted)",
    )
    parser.add_argument(
        "--without-floor",
        nargs="+",
        default=[],
        metavar="FLOOR_ID",
        help="floor shapes (floor-s0.00-L512-x2) whose runs are left out of every fit",
    )
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep each variant's platform.json and predicted runs in KEEP/VARIANT (a new folder)",
    )
    args = parser.parse_args()
    config = config_of(args)
    runs = without_floors(floor_runs(args.results), args.without_floor)
    engines = sorted({r.engine for r in runs})
    if not engines or not loaded_runs(args.results):
        raise SystemExit(f"{args.results}: no ok floor run or no loaded run to score")
    workflow = args.results / "sim_vs_real.json"
    without = tuple(args.without)
    fixed = parse_fixed(args.fixed, engines)
    out: dict[str, Any] = {
        "results": str(args.results),
        "without": list(without),
        "fixed": fixed,
        "without_floor": list(args.without_floor),
        "variants": {},
    }
    for text in args.variant or list(WARMUP_ROWS):
        started = time.perf_counter()
        rules = parse_variant(text, engines)
        platform = fit_platform(runs, rules, config, without, fixed)
        if args.keep is not None:
            kept = args.keep / text
            if kept.exists():
                parser.error(f"--keep {args.keep}: {kept} exists (nothing is overwritten)")
            kept.mkdir(parents=True)
            summary = score(platform, args.results, config, kept)
        else:
            with tempfile.TemporaryDirectory(prefix="servelab-fit-rules-") as tmp:
                summary = score(platform, args.results, config, Path(tmp))
        result = tally(summary)
        result["rules"] = rules
        result["coefficients"] = {e: v["step_cost"] for e, v in platform["engines"].items()}
        result["fit"] = {
            e: {k: v["fit"][k] for k in ("ttft", "itl") if k in v["fit"]}
            for e, v in platform["engines"].items()
        }
        if text == "gaps" and workflow.exists():
            same = json.loads(workflow.read_text(encoding="utf-8"))["series"] == summary["series"]
            result["same_as_workflow_summary"] = same
        out["variants"][text] = result
        print(f"{text}: {result['met']} of {result['checked']} checks met")
        for name, s in result["series"].items():
            print(
                f"  {name:20} {s['met']:>2} of {s['checked']}, saturation {s['saturation_ratio']}"
            )
        if "same_as_workflow_summary" in result:
            print(f"  the same as {workflow}: {result['same_as_workflow_summary']}")
        print(f"  ({time.perf_counter() - started:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
