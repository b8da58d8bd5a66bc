"""When does a loaded run fall behind its prediction? Request by request, over the run (issue 26;
docs/simulator.md, "A fourteenth measurement").

    .venv/bin/python benchmarks/sim_vs_real_lag.py --results results \\
        --run defaults/llamacpp/rate-6.00 [--bin-s 2] [--json OUT]

For each repetition of `--run`, every request that finished on both sides is set beside itself:
its real latency (scheduled to last token, results/runs) less its predicted latency
(results/sim_vs_real/predicted), as a median over the requests scheduled in each `--bin-s` bin. A
pass cost the model misses throughout shows as a lag that grows over the run; a stall, as a
step. Beside it, the most requests waiting at once, real and predicted, from
results/sim_vs_real_waiting.csv. Only those artifacts are read.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq


def latencies(requests: Path) -> dict[str, tuple[float, float]]:
    """Per measured request that streamed: (scheduled time, scheduled-to-last-token seconds)."""
    table = pq.read_table(requests).to_pylist()
    return {
        r["request_id"]: (float(r["scheduled_s"]), r["chunk_times_s"][-1] - float(r["scheduled_s"]))
        for r in table
        if not r["warmup"] and r["chunk_times_s"] and r["scheduled_s"] is not None
    }


def most_waiting(waiting_csv: Path, arm: str, engine: str, condition: str, rep: str) -> list[int]:
    """The most requests waiting at once, (real, predicted)."""
    real, predicted = [0], [0]
    with waiting_csv.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if (row["arm"], row["engine"], row["condition"], row["rep"]) != (
                arm,
                engine,
                condition,
                rep,
            ):
                continue
            if row["waiting_real"]:
                real.append(int(float(row["waiting_real"])))
            if row["waiting_predicted"]:
                predicted.append(int(float(row["waiting_predicted"])))
    return [max(real), max(predicted)]


def lag(results: Path, run: str, bin_s: float) -> dict[str, Any]:
    arm, engine, condition = run.split("/")
    out: dict[str, Any] = {}
    for rep_dir in sorted((results / "runs" / arm / engine / condition).glob("rep*")):
        rep = rep_dir.name
        real = latencies(rep_dir / "requests.parquet")
        predicted = latencies(
            results / "sim_vs_real" / "predicted" / run / rep / "requests.parquet"
        )
        bins: dict[int, list[float]] = {}
        for rid in sorted(set(real) & set(predicted)):
            scheduled, seconds = real[rid]
            bins.setdefault(int(scheduled // bin_s), []).append(seconds - predicted[rid][1])
        out[rep] = {
            "requests": sum(len(v) for v in bins.values()),
            "median_lag_s_by_bin": {
                f"{k * bin_s:g}": round(float(np.median(v)), 3) for k, v in sorted(bins.items())
            },
            "most_waiting_real_predicted": most_waiting(
                results / "sim_vs_real_waiting.csv", arm, engine, condition, rep
            ),
        }
    if not out:
        raise SystemExit(f"{results}/runs/{run}: no repetition")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--run", required=True, help="ARM/ENGINE/CONDITION")
    parser.add_argument("--bin-s", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = {"results": str(args.results), "run": args.run, "bin_s": args.bin_s}
    out["reps"] = lag(args.results, args.run, args.bin_s)
    for rep, r in out["reps"].items():
        bins = " ".join(f"{t}:{v:+.2f}" for t, v in r["median_lag_s_by_bin"].items())
        print(f"{rep}: {r['requests']} requests; median lag by bin (s): {bins}")
        print(f"  most waiting, real and predicted: {r['most_waiting_real_predicted']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
