"""Does a real engine's time a token grow with the requests it holds, beyond the prediction?
(issue 26; docs/simulator.md, "A ninth measurement").

    .venv/bin/python benchmarks/sim_vs_real_held.py --results results [--engine llamacpp]
        [--min-rate 3] [--bin-s 2] [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml]
        [--predicted DIR] [--json OUT]

For every loaded run of `--engine` whose condition (from the workflow's configuration) offers
`--min-rate` graphs/s or more, real
(`results/runs/.../requests.parquet`) and predicted (`results/sim_vs_real/predicted/...`), the run
is cut into `--bin-s` windows from its first request's send. Per window, on each side: the output
chunks the client received (one token each: llama-server streams one a token) and the requests
held, sent and not finished, at the window's middle. A window is kept when both sides hold at
least 8 requests (twice the CPU pair's 4 slots) and received over 50 chunks, so both are
saturated and a time a token means a pass's. Printed: the windows grouped by the real
side's requests held, with the median real and predicted milliseconds a token and their ratio,
and a line through all windows, the excess (real − predicted ms a token) against requests held.

The client's clock is what is read: a run whose client lagged would show here too; the engines'
own pass counters (`benchmarks/sim_vs_real_passes.py`) say whether the engine's passes grew.
Nothing is fitted but the line; the predicted side is the workflow's own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_slowdown import add_config_arguments, config_of

from servelab.grid.config import conditions

MIN_HELD = 8
MIN_CHUNKS = 50
HELD_GROUPS = ((8, 50), (50, 100), (100, 150), (150, 250), (250, 1000))


def profile(requests_path: Path, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(chunks received, requests held at the middle) of each `bin_s` window of a run."""
    rows = [
        r
        for r in pq.read_table(requests_path).to_pylist()
        if not r["warmup"] and r["chunk_times_s"]
    ]
    if not rows:
        raise SystemExit(f"{requests_path}: no request with output chunks")
    start = min(float(r["sent_s"]) for r in rows)
    chunks = np.concatenate([np.asarray(r["chunk_times_s"], dtype=float) for r in rows]) - start
    edges = np.arange(0.0, float(chunks.max()) + bin_s, bin_s)
    received, _ = np.histogram(chunks, bins=edges)
    sent = np.array([float(r["sent_s"]) for r in rows]) - start
    done = np.array([float(r["chunk_times_s"][-1]) for r in rows]) - start
    middles = (edges[:-1] + edges[1:]) / 2
    held = np.array([int(((sent <= m) & (done > m)).sum()) for m in middles])
    return received, held


def windows(
    results: Path,
    engine: str,
    rates: dict[str, float],
    min_rate: float,
    bin_s: float,
    predicted_root: Path | None = None,
) -> list[dict[str, Any]]:
    """Every saturated window of the engine's loaded runs whose condition's rate (`rates`, by
    condition id) is at least `min_rate`, real beside predicted (under `predicted_root`, by
    default the workflow's results/sim_vs_real/predicted)."""
    root = results / "sim_vs_real" / "predicted" if predicted_root is None else predicted_root
    out = []
    for run_json in sorted((results / "runs").glob(f"*/{engine}/*/rep*/run.json")):
        run_dir = run_json.parent
        arm, condition, rep = run_dir.parts[-4], run_dir.parts[-2], run_dir.parts[-1]
        if rates.get(condition, 0.0) < min_rate:
            continue
        predicted = root / run_dir.relative_to(results / "runs")
        real_chunks, real_held = profile(run_dir / "requests.parquet", bin_s)
        pred_chunks, pred_held = profile(predicted / "requests.parquet", bin_s)
        for i in range(min(len(real_chunks), len(pred_chunks))):
            if min(real_held[i], pred_held[i]) < MIN_HELD:
                continue
            if min(real_chunks[i], pred_chunks[i]) <= MIN_CHUNKS:
                continue
            out.append(
                {
                    "run": f"{arm}/{engine}/{condition}/{rep}",
                    "window_s": round(i * bin_s, 3),
                    "held_real": int(real_held[i]),
                    "held_predicted": int(pred_held[i]),
                    "real_ms_per_token": round(bin_s / real_chunks[i] * 1e3, 4),
                    "predicted_ms_per_token": round(bin_s / pred_chunks[i] * 1e3, 4),
                }
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--engine", default="llamacpp")
    parser.add_argument("--min-rate", type=float, default=3.0)
    parser.add_argument("--bin-s", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--predicted",
        type=Path,
        help="predicted runs other than the workflow's (sim_vs_real_fit_rules.py --keep K: "
        "K/VARIANT/predicted)",
    )
    add_config_arguments(parser)
    args = parser.parse_args()
    if args.bin_s <= 0:
        parser.error(f"--bin-s {args.bin_s}: a positive number of seconds")
    rates = {cid: float(c.rate) for cid, c in conditions(config_of(args)).items()}
    rows = windows(args.results, args.engine, rates, args.min_rate, args.bin_s, args.predicted)
    if len(rows) < 2:
        raise SystemExit(f"{args.results}: fewer than two saturated windows of {args.engine}")
    held = np.array([r["held_real"] for r in rows], dtype=float)
    real = np.array([r["real_ms_per_token"] for r in rows])
    predicted = np.array([r["predicted_ms_per_token"] for r in rows])
    groups = []
    for lo, hi in HELD_GROUPS:
        mask = (held >= lo) & (held < hi)
        if mask.any():
            groups.append(
                {
                    "held": f"{lo}-{hi - 1}",
                    "windows": int(mask.sum()),
                    "real_ms_per_token": round(float(np.median(real[mask])), 3),
                    "predicted_ms_per_token": round(float(np.median(predicted[mask])), 3),
                    "ratio": round(float(np.median(real[mask] / predicted[mask])), 3),
                }
            )
    slope, intercept = np.polyfit(held, real - predicted, 1)
    print(
        f"{len(rows)} saturated {args.bin_s:g}-s windows of {args.engine} from rate {args.min_rate:g}"
    )
    for g in groups:
        print(
            f"  held {g['held']:>8}: {g['windows']:3d} windows, real {g['real_ms_per_token']:.2f} "
            f"ms a token, predicted {g['predicted_ms_per_token']:.2f}, ratio {g['ratio']:.3f}"
        )
    print(f"  excess against held: {slope * 1e3:.1f} µs a token per request held")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "engine": args.engine,
                    "min_rate": args.min_rate,
                    "bin_s": args.bin_s,
                    "groups": groups,
                    "excess_us_per_token_per_held": round(float(slope) * 1e3, 2),
                    "excess_intercept_ms": round(float(intercept), 4),
                    "windows": rows,
                },
                indent=1,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
