"""The bracketing gate, measurement by measurement: how often this machine let a sim-vs-real
measurement be judged (issue 26; docs/simulator.md, "The gate over nine measurements").

    .venv/bin/python benchmarks/gate_by_day.py [TAG ...] [--json OUT.json]

For each TAG, the kept `floor_drift-TAG.json` of docs/benchmarks/data (the workflow's
results/sim_vs_real/floor_drift.json, or `benchmarks/floor_drift.py`'s on two makings): per
deployment, whether its floors before and after its loaded runs agree within the band, whether
its engine's floor is quiet, and so whether the gate judges it; and each engine's floor noise
(ln sd of median TTFT and ITL) against the bar. Prints a Markdown table, one row a measurement.
Without TAG, the nine measurements made with the bracket, the seventeenth (as the quiet bar
reads it) to the twenty-fifth.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurement_days import BRACKETED_DAYS

from servelab.artifacts import write_json

DATA = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "data"
# the seventeenth was made before the quiet bar existed; its floors read again by the bar
FLOOR_DRIFT_TAG = {"2026-12-06-seventeenth": "2026-12-06-seventeenth-bar"}


def gate_row(tag: str, drift: dict[str, Any]) -> dict[str, Any]:
    """One measurement's gate: deployments agreeing, engines quiet, deployments judged, and each
    engine's floor noise (the larger of TTFT's and ITL's ln sd)."""
    deployments = drift["deployments"]
    if not deployments:
        raise ValueError(f"floor_drift-{tag}.json: no deployments")
    noise: dict[str, float] = {}
    quiet: dict[str, bool] = {}
    for name, d in sorted(deployments.items()):
        engine = name.split("/", 1)[0]
        noise[engine] = max(d["noise"]["ttft_ln_sd"], d["noise"]["itl_ln_sd"])
        quiet[engine] = bool(d["quiet"])
    return {
        "tag": tag,
        "bar": drift["max_noise"],
        "band": drift["band"],
        "deployments": len(deployments),
        "agree": sorted(n for n, d in deployments.items() if d["agrees"]),
        "quiet_engines": sorted(e for e, q in quiet.items() if q),
        "judged": sorted(n for n, d in deployments.items() if d["judged"]),
        "noise": noise,
    }


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    engines = sorted({e for r in rows for e in r["noise"]})
    head = ["measurement", "brackets agreeing", "engines quiet", "judged"]
    head += [f"{e} floor noise (ln sd, the larger)" for e in engines]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r["tag"],
            f"{len(r['agree'])} of {r['deployments']}",
            f"{len(r['quiet_engines'])} of {len(r['noise'])}",
            ", ".join(r["judged"]) or "none",
        ]
        cells += [f"{r['noise'][e]:.3f}" if e in r["noise"] else "" for e in engines]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "tags", nargs="*", default=[FLOOR_DRIFT_TAG.get(d, d) for d in BRACKETED_DAYS]
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for tag in args.tags:
        path = DATA / f"floor_drift-{tag}.json"
        if not path.is_file():
            raise SystemExit(f"measurement {tag}: no {path}")
        rows.append(gate_row(tag, json.loads(path.read_text("utf-8"))))
    print("\n".join(markdown(rows)))
    judged_days = sum(bool(r["judged"]) for r in rows)
    print(f"\n{judged_days} of {len(rows)} measurements judged at least one deployment")
    if args.json is not None:
        write_json(args.json, {"measurements": rows, "judged_any": judged_days})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
