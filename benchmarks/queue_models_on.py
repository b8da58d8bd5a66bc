"""The fluid and the closed queueing model against the runs of an existing results folder, without
re-running anything: the numbers docs/analysis.md quotes for the real CPU pair.

    .venv/bin/python benchmarks/queue_models_on.py --results results [--probe-condition rate-6.00]

`snakemake results/queue_models.csv --configfile config/cpu-pair.yaml config/sim-vs-real.yaml`
builds the same table, but would first measure every real run again whenever the workflow's code
changed since the sweep (about an hour of both engines); this script reads the sweep's artifacts
as they are (the runs' files, the floor runs, the deployments' resolved.json, the traces) and
writes the three outputs to a scratch folder (`--out`, default a temporary one). The floor is
reduced again from the folder's floor runs (`floor/DEPLOYMENT/runs/...`, as the `floor` rule
does), so it belongs to the same deployments as the runs even where `floor.csv` is older.

`--probe-condition C`: the runs of condition C serve as the closed model's capacity probes (as a
capacity search's probes do) and are left out of the evaluation, so no run predicts itself.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
from pathlib import Path

from servelab.analysis.floor import write_floor
from servelab.analysis.queue_models import write_queue_models

# the columns docs/analysis.md quotes per engine: TTFT p50 (closed, closed given the measured X,
# Eq. 8 on the run alone) and throughput
RATIOS = ("closed_ratio", "given_x_ratio", "fluid_run_ratio", "closed_throughput_ratio")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--probe-condition", help="this condition's runs are the capacity probes")
    ap.add_argument("--out", type=Path, help="folder for the outputs (default: a temporary one)")
    args = ap.parse_args(argv)
    results: Path = args.results
    runs = sorted(str(p.parent) for p in results.glob("runs/*/*/*/rep*/run.json"))
    if not runs:
        ap.error(f"{results}: no run under runs/ARM/ENGINE/CONDITION/REP/run.json")
    probes = [r for r in runs if Path(r).parent.name == args.probe_condition]
    evaluated = [r for r in runs if r not in probes]
    floor_runs = sorted(str(p.parent) for p in results.glob("floor/*/runs/*/*/*/rep*/run.json"))
    traces = [
        (str(d / "trace.parquet"), str(d / "manifest.json"))
        for d in sorted(results.glob("traces/*/rep*"))
    ]
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        write_floor(floor_runs, out / "floor.csv")
        write_queue_models(
            evaluated,
            out / "queue_models.csv",
            out / "queue_models_summary.csv",
            traces=traces,
            floor_csv=out / "floor.csv",
            resolved=sorted(str(p) for p in results.glob("deployments/*/resolved.json")),
            probe_dirs=probes,
        )
        print(f"{len(evaluated)} runs evaluated, {len(probes)} probe runs ({args.probe_condition})")
        print((out / "queue_models_summary.csv").read_text(), end="")
        print("\nsaturated runs: measured -> closed TTFT p50 (s), given the measured X, throughput")
        with (out / "queue_models.csv").open(newline="") as f:
            saturated = [row for row in csv.DictReader(f) if row["saturated"] == "true"]
        for row in saturated:
            print(
                f"{row['run_id']}: {float(row['measured_ttft_p50_s']):.3f} -> "
                f"{float(row['closed_ttft_p50_s']):.3f} (given X: "
                f"{float(row['given_x_ttft_p50_s']):.3f}); X {float(row['measured_throughput_rps']):.1f}"
                f" -> {float(row['closed_throughput_rps']):.1f} req/s, slots {row['closed_slots']}"
            )
        print("\nper engine, saturated runs: geometric mean of predicted / measured (range, runs)")
        for engine in sorted({row["engine"] for row in saturated}):
            for column in RATIOS:
                ratios = [
                    float(row[column])
                    for row in saturated
                    if row["engine"] == engine and row[column] not in ("", "nan")
                ]
                if ratios:
                    print(
                        f"{engine:<10} {column:<24} {statistics.geometric_mean(ratios):.3g} "
                        f"({min(ratios):.2g}-{max(ratios):.2g}, {len(ratios)})"
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
