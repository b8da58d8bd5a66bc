"""A measurement's comparison set beside the ceiling computed for it (issue 26; docs/simulator.md,
"A sixteenth measurement").

    .venv/bin/python benchmarks/sim_vs_real_against_ceiling.py \\
        --summary results/sim_vs_real.json --ceiling CEILING.json [--json OUT]

`--summary` is the workflow's `results/sim_vs_real.json`; `--ceiling` is what
`sim_vs_real_ceiling.py --json` wrote for the same predictions (best with `--grid`, before the
loaded runs were made). It prints the checks the real engines met against the ceiling's 5th
percentile, and every check beside the share of the ceiling's draws that met it: a missed check
the ceiling meets in nearly every draw is the model's to explain; one it often misses, the
machine's speed can decide. A check no draw had (a TTFT check at a rate the real saturation
brought under 90% of capacity, and no draw's did) is listed on its own. Nothing is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_ceiling import check_outcomes
from sim_vs_real_fit_rules import tally


def against_ceiling(summary: Mapping[str, Any], ceiling: Mapping[str, Any]) -> dict[str, Any]:
    """Each check of `summary` (met or not) beside the share of `ceiling`'s draws that met it,
    the count met beside the ceiling's percentiles, and the missed checks split by whether the
    ceiling had them."""
    counted = tally(dict(summary))
    shares = {name: c["met_share"] for name, c in ceiling["per_check"].items()}
    checks = {
        name: {"met": met, "ceiling_met_share": shares.get(name)}
        for name, met in sorted(check_outcomes(summary).items())
    }
    missed = {n: c["ceiling_met_share"] for n, c in checks.items() if not c["met"]}
    return {
        "met": counted["met"],
        "checked": counted["checked"],
        "ceiling_met_p5": ceiling["met_p5"],
        "ceiling_met_mean": ceiling["met_mean"],
        "ceiling_all_met_share": ceiling["all_met_share"],
        "missed": {n: s for n, s in missed.items() if s is not None},
        "missed_not_in_ceiling": sorted(n for n, s in missed.items() if s is None),
        "checks": checks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--summary", type=Path, default=Path("results/sim_vs_real.json"))
    parser.add_argument("--ceiling", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for path in (args.summary, args.ceiling):
        if not path.is_file():
            raise SystemExit(f"no file {path}")
    result = against_ceiling(
        json.loads(args.summary.read_text(encoding="utf-8")),
        json.loads(args.ceiling.read_text(encoding="utf-8")),
    )
    print(
        f"{args.summary}: {result['met']} of {result['checked']} checks met; the ceiling "
        f"{args.ceiling}: {result['ceiling_met_mean']} on average, 5th percentile "
        f"{result['ceiling_met_p5']:g}, all met in {100 * result['ceiling_all_met_share']:.0f}% "
        "of its draws"
    )
    for name, share in result["missed"].items():
        print(f"  missed {name}: the ceiling met it in {100 * share:.1f}% of its draws")
    for name in result["missed_not_in_ceiling"]:
        print(f"  missed {name}: no draw of the ceiling had this check")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
