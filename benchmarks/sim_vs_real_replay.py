"""The light-load TTFT miss with the arrivals held fixed (issue 26; docs/simulator.md, "The
light-load TTFT with the real arrivals").

    .venv/bin/python benchmarks/sim_vs_real_replay.py --results results [--max-rate 2] \\
        [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml] [--json OUT]

A loaded run's trace is a set of agent graphs: a graph's planner arrives on the seeded schedule,
its workers when the planner has finished and their tool calls have returned, its aggregator when
every worker has. So a prediction sends most requests at times of its own making, and two
requests that met on the real engine may not meet in the prediction, or the other way round. The
light-load TTFT, predicted low on every measurement pooled ("The model's error across
measurements"), could come from that feedback rather than from the price of the work.

This predicts every loaded run of `--results` at rates up to `--max-rate` graphs/s a second time,
with each request a root sent at the real run's own time after the trace's start (its real
`sent_s` less the run's `trace_start_s`; a request the real run never sent is left out), on the
results folder's own fitted platform. It prints, per engine, arm and condition:
- TTFT p50 and p95, predicted ÷ real, as the workflow computes them (`read_run`: the mean over the
  repetitions of each run's percentile), for the workflow's own prediction and for the replay;
- on the replay, where both sides send every request at one time, the median of each request's
  own predicted ÷ real TTFT, for the requests that met no other (nothing in flight when sent,
  nothing sent before its first token, on the real run) and for the rest.

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
from sim_vs_real_fit_rules import loaded_runs
from sim_vs_real_slowdown import add_config_arguments, config_of, platform_file, predict_into

import servelab.sim.run as sim_run
from servelab.analysis.sim_vs_real import read_run
from servelab.grid.config import conditions
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


def ttfts(run_dir: Path) -> dict[str, tuple[float, float, float]]:
    """request id -> (sent, TTFT, last token) of every trace request with a token."""
    t = pq.read_table(run_dir / "requests.parquet").to_pydict()
    out = {}
    for rid, warmup, sent, chunks in zip(
        t["request_id"], t["warmup"], t["sent_s"], t["chunk_times_s"], strict=True
    ):
        if not warmup and sent is not None and chunks:
            out[rid] = (sent, chunks[0] - sent, chunks[-1])
    return out


def met_no_other(real: Mapping[str, tuple[float, float, float]]) -> set[str]:
    """The requests of a real run that met no other: none in flight when sent, none sent before
    its first token."""
    alone = set()
    for rid, (sent, ttft, _end) in real.items():
        if not any(
            (s < sent < e) or (sent < s < sent + ttft)
            for other, (s, _t, e) in real.items()
            if other != rid
        ):
            alone.add(rid)
    return alone


def per_request_ratios(
    real: Mapping[str, tuple[float, float, float]],
    predicted: Mapping[str, tuple[float, float, float]],
) -> dict[str, list[float]]:
    """Each request's predicted ÷ real TTFT, split into the lone ones and the rest."""
    alone = met_no_other(real)
    out: dict[str, list[float]] = {"lone": [], "met": []}
    for rid, (_s, ttft, _e) in real.items():
        if rid in predicted and ttft > 0:
            out["lone" if rid in alone else "met"].append(predicted[rid][1] / ttft)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--max-rate", type=float, default=2.0, help="graphs/s (default 2)")
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = config_of(args)
    platform = platform_file(args.results)
    by_condition = conditions(config)
    runs = [
        run
        for run in loaded_runs(args.results)
        if run[2] in by_condition and float(by_condition[run[2]].rate) <= args.max_rate
    ]
    if not runs:
        raise SystemExit(f"{args.results}: no loaded run at rates up to {args.max_rate} graphs/s")
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm, engine, condition, rep in runs:
            name = f"{arm}/{engine}/{condition}/{rep}"
            real_dir = args.results / "runs" / name
            workflow_dir = args.results / "sim_vs_real" / "predicted" / name
            replay_dir = Path(tmp) / name
            replay_dir.mkdir(parents=True)
            with sent_as(real_arrivals(real_dir)):
                predict_into(args.results, config, name, platform, replay_dir)
            duration = float(by_condition[condition].duration_s)
            g = groups.setdefault(
                (engine, arm, condition),
                {"real": [], "workflow": [], "replay": [], "lone": [], "met": []},
            )
            for side, folder in (("real", real_dir), ("workflow", workflow_dir)):
                g[side].append(read_run(folder, engine, duration).values)
            g["replay"].append(read_run(replay_dir, engine, duration).values)
            split = per_request_ratios(ttfts(real_dir), ttfts(replay_dir))
            g["lone"] += split["lone"]
            g["met"] += split["met"]
    out: dict[str, Any] = {"results": str(args.results), "max_rate": args.max_rate, "rows": []}
    print(
        f"{'engine':9s} {'arm':9s} {'condition':10s} reps | TTFT p50 ÷: workflow replay"
        " | p95 ÷: workflow replay | replay, each request: lone (n)  met (n)"
    )
    for (engine, arm, condition), g in sorted(groups.items()):
        row: dict[str, Any] = {"engine": engine, "arm": arm, "condition": condition}
        row["reps"] = len(g["real"])
        for metric in ("ttft_p50", "ttft_p95"):
            real = float(np.mean([v[metric] for v in g["real"]]))
            for side in ("workflow", "replay"):
                row[f"{metric}_{side}"] = round(
                    float(np.mean([v[metric] for v in g[side]])) / real, 4
                )
        for kind in ("lone", "met"):
            row[f"{kind}_n"] = len(g[kind])
            row[f"{kind}_median"] = round(float(np.median(g[kind])), 4) if g[kind] else None
        out["rows"].append(row)

        def fmt(value: float | None) -> str:
            return "  -  " if value is None else f"{value:.3f}"

        print(
            f"{engine:9s} {arm:9s} {condition:10s} {row['reps']:4d} |"
            f"          {row['ttft_p50_workflow']:.3f}  {row['ttft_p50_replay']:.3f}"
            f" |        {row['ttft_p95_workflow']:.3f}  {row['ttft_p95_replay']:.3f}"
            f" | {fmt(row['lone_median'])} ({row['lone_n']:3d})"
            f"  {fmt(row['met_median'])} ({row['met_n']:3d})"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
