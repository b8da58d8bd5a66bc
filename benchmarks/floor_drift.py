"""Did the machine's speed move between two makings of the same floors? (issue 26;
docs/simulator.md, "A sixteenth measurement").

    .venv/bin/python benchmarks/floor_drift.py --before RESULTS --after RESULTS \\
        [--band 0.05] [--json OUT]

Each results folder holds the same floors (results/floor, as the workflow makes them), made at
two times: before a measurement's loaded runs and after them. Runs are paired by engine, arm,
shape and repetition. Per deployment (engine and arm), this prints the median over its pairs of
the after ÷ before ratio of each run's median TTFT and median inter-token gap
(`servelab.sim.cpu_fit.floor_drift`). A deployment agrees when both ratios lie within
exp(±band) of 1: a floor-only fit from either making then prices the loaded runs between them
within the band. A deployment that does not agree was measured while the machine's speed moved by
more than the goal's X band (5%), and no fit from one making can be held to that band. Nothing is
written under either folder.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import floor_runs

from servelab.sim.cpu_fit import floor_drift


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="a results folder")
    parser.add_argument("--after", type=Path, required=True, help="a results folder")
    parser.add_argument(
        "--band", type=float, default=0.05, help="the agreement band, as a fraction (0.05: ±5%%)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not 0 <= args.band < 1:
        parser.error("--band must be at least 0 and below 1")
    before, after = floor_runs(args.before), floor_runs(args.after)
    for folder, runs in ((args.before, before), (args.after, after)):
        if not runs:
            raise SystemExit(f"no ok floor run under {folder / 'floor'}")
    drift = floor_drift(before, after, band=math.log1p(args.band))
    if not drift:
        raise SystemExit("no floor run of --after has a partner in --before")
    for deployment, d in drift.items():
        verdict = "agrees" if d["agrees"] else "DRIFTED"
        print(
            f"{deployment}: {d['pairs']} pairs, after ÷ before: TTFT {d['ttft_ratio']:.3f}, "
            f"ITL {d['itl_ratio']:.3f}: {verdict} (band ±{100 * args.band:g}%)"
        )
    if args.json is not None:
        result = {"before": str(args.before), "after": str(args.after), "band": args.band}
        result["deployments"] = drift
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
