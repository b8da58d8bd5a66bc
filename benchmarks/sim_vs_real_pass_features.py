"""What are one condition's simulated passes made of, repetition by repetition? (issue 26;
docs/simulator.md, "A fourteenth measurement").

    .venv/bin/python benchmarks/sim_vs_real_pass_features.py --results results \\
        --run defaults/llamacpp/rate-6.00 [--configfile ...] [--json OUT]

The step model prices a pass as a sum of its features (servelab.sim.cpu_platform, FEATURES) times
the fitted coefficients. When one repetition of a condition runs dearer against its prediction
than another, a mispriced coefficient can explain it only if that repetition's passes carry more
of the mispriced feature. This predicts each repetition of `--run` on the results folder's fitted
platform, as the `predict_run` rule does (sim_vs_real_slowdown.py's `predict_into`), with a recorder
in the cost model's place (`servelab.sim.cpu_platform.FeatureRecorder`, timed by the fitted
linear model: the after-idle term, which has state, is left out, so the schedule can differ a
little from the workflow's). It prints, per repetition, each feature's mean a pass and its share
of the predicted time, and the ratio of the repetitions' means a pass. Only the traces, the
platform file and the config are read.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_slowdown import add_config_arguments, config_of, predict_into

from servelab.sim.cpu_fit import read_step_costs
from servelab.sim.cpu_platform import FEATURES, FeatureRecorder, StepCost


def recorded_passes(
    results: Path, config: dict[str, Any], arm: str, engine: str, condition: str, rep: str
) -> tuple[np.ndarray, StepCost]:
    """Every simulated pass's features (passes × FEATURES) of one loaded run, and the cost."""
    platform_path = results / "sim_vs_real" / "platform.json"
    cost = read_step_costs(platform_path)[engine]
    recorder = FeatureRecorder(timing=cost)
    with tempfile.TemporaryDirectory(prefix="servelab-features-") as tmp:
        run = f"{arm}/{engine}/{condition}/{rep}"
        predict_into(results, config, run, platform_path, Path(tmp), {engine: recorder})
    return np.stack(recorder.calls), cost


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument(
        "--run", required=True, help="ARM/ENGINE/CONDITION, e.g. defaults/llamacpp/rate-6.00"
    )
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    try:
        arm, engine, condition = args.run.split("/")
    except ValueError:
        raise SystemExit(f"--run {args.run}: expected ARM/ENGINE/CONDITION") from None
    config = config_of(args)
    reps = sorted(p.name for p in (args.results / "traces" / condition).glob("rep*"))
    if not reps:
        raise SystemExit(f"{args.results}/traces/{condition}: no repetition")
    means: dict[str, np.ndarray] = {}
    out: dict[str, Any] = {"results": str(args.results), "run": args.run, "reps": {}}
    for rep in reps:
        features, cost = recorded_passes(args.results, config, arm, engine, condition, rep)
        coefficients = np.array(list(cost.coefficients().values()))
        seconds = features * coefficients  # each feature's time, pass by pass
        means[rep] = features.mean(axis=0)
        share = seconds.sum(axis=0) / seconds.sum()
        out["reps"][rep] = {
            "passes": len(features),
            "predicted_s": round(float(seconds.sum()), 3),
            "per_pass": {f: round(float(m), 2) for f, m in zip(FEATURES, means[rep], strict=True)},
            "time_share": {f: round(float(s), 4) for f, s in zip(FEATURES, share, strict=True)},
        }
        print(f"{rep}: {len(features)} passes, {seconds.sum():.2f} s predicted")
        for name, mean, part in zip(FEATURES, means[rep], share, strict=True):
            print(f"  {name:12} {mean:12.1f} a pass, {part:6.3f} of the time")
    if len(reps) > 1:
        first, *rest = reps
        for rep in rest:
            ratio = {
                f: round(float(b / a), 3) if a > 0 else None
                for f, a, b in zip(FEATURES, means[first], means[rep], strict=True)
            }
            out[f"{rep}_over_{first}_per_pass"] = ratio
            print(f"{rep} ÷ {first}, a pass: {ratio}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
