"""The bracketing gate, measurement by measurement: how often this machine let a sim-vs-real
measurement be judged (issue 26; docs/simulator.md, "The gate over nine measurements").

    .venv/bin/python benchmarks/gate_by_day.py [TAG ...] [--json OUT.json]

For each TAG, the kept `floor_drift-TAG.json` of docs/benchmarks/data (the workflow's
results/sim_vs_real/floor_drift.json, or `benchmarks/floor_drift.py`'s on two makings): per
deployment, whether its floors before and after its loaded runs agree within the band, whether
its engine's floor is quiet, and so whether the gate judges it; and each engine's floor noise
(ln sd of median TTFT and ITL) against the bar. Prints a Markdown table, one row a measurement,
then the totals over them (`totals` in the JSON).
Without TAG, the measurements made with the bracket (`measurement_days.py`), the seventeenth
as the quiet bar reads it.
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the measurements: those that judged any deployment and all of theirs, the brackets
    that agreed, the engine-days that were quiet, and each engine's median floor noise."""
    engines = sorted({e for r in rows for e in r["noise"]})
    return {
        "measurements": len(rows),
        "judged_any": sum(bool(r["judged"]) for r in rows),
        "judged_all": sum(len(r["judged"]) == r["deployments"] for r in rows),
        "brackets_agreeing": sum(len(r["agree"]) for r in rows),
        "deployments": sum(r["deployments"] for r in rows),
        "engine_days_quiet": sum(len(r["quiet_engines"]) for r in rows),
        "engine_days": sum(len(r["noise"]) for r in rows),
        "median_noise": {
            e: round(statistics.median(r["noise"][e] for r in rows if e in r["noise"]), 4)
            for e in engines
        },
    }


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
    t = totals(rows)
    print(
        f"\n{t['judged_any']} of {t['measurements']} measurements judged a deployment,"
        f" {t['judged_all']} all of theirs; brackets agreeing {t['brackets_agreeing']} of"
        f" {t['deployments']}; engine-days quiet {t['engine_days_quiet']} of {t['engine_days']};"
        f" median floor noise " + ", ".join(f"{e} {v:.3f}" for e, v in t["median_noise"].items())
    )
    if args.json is not None:
        write_json(args.json, {"measurements": rows, "totals": t})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
