"""How much does a prediction move with the platform's speed? One run of sim-vs-real predicted on
the fitted CPU platform slowed by several factors (issue 26; docs/simulator.md, "Against the real
engines").

    .venv/bin/python benchmarks/sim_vs_real_slowdown.py --results results \\
        --run defaults/vllm_v1/rate-3.00/rep1 [RUN ...] [--scale 0.9 1.0 1.1 1.2 1.3] \\
        [--passes PASSES_JSON] [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml] \\
        [--json OUT]

Near an engine's capacity a run's batching depends on its step time: slower steps let more
requests queue, so each step takes more of them, and there are fewer. This predicts the run with
`servelab.sim.cpu_fit.predict_run` on `prediction_settings`, as the `predict_run` rule does
(from the same config files), on the results folder's `sim_vs_real/platform.json` with
each engine's linear step-cost coefficients multiplied by each `--scale` (`slowed_by`: every
pass, and V1's front end, takes that factor longer; the after-idle term's constants stay the
platform's). It prints each prediction's engine steps (`sim.iterations` of its run.json: the
count benchmarks/sim_vs_real_passes.py sets beside the real engine's own), TTFT p50 and p95 and
X (requests over the window from the first send to the last token), under the real run's, and the
slowdown whose prediction has the real run's X (linear interpolation between the scales; none
where the real X lies outside the predicted range), the one with its TTFT p50 and, with
`--passes` (benchmarks/sim_vs_real_passes.py's JSON), the one with the engine's own step
count. The predictions go to a temporary folder; nothing under `--results` is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from servelab.grid.config import load_config
from servelab.sim.cpu_fit import predict_run, prediction_settings, read_step_costs
from servelab.sim.cpu_platform import StepCost


def summary(requests_path: Path) -> dict[str, float]:
    """TTFT p50 and p95 (s) and X of a run's ok trace requests."""
    rows = [
        r
        for r in pq.read_table(requests_path).to_pylist()
        if not r["warmup"] and r["status"] == "ok"
    ]
    ttft = []
    for r in rows:
        first = next(i for i, n in enumerate(r["chunk_tokens"]) if n > 0)
        ttft.append(r["chunk_times_s"][first] - r["sent_s"])
    window = max(r["chunk_times_s"][-1] for r in rows) - min(r["sent_s"] for r in rows)
    return {
        "requests": len(rows),
        "ttft_p50_s": round(float(np.median(ttft)), 4),
        "ttft_p95_s": round(float(np.percentile(ttft, 95)), 4),
        "x_rps": round(len(rows) / window, 3),
    }


def matching_slowdown(real: float, rows: list[dict[str, Any]], key: str) -> float | None:
    """The slowdown whose prediction has the real run's `key` (steps, ttft_p50_s, x_rps): linear
    interpolation between the scales, None where the real value lies outside the predicted
    range."""
    scales = np.array([r["scale"] for r in rows])
    values = np.array([r[key] for r in rows], dtype=float)
    order = np.argsort(values)
    if not values.min() <= real <= values.max():
        return None
    return round(float(np.interp(real, values[order], scales[order])), 3)


def x_matching_slowdown(real_x: float, rows: list[dict[str, Any]]) -> float | None:
    return matching_slowdown(real_x, rows, "x_rps")


SIM_VS_REAL_CONFIGFILES = ["config/cpu-pair.yaml", "config/sim-vs-real.yaml"]


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config` and `--configfile`, as `make sim-vs-real` passes them (a benchmark that predicts
    or replays runs reads the workflow's configuration the same way)."""
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--configfile", nargs="+", default=SIM_VS_REAL_CONFIGFILES)


def config_of(args: argparse.Namespace) -> dict[str, Any]:
    """The configuration `add_config_arguments`' arguments name."""
    return load_config(args.config, args.configfile)


def platform_file(results: Path, given: Path | None = None) -> Path:
    """`given`, or the results folder's fitted CPU platform (the `cpu_platform` rule's
    results/sim_vs_real/platform.json); exits naming the file when there is none."""
    platform = given or results / "sim_vs_real" / "platform.json"
    if not platform.is_file():
        raise SystemExit(f"no platform file {platform}: run the comparison first, or name one")
    return platform


def trace_folder(results: Path, condition: str, rep: str) -> Path:
    """The compiled trace of CONDITION/REP under `results` (the `compile_trace` rule's folder:
    trace.parquet and manifest.json)."""
    return results / "traces" / condition / rep


def predict_into(
    results: Path,
    config: dict[str, Any],
    run: str,
    platform_path: Path,
    out: Path,
    step_costs: Mapping[str, Any] | None = None,
) -> None:
    """The loaded run ARM/ENGINE/CONDITION/REP of `results` predicted on `platform_path`, as the
    workflow's `predict_run` rule does (its settings from `config`), into `out`'s requests.parquet,
    scrape.parquet and run.json; `step_costs`: what times the passes instead (`predict_run`)."""
    arm, engine, condition, rep = run.split("/")
    trace_dir = trace_folder(results, condition, rep)
    predict_run(
        prediction_settings(config, arm=arm, engine=engine, condition=condition),
        platform_path=platform_path,
        trace_path=trace_dir / "trace.parquet",
        manifest_path=trace_dir / "manifest.json",
        arm=arm,
        engine=engine,
        condition=condition,
        rep=rep,
        requests_path=out / "requests.parquet",
        scrape_path=out / "scrape.parquet",
        run_json_path=out / "run.json",
        step_costs=step_costs,
    )


def slowed_by(cost: StepCost, scale: float) -> StepCost:
    """`cost` with every linear coefficient times `scale` (a pass takes that factor longer; the
    after-idle term's constants stay). Not `StepCost.with_slowdown`: the engine model sets that
    from the run's own platform (`servelab.sim.run.build_engine`)."""
    return dataclasses.replace(cost, **{k: v * scale for k, v in cost.coefficients().items()})


def predict_scaled(
    run: str,
    results: Path,
    config: dict[str, Any],
    scales: list[float],
    engine_steps: int | None = None,
) -> dict[str, Any]:
    """The real run's summary and its prediction at each slowdown; with `engine_steps` (the real
    engine's own count of its passes) also the slowdown that gives it."""
    platform = platform_file(results)
    costs = read_step_costs(platform)
    real = summary(results / "runs" / run / "requests.parquet")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="servelab-slowdown-") as tmp:
        for scale in scales:
            out = Path(tmp) / f"x{scale}"
            out.mkdir()
            slowed = {engine: slowed_by(cost, scale) for engine, cost in costs.items()}
            predict_into(results, config, run, platform, out, step_costs=slowed)
            record = json.loads((out / "run.json").read_text(encoding="utf-8"))
            rows.append({"scale": scale, "steps": record["sim"]["iterations"]})
            rows[-1].update(summary(out / "requests.parquet"))
    return {
        "run": run,
        "real": real,
        "predicted": rows,
        "x_matching_slowdown": x_matching_slowdown(real["x_rps"], rows),
        "ttft_p50_matching_slowdown": matching_slowdown(real["ttft_p50_s"], rows, "ttft_p50_s"),
        "engine_steps": engine_steps,
        "steps_matching_slowdown": (
            matching_slowdown(engine_steps, rows, "steps") if engine_steps is not None else None
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--run", nargs="+", required=True, help="ARM/ENGINE/CONDITION/REP ...")
    parser.add_argument("--scale", type=float, nargs="+", default=[0.9, 1.0, 1.1, 1.2, 1.3])
    parser.add_argument(
        "--passes",
        type=Path,
        help="benchmarks/sim_vs_real_passes.py's JSON of the same results: the engine's own steps",
    )
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = config_of(args)
    engine_steps = (
        {r["run_id"]: int(r["real_passes"]) for r in json.loads(args.passes.read_text("utf-8"))}
        if args.passes
        else {}
    )
    runs = []
    for run in args.run:
        result = predict_scaled(run, args.results, config, args.scale, engine_steps.get(run))
        runs.append(result)
        print(f"{run}\n  real     {result['real']}")
        for row in result["predicted"]:
            print(f"  x{row['scale']:<6} {row}")
        print(
            f"  the slowdown with the real X: {result['x_matching_slowdown']}; "
            f"TTFT p50: {result['ttft_p50_matching_slowdown']}; "
            f"the engine's steps ({result['engine_steps']}): {result['steps_matching_slowdown']}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
