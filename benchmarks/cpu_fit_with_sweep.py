"""The CPU platform's fit with a measured batch added: the floor plus a parallel-sampling sweep
(issue 26; docs/simulator.md, "The batch cost, measured").

    .venv/bin/python benchmarks/cpu_fit_with_sweep.py --results results \\
        --sweep llamacpp=docs/benchmarks/data/parallel_sampling-llamacpp-128-2026-12-04.json \\
        [--sweep ENGINE=FILE ...] [--out platform.json]

The floor's single requests decode one sequence a pass, so the fit prices a further sequence in a
pass only through the warm-ups' pair and prefill chunks (`servelab.sim.cpu_fit`).
`benchmarks/parallel_sampling.py` measures it directly: one request with `n` = k decodes k
sequences in the same passes. This fits each engine as the `cpu_platform` rule does (its floor
runs under `--results`, both arms pooled, the same refits), with one more equation per row of
each `--sweep` file of that engine: the row's median pass time against the features of a decode
pass of k sequences at the sweep's mean context. The features come from the engine's own
simulated scheduler: k requests of the sweep's prompt length are replayed together through it
with a recorder in place of the cost model, and the passes in which all k decode give them. Each
sweep equation is weighted like a floor equation (1 / observed).

It prints the coefficients and the fit's errors beside the floor-only fit, and writes the
platform file (`results/sim_vs_real/platform.json`'s form) to `--out`: put in a scratch clone's
results/, it makes `snakemake ... results/sim_vs_real.csv` predict every loaded run again on it
(docs/benchmarks/sim-vs-real.md, "The batch cost, measured").

Which sweep measures the loaded runs' batch is the engine's: llama-server's `n` sequences are
greedy, as servelab's requests are; vLLM refuses `n` > 1 when greedy, so its sweep samples at
temperature 1, which costs a sequence more than a greedy one (`parallel_sampling.py --mode
burst` measures the greedy batch). The script fits whatever it is given and says which rows were
sampled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import GPU_MEMORY_MIB, MODEL_PRESET, floor_runs

from servelab.sim.cpu_fit import Equation, FloorRun, fit_step_cost, floor_noise
from servelab.sim.cpu_platform import COEFFICIENTS, FEATURES, FeatureRecorder, StepCost
from servelab.sim.run import build_engine


def decode_features(run: FloorRun, k: int, prompt_tokens: int, output_tokens: int) -> np.ndarray:
    """The median features of the passes in which all k of k requests sent together decode, on
    the engine's simulated scheduler with `run`'s flags."""
    recorder = FeatureRecorder()
    sim = build_engine(
        engine=run.engine,
        flags=list(run.flags),
        gpu_name="CPU",
        gpu_memory_mib=GPU_MEMORY_MIB,
        model_preset_name=MODEL_PRESET,
        step_costs={run.engine: recorder},
    )
    model = sim.model
    for i in range(k):
        ids = (5000 + 104_729 * (i + 1) + np.arange(prompt_tokens, dtype=np.int64)) % 120_000
        model.add_request(f"s{i}", ids.astype(np.int64), output_tokens, 0.0)
    now, passes = 0.0, []
    for _ in range(10_000):  # bounded: k requests of output_tokens each
        if not model.has_work():
            break
        mark = len(recorder.calls)
        step = model.step(now)
        now = step.end_s
        features = sum(recorder.calls[mark:], np.zeros(len(FEATURES)))
        if len(step.emitted) == k and features[1] == k:  # k tokens computed, k emitted
            passes.append(features)
    if not passes:
        raise ValueError(f"{run.engine}: no pass of {k} decoding sequences in the replay")
    return np.median(np.stack(passes), axis=0)


def sweep_equations(engine: str, path: Path, run: FloorRun) -> tuple[list[Equation], bool]:
    """One equation per row of a parallel_sampling.py JSON, and whether its batches were greedy."""
    data = json.loads(path.read_text(encoding="utf-8"))
    greedy = bool(data.get("greedy_batches", engine == "llamacpp"))
    prompt, output = int(data["prompt_tokens"]), int(data["output_tokens"])
    equations = [
        (decode_features(run, int(row["k"]), prompt, output), row["pass_p50_ms"] / 1e3, "sweep")
        for row in data["rows"]
    ]
    return equations, greedy


def fit(engine: str, runs: list[FloorRun], sweeps: list[Path]) -> tuple[StepCost, dict[str, Any]]:
    """The `cpu_platform` rule's fit (servelab.sim.cpu_fit.fit_step_cost, its refits included)
    with each sweep's equations added."""
    reference = next(r for r in runs if r.arm == "defaults")
    extra: list[Equation] = []
    sampled = []
    for path in sweeps:
        equations, greedy = sweep_equations(engine, path, reference)
        extra += equations
        if not greedy:
            sampled.append(path.name)
    cost, report = fit_step_cost(
        engine, runs, gpu_memory_mib=GPU_MEMORY_MIB, model_preset=MODEL_PRESET, extra=extra
    )
    report["sweeps"] = [str(p) for p in sweeps]
    report["sampled_sweeps"] = sampled
    return cost, report


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--sweep", action="append", default=[], help="ENGINE=FILE (repeatable)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sweeps: dict[str, list[Path]] = {}
    for item in args.sweep:
        engine, _, path = item.partition("=")
        if not path:
            parser.error(f"--sweep {item!r}: expected ENGINE=FILE")
        sweeps.setdefault(engine, []).append(Path(path))
    runs = floor_runs(args.results)
    engines: dict[str, Any] = {}
    print("engine    fit          " + "  ".join(f"{c:>15s}" for c in COEFFICIENTS) + "  errors")
    for engine in sorted({r.engine for r in runs}):
        mine = [r for r in runs if r.engine == engine]
        for label, given in (("floor only", []), ("with sweep", sweeps.get(engine, []))):
            if label == "with sweep" and not given:
                continue
            cost, report = fit(engine, mine, given)
            errors = {
                k: report[k]["median_abs_rel_error"]
                for k in ("ttft", "itl", "sweep")
                if k in report
            }
            print(
                f"{engine:9s} {label:12s} "
                + "  ".join(f"{v * 1e3:12.4f} ms" for v in cost.coefficients().values())
                + f"  {errors}"
                + (f"  sampled: {report['sampled_sweeps']}" if report["sampled_sweeps"] else "")
            )
        engines[engine] = {
            "step_cost": cost.coefficients(),
            "fit": report,
            "noise": floor_noise(mine),
        }
    if args.out is not None:
        record = {"model_preset": MODEL_PRESET, "engines": engines, "skipped_runs": []}
        args.out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
