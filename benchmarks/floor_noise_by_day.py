"""Does a minute of the machine before a measurement foretell its floors' noise? And how noisy was
each arm's floor, read by the engine's rule? (issue 26; docs/simulator.md, "A twenty-second
measurement").

    .venv/bin/python benchmarks/floor_noise_by_day.py [DAY ...] [--json OUT.json]

For each DAY (a tag of the kept files, such as 2026-12-07-twenty-second), from
docs/benchmarks/data: the probe of the engine's core before the invocation
(`machine_speed_drift-DAY-before.json`, the memory kernel's sd of its window means), and the
day's CPU platform (`cpu_platform-DAY.json`): each engine's floor noise as the workflow's quiet
bar reads it (ln sd of median TTFT and ITL, both arms pooled), and each arm's alone, pooled by the
same rule (`servelab.sim.cpu_fit.pooled_spread` over that arm's groups of `per_group`). Then
Spearman's rank correlation (scipy) of the probe against the larger engine TTFT noise of each day.
Without DAY, the five days probed before their invocation, the eighteenth to the twenty-second.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from scipy.stats import spearmanr

from servelab.sim.cpu_fit import pooled_spread

DATA = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "data"
PROBED_DAYS = (
    "2026-12-06-eighteenth",
    "2026-12-06-nineteenth",
    "2026-12-06-twentieth",
    "2026-12-07-twenty-first",
    "2026-12-07-twenty-second",
)


def day_record(day: str, data: Path = DATA) -> dict[str, Any]:
    """One day's probe before its invocation, and its engines' and arms' floor noise."""
    probe_path = data / f"machine_speed_drift-{day}-before.json"
    platform_path = data / f"cpu_platform-{day}.json"
    for path in (probe_path, platform_path):
        if not path.is_file():
            raise SystemExit(f"day {day}: no {path}")
    probe = json.loads(probe_path.read_text(encoding="utf-8"))
    platform = json.loads(platform_path.read_text(encoding="utf-8"))
    engines: dict[str, Any] = {}
    for engine, entry in sorted(platform["engines"].items()):
        noise = entry["noise"]
        arms: dict[str, list[list[float]]] = {}
        for group, spread in noise["per_group"].items():
            arms.setdefault(group.split("/")[0], []).append(spread)
        engines[engine] = {
            "ttft_ln_sd": noise["ttft_ln_sd"],
            "itl_ln_sd": noise["itl_ln_sd"],
            "arms": {
                arm: [round(x, 4) for x in pooled_spread(groups)]
                for arm, groups in sorted(arms.items())
            },
        }
    return {
        "probe_sd_of_window_means": probe["kinds"]["memory GB/s"]["sd_of_window_means"],
        "engines": engines,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("days", nargs="*", default=list(PROBED_DAYS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    days = {day: day_record(day) for day in args.days}
    for day, record in days.items():
        print(f"{day}: probe {record['probe_sd_of_window_means']:.4f}")
        for engine, noise in record["engines"].items():
            arms = "  ".join(
                f"{arm} {ttft:.3f}/{itl:.3f}" for arm, (ttft, itl) in noise["arms"].items()
            )
            print(
                f"  {engine:9s} engine {noise['ttft_ln_sd']:.3f}/{noise['itl_ln_sd']:.3f}"
                f"  (TTFT/ITL)  {arms}"
            )
    result: dict[str, Any] = {"days": days}
    if len(days) >= 3:
        probe = [r["probe_sd_of_window_means"] for r in days.values()]
        worst = [max(e["ttft_ln_sd"] for e in r["engines"].values()) for r in days.values()]
        rho = float(spearmanr(probe, worst).statistic)
        result["spearman_probe_vs_larger_engine_ttft_noise"] = round(rho, 3)
        print(f"Spearman's rho, probe against the larger engine TTFT noise: {rho:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
