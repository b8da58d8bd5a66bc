"""Did the machine's speed move between two makings of the same floors? (issue 26;
docs/simulator.md, "A sixteenth measurement" and "The bracketing floor").

    .venv/bin/python benchmarks/floor_drift.py --before RESULTS --after RESULTS \\
        [--band 0.05] [--max-noise SD] [--json OUT]
    .venv/bin/python benchmarks/floor_drift.py --bracket RESULTS [--band 0.05] \\
        [--max-noise SD] [--json OUT]

Each results folder holds the same floors (results/floor, as the workflow makes them), made at
two times: before a measurement's loaded runs and after them. With `--bracket`, one results folder
the workflow bracketed (config `floor.bracket`): its results/floor before the loaded runs and
results/floor-after after them. Runs are paired by engine, arm, shape and repetition. Per
deployment (engine and arm), this prints the median over its pairs of the after ÷ before ratio
of each run's median TTFT and median inter-token gap (`servelab.sim.cpu_fit.floor_bracket`, as
the workflow's `floor_drift` rule). A deployment agrees when both ratios lie within exp(±band)
of 1: a floor-only fit from either making then prices the loaded runs between them within the
band. With `--max-noise`, the quiet-floor bar: a deployment is also judged only if its engine's
floor before (both arms) spreads between repetitions by at most that sd in ln median TTFT and
ln median ITL. Nothing is written under either folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import floor_runs

from servelab.sim.cpu_fit import floor_bracket


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--before", type=Path, help="a results folder")
    parser.add_argument("--after", type=Path, help="a results folder")
    parser.add_argument(
        "--bracket", type=Path, help="a results folder with floor/ and floor-after/"
    )
    parser.add_argument(
        "--band", type=float, default=0.05, help="the agreement band, as a fraction (0.05: ±5%%)"
    )
    parser.add_argument("--max-noise", type=float, help="the quiet-floor bar, sd in ln")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not 0 < args.band < 1:
        parser.error("--band must be above 0 and below 1")
    if args.bracket is not None:
        if args.before is not None or args.after is not None:
            parser.error("--bracket replaces --before and --after")
        folders = ((args.bracket, "floor"), (args.bracket, "floor-after"))
    elif args.before is None or args.after is None:
        parser.error("give --before and --after, or --bracket")
    else:
        folders = ((args.before, "floor"), (args.after, "floor"))
    before, after = (floor_runs(results, folder) for results, folder in folders)
    for (results, folder), runs in zip(folders, (before, after), strict=True):
        if not runs:
            raise SystemExit(f"no ok floor run under {results / folder}")
    record = floor_bracket(before, after, band=args.band, max_noise=args.max_noise)
    if not any(d["pairs"] for d in record["deployments"].values()):
        raise SystemExit("no floor run made after has a partner made before")
    for deployment, d in record["deployments"].items():
        if not d["pairs"]:
            print(f"{deployment}: no pair: not judged")
            continue
        verdict = "agrees" if d["agrees"] else "DRIFTED"
        line = (
            f"{deployment}: {d['pairs']} pairs, after ÷ before: TTFT {d['ttft_ratio']:.3f}, "
            f"ITL {d['itl_ratio']:.3f}: {verdict} (band ±{100 * args.band:g}%)"
        )
        if d["quiet"] is not None:
            sd = d["noise"]
            line += (
                f"; floor noise {sd['ttft_ln_sd']}, {sd['itl_ln_sd']}: "
                f"{'quiet' if d['quiet'] else 'NOISY'} (bar {args.max_noise:g})"
            )
        print(line + ("" if d["judged"] else ": not judged"))
    if args.json is not None:
        named = {"bracket": str(args.bracket)} if args.bracket is not None else {}
        if not named:
            named = {"before": str(args.before), "after": str(args.after)}
        args.json.write_text(json.dumps(named | record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
