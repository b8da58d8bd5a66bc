"""The light-load TTFT miss with the arrivals held fixed (issue 26; docs/simulator.md, "The
light-load TTFT with the real arrivals").

    .venv/bin/python benchmarks/sim_vs_real_replay.py --results results [--max-rate 2] \\
        [--platform PLATFORM.json] [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml] \\
        [--json OUT]

A loaded run's trace is a set of agent graphs: a graph's planner arrives on the seeded schedule,
its workers when the planner has finished and their tool calls have returned, its aggregator when
every worker has. So a prediction sends most requests at times of its own making, and two
requests that met on the real engine may not meet in the prediction, or the other way round. The
light-load TTFT, predicted low on every measurement pooled ("The model's error across
measurements"), could come from that feedback rather than from the price of the work.

This predicts every loaded run of `--results` at rates up to `--max-rate` graphs/s a second time,
with each request a root sent at the real run's own time after the trace's start (its real
`sent_s` less the run's `trace_start_s`; a request the real run never sent is left out), on the
results folder's own fitted platform, or on `--platform` (another fit of the same floor:
`sim_vs_real_fit_rules.py --keep`; the "workflow" columns stay the workflow's). It prints, per engine, arm and condition:
- TTFT p50 and p95, predicted ÷ real, by the workflow's own reduction (`compare_runs`: the mean
  over the repetitions of each run's percentile), for the workflow's own prediction and for the
  replay;
- on the replay, where both sides send every request at one time, the median of each request's
  own predicted ÷ real TTFT, for the requests that met no other on the real run
  (`sim_vs_real_lone.lone`: nothing in flight when sent, nothing sent before its first token)
  and for the rest.

If the replay's ratios match the workflow's, the miss is in what the passes cost, not in when the
requests arrive. Nothing under `--results` is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_fit_rules import loaded_runs, run_pair
from sim_vs_real_lone import lone, requests
from sim_vs_real_slowdown import add_config_arguments, config_of, platform_file, predict_into

import servelab.sim.run as sim_run
from servelab.analysis.sim_vs_real import RunPair, compare_runs
from servelab.grid.config import analysis_settings, conditions
from servelab.workload.loader import LoadedTrace


def real_arrivals(run_dir: Path) -> dict[str, float]:
    """Each trace request's send time after the trace's start, on the real run in `run_dir`; the
    warm-ups and the requests never sent are left out."""
    record = json.loads((run_dir / "run.json").read_text())
    start = float(record["trace_start_s"])
    t = pq.read_table(run_dir / "requests.parquet", columns=["request_id", "warmup", "sent_s"])
    return {
        rid: max(0.0, sent - start)
        for rid, warmup, sent in zip(
            t["request_id"].to_pylist(),
            t["warmup"].to_pylist(),
            t["sent_s"].to_pylist(),
            strict=True,
        )
        if not warmup and sent is not None
    }


def replayed(trace: LoadedTrace, arrivals: Mapping[str, float]) -> LoadedTrace:
    """`trace` with every request in `arrivals` a root sent at its time there (no dependency, no
    tool delay), in the trace's order; the others are left out."""
    return dataclasses.replace(
        trace,
        requests=tuple(
            dataclasses.replace(
                r, arrival_s=float(arrivals[r.request_id]), depends_on=(), tool_delay_s=0.0
            )
            for r in trace.requests
            if r.request_id in arrivals
        ),
    )


@contextmanager
def sent_as(arrivals: Mapping[str, float]) -> Iterator[None]:
    """Within it, a simulated run loads its trace as `replayed` with `arrivals`."""
    load = sim_run.load_trace

    def load_replayed(trace_path: Any, manifest_path: Any) -> LoadedTrace:
        return replayed(load(trace_path, manifest_path), arrivals)

    with mock.patch.object(sim_run, "load_trace", load_replayed):
        yield


def per_request_ratios(real_dir: Path, predicted_dir: Path) -> dict[str, list[float]]:
    """Each request's predicted ÷ real TTFT, split into the requests that met no other on the real
    run (`sim_vs_real_lone.lone`: none in flight when sent, none sent before its first token) and
    the rest."""
    measured = requests(real_dir / "requests.parquet")
    guess = requests(predicted_dir / "requests.parquet")
    guessed = dict(zip(guess["id"], guess["ttft"], strict=True))
    alone = {rid for rid, _ttft, _idle in lone(measured)}
    out: dict[str, list[float]] = {"lone": [], "met": []}
    for rid, warmup, ttft in zip(measured["id"], measured["warmup"], measured["ttft"], strict=True):
        if not warmup and ttft > 0 and np.isfinite(guessed.get(rid, np.nan)):
            out["lone" if rid in alone else "met"].append(float(guessed[rid] / ttft))
    return out


def _fmt(value: float | None) -> str:
    return "  -  " if value is None else f"{value:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--max-rate", type=float, default=2.0, help="graphs/s (default 2)")
    parser.add_argument(
        "--platform", type=Path, help="the platform file the replay predicts on (default: the fit)"
    )
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = config_of(args)
    platform = platform_file(args.results, args.platform)
    by_condition = conditions(config)
    runs = [
        run
        for run in loaded_runs(args.results)
        if run[2] in by_condition and float(by_condition[run[2]].rate) <= args.max_rate
    ]
    if not runs:
        raise SystemExit(f"{args.results}: no loaded run at rates up to {args.max_rate} graphs/s")
    by_side: dict[str, list[RunPair]] = {"workflow": [], "replay": []}
    split: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    keeps_pace = analysis_settings(config)["keeps_pace"]
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            arm, engine, condition, _rep = run
            name = "/".join(run)
            real_dir = args.results / "runs" / name
            replay_dir = Path(tmp) / name
            replay_dir.mkdir(parents=True)
            with sent_as(real_arrivals(real_dir)):
                predict_into(args.results, config, name, platform, replay_dir)
            workflow_dir = args.results / "sim_vs_real" / "predicted" / name
            by_side["workflow"].append(run_pair(by_condition, run, real_dir, workflow_dir))
            by_side["replay"].append(run_pair(by_condition, run, real_dir, replay_dir))
            kinds = split.setdefault((engine, arm, condition), {"lone": [], "met": []})
            for kind, ratios in per_request_ratios(real_dir, replay_dir).items():
                kinds[kind] += ratios
        # the workflow's own reduction of both sides (`compare_runs`: each run's percentiles,
        # averaged over the repetitions whose real run is `ok`)
        compared = {
            side: {
                (r["engine"], r["arm"], r["condition"]): r
                for r in compare_runs(pairs, keeps_pace=keeps_pace)[0]
            }
            for side, pairs in by_side.items()
        }
    out: dict[str, Any] = {"results": str(args.results), "max_rate": args.max_rate}
    if args.platform is not None:
        out["platform"] = str(args.platform)
    out["rows"] = []
    print(
        f"{'engine':9s} {'arm':9s} {'condition':10s} reps | TTFT p50 ÷: workflow replay"
        " | p95 ÷: workflow replay | replay, each request: lone (n)  met (n)"
    )
    for key, kinds in sorted(split.items()):
        engine, arm, condition = key
        row: dict[str, Any] = {"engine": engine, "arm": arm, "condition": condition}
        row["reps"] = compared["workflow"][key]["reps"]
        for metric in ("ttft_p50", "ttft_p95"):
            for side in ("workflow", "replay"):
                row[f"{metric}_{side}"] = round(compared[side][key][f"{metric}_ratio"], 4)
        for kind in ("lone", "met"):
            row[f"{kind}_n"] = len(kinds[kind])
            row[f"{kind}_median"] = round(float(np.median(kinds[kind])), 4) if kinds[kind] else None
        out["rows"].append(row)
        print(
            f"{engine:9s} {arm:9s} {condition:10s} {row['reps']:4d} |"
            f"          {row['ttft_p50_workflow']:.3f}  {row['ttft_p50_replay']:.3f}"
            f" |        {row['ttft_p95_workflow']:.3f}  {row['ttft_p95_replay']:.3f}"
            f" | {_fmt(row['lone_median'])} ({row['lone_n']:3d})"
            f"  {_fmt(row['met_median'])} ({row['met_n']:3d})"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
