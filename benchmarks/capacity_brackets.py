"""The capacity search's brackets from results/capacity.csv, as JSON (figures' source).

    .venv/bin/python benchmarks/capacity_brackets.py --results DIR

Prints, for each search (arm, engine, shape), its bracket's low and high rate, and the widest
bracket's width (capacity.csv's bracket_width_pct): {"<arm>-<engine>-<shape>_low": ..., ...,
"widest_pct": ...}.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, required=True)
    args = ap.parse_args(argv)
    out: dict[str, float] = {}
    widths = []
    with (args.results / "capacity.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            name = f"{row['arm']}-{row['engine']}-{row['shape']}"
            out[f"{name}_low"] = float(row["capacity_low"])
            out[f"{name}_high"] = float(row["capacity_high"])
            widths.append(float(row["bracket_width_pct"]))
    out["widest_pct"] = round(max(widths), 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
