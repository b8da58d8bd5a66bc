"""Is a repetition's miss its trace's, or its run's? One condition's real runs made again and again,
each against the same prediction (issue 26; docs/simulator.md, "The repeated miss, made again").

    .venv/bin/python benchmarks/sim_vs_real_repeats.py --results results \\
        --run defaults/llamacpp/rate-6.00 --made DIR [DIR ...] [--configfile ...] [--json OUT]
    .venv/bin/python benchmarks/sim_vs_real_repeats.py --results results --run RUN [RUN ...]

Each DIR holds one making of the condition's real runs, as results/runs/ARM/ENGINE/CONDITION does
(rep1/run.json, rep2/run.json, ...): runs made again in a scratch clone. Without `--made`, each
`--run` is compared on the results folder's own runs (one making each), and the pairs of all of
them are summed up at the end, by engine: a measurement's own spread of each later repetition ÷ the
first. Later and first are by name (rep2 ÷ rep1), not by the order the runs were made in.
For each repetition, the predicted engine seconds are the sum of its simulated passes' times on
`--results`' fitted platform (sim_vs_real_pass_features.py's `recorded_passes`: the linear model,
without the after-idle term, which past saturation has no idle to act on). For each making, the
real engine seconds are the engine cores' busy share times the run's window (run.json,
`machine_load`), which counts every thread of the engine's process group on its cores. The
prediction is the same for every making, so the spread of real ÷ predicted over makings of one
repetition is the run's own variation, and a repetition whose trace carries a cost the model
misses stays dear against the others in every making. Every making must have run the trace the
prediction ran (run.json's `trace_sha256` against `--results`' traces/CONDITION/REP/trace.parquet).

A making's folder may also hold probe-before.json and probe-after.json: machine_speed_drift.py's
--json of a few seconds on the engine's core just before and after the making. Their mean
memory-streaming speed is then printed beside the making, and, over three or more probed makings,
its Pearson correlation (scipy) with the making's mean real ÷ predicted: whether a probe of the
machine tells a dear making from a cheap one.

The makings kept in docs (2026-12-05) were made in a scratch clone of main with the workflow as
`make sim-vs-real` runs it, on a config overlay that keeps one condition (or the two the campaign
runs in a row), each making's runs moved aside before the next:

    snakemake --cores 1 results/runs/defaults/llamacpp/rate-6.00/rep1/run.json \\
        --configfile config/cpu-pair.yaml config/sim-vs-real.yaml OVERLAY
    mv results/runs/defaults/llamacpp/rate-6.00 made/N

and, for the probed makings, around the snakemake line (then moved into made/N):

    machine_speed_drift.py --minutes 0.05 --window-s 3 --json probe-before.json
    machine_speed_drift.py --minutes 0.05 --window-s 3 --json probe-after.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_pass_features import recorded_passes
from sim_vs_real_slowdown import add_config_arguments, config_of

from servelab.artifacts import file_sha256


def predicted_seconds(
    results: Path, config: dict[str, Any], arm: str, engine: str, condition: str, rep: str
) -> float:
    """The engine seconds the fitted platform predicts for one repetition's passes."""
    features, cost = recorded_passes(results, config, arm, engine, condition, rep)
    coefficients = list(cost.coefficients().values())
    return float((features @ coefficients).sum())


def real_seconds(run_json: Path) -> tuple[float, str]:
    """(the engine cores' busy seconds over the run's window, the trace's SHA-256) of one run."""
    record = json.loads(run_json.read_text(encoding="utf-8"))
    load = record.get("machine_load")
    if not load or "engine" not in load:
        raise SystemExit(f"{run_json}: no machine_load.engine (not a local-backend run)")
    return float(load["engine"]["busy"]) * float(load["window_s"]), str(record["trace_sha256"])


def spread_of(values: list[float]) -> dict[str, Any]:
    """How many ratios, their mean, median, standard deviation (None for one) and range, and from
    six on the Wilcoxon signed-rank test of their logarithms against 0 (scipy): a small p says
    the later repetition is dearer, or cheaper, than the first more often than chance."""
    out: dict[str, Any] = {
        "n": len(values),
        "mean": round(statistics.fmean(values), 4),
        "median": round(statistics.median(values), 4),
        "sd": round(statistics.stdev(values), 4) if len(values) > 1 else None,
        "min": min(values),
        "max": max(values),
    }
    if len(values) >= 6:
        out["wilcoxon_p"] = float(f"{stats.wilcoxon(np.log(values)).pvalue:.3g}")
    return out


def probe_gbps(folder: Path) -> float | None:
    """The mean memory-streaming speed of a making's probes, GB/s: probe-before.json and
    probe-after.json in its folder (machine_speed_drift.py's --json), or None without both."""
    paths = [folder / "probe-before.json", folder / "probe-after.json"]
    if not all(p.is_file() for p in paths):
        return None
    speeds = [
        json.loads(p.read_text(encoding="utf-8"))["kinds"]["memory GB/s"]["mean"] for p in paths
    ]
    return statistics.fmean(speeds)


def compare(results: Path, config: dict[str, Any], run: str, made: list[Path]) -> dict[str, Any]:
    """One condition's makings `made` against its prediction on `results`' platform, printed."""
    try:
        arm, engine, condition = run.split("/")
    except ValueError:
        raise SystemExit(f"--run {run}: expected ARM/ENGINE/CONDITION") from None
    reps = sorted(p.parent.name for p in made[0].glob("rep*/run.json"))
    if len(reps) < 2:
        raise SystemExit(f"{made[0]}: fewer than two repetitions")
    predicted = {
        rep: predicted_seconds(results, config, arm, engine, condition, rep) for rep in reps
    }
    first, *later = reps
    # the trace each prediction ran, which every making must have run too
    traces = {
        rep: file_sha256(results / "traces" / condition / rep / "trace.parquet") for rep in reps
    }
    makings: list[dict[str, Any]] = []
    print(f"{run}: predicted engine seconds " + ", ".join(f"{r} {predicted[r]:.3f}" for r in reps))
    print(
        "making | "
        + " | ".join(f"{r} real s, ÷ predicted" for r in reps)
        + " | "
        + " | ".join(f"{r} ÷ {first}" for r in later)
    )
    for folder in made:
        ratio: dict[str, float] = {}
        row: dict[str, Any] = {"made": str(folder), "reps": {}}
        for rep in reps:
            run_json = folder / rep / "run.json"
            seconds, trace = real_seconds(run_json)
            if trace != traces[rep]:
                raise SystemExit(
                    f"{run_json}: trace_sha256 {trace} is not the predicted trace's {traces[rep]}"
                )
            ratio[rep] = seconds / predicted[rep]
            row["reps"][rep] = {
                "real_s": round(seconds, 3),
                "real_over_predicted": round(ratio[rep], 4),
            }
        row["over_first_rep"] = {r: round(ratio[r] / ratio[first], 4) for r in later}
        probe = probe_gbps(folder)
        if probe is not None:
            row["probe_memory_gbps"] = round(probe, 3)
        makings.append(row)
        cells = " | ".join(f"{row['reps'][r]['real_s']:.2f}, {ratio[r]:.3f}" for r in reps)
        relative = ", ".join(f"{row['over_first_rep'][r]:.3f}" for r in later)
        print(f"{folder} | {cells} | {relative}")
    summary: dict[str, Any] = {}
    probed = [m for m in makings if "probe_memory_gbps" in m]
    if len(probed) > 2:
        # a slow machine streams slowly and makes the runs dear: a negative correlation
        mean_ratio = [
            statistics.fmean(r["real_over_predicted"] for r in m["reps"].values()) for m in probed
        ]
        speeds = [m["probe_memory_gbps"] for m in probed]
        test = stats.pearsonr(speeds, mean_ratio)
        summary["probe_correlation"] = {
            "makings": len(probed),
            "r": round(float(test.statistic), 3),
            "p": float(f"{test.pvalue:.3g}"),
        }
        print(
            f"probe speed against the making's mean real ÷ predicted: {summary['probe_correlation']}"
        )
    for rep in later:
        summary[f"{rep}_over_{first}"] = spread_of([m["over_first_rep"][rep] for m in makings])
    for rep in reps:
        values = [m["reps"][rep]["real_over_predicted"] for m in makings]
        summary[f"{rep}_real_over_predicted"] = {"min": min(values), "max": max(values)}
    return {
        "run": run,
        "predicted_s": {r: round(s, 3) for r, s in predicted.items()},
        "makings": makings,
        "summary": summary,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument(
        "--run",
        required=True,
        nargs="+",
        help="ARM/ENGINE/CONDITION, e.g. defaults/llamacpp/rate-6.00 (several without --made)",
    )
    parser.add_argument(
        "--made",
        type=Path,
        nargs="+",
        help="folders of one --run's makings (default: --results' own runs of each --run)",
    )
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.made and len(args.run) > 1:
        raise SystemExit("--made takes one --run")
    config = config_of(args)
    compared = []
    for run in args.run:
        made = args.made or [args.results / "runs" / run]
        compared.append(compare(args.results, config, run, made))
    by_engine: dict[str, list[float]] = {}
    for c in compared:
        engine = c["run"].split("/")[1]
        for m in c["makings"]:
            by_engine.setdefault(engine, []).extend(m["over_first_rep"].values())
    spread: dict[str, Any] = {}
    for engine, pairs in sorted(by_engine.items()):
        if len(pairs) > 1:
            spread[engine] = spread_of(pairs)
            print(
                f"{engine}, the later repetitions ÷ the first over {len(pairs)} pairs: {spread[engine]}"
            )
    if args.json:
        out = {"results": str(args.results), "compared": compared, "by_engine": spread}
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
