"""Does a llama-server pass cost more, a woken thread, the deeper the queue? Read from the floor's
own queue (issue 26; docs/simulator.md, "A fourteenth measurement").

    .venv/bin/python benchmarks/llamacpp_floor_wakeups.py --results results [--json OUT]

The step model charges each pass `per_wakeup_s` for every HTTP thread a result wakes
(servelab.sim.llamacpp, `_send`: every result wakes every request's thread but its own), one
constant, fitted from the floor's warm-ups, which queue behind the four slots. If a wake-up cost
more the more threads wait (a lock convoy on the results' mutex, say), the passes with many
wake-ups would take longer than the linear model says, and a loaded run with a deeper queue would
fall behind its prediction.

This replays every llama.cpp floor run of `--results` on the fitted platform
(results/sim_vs_real/platform.json, its linear model: `servelab.sim.cpu_fit.floor_passes`) and,
for every inter-token gap the fit reads (after-idle requests left out), sets the observed gap
beside the linear model's time for the passes it spans. It prints the median observed ÷ predicted
by the wake-ups a pass, in bins. A cost that grows with the queue shows as a ratio that rises from
bin to bin. Only the floor's files and the platform file are read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import GPU_MEMORY_MIB, MODEL_PRESET, floor_runs

from servelab.sim.cpu_fit import floor_passes, read_step_costs
from servelab.sim.cpu_platform import FEATURES

BIN_EDGES = (0, 1, 20, 50, 100, 150, 200, 300, 500)  # wake-ups a pass


def gap_ratios(results: Path) -> np.ndarray:
    """Rows of (wake-ups a pass, sampled sequences a pass, observed ÷ predicted), one a gap."""
    cost = read_step_costs(results / "sim_vs_real" / "platform.json")["llamacpp"]
    coefficients = np.array(list(cost.coefficients().values()))
    wakeups, sampled = FEATURES.index("wakeups"), FEATURES.index("sampled")
    rows = []
    for run in floor_runs(results):
        if run.engine != "llamacpp":
            continue
        replay = floor_passes(
            run, gpu_memory_mib=GPU_MEMORY_MIB, model_preset=MODEL_PRESET, timing=cost
        )
        for row in replay.rows:
            spanned = row.passes[1] - row.passes[0]
            if row.kind != "itl" or row.after_idle or spanned <= 0:
                continue
            predicted = float(row.features @ coefficients) * cost.slowdown
            rows.append(
                (
                    row.features[wakeups] / spanned,
                    row.features[sampled] / spanned,
                    row.observed_s / predicted,
                )
            )
    if not rows:
        raise SystemExit(f"{results}: no llama.cpp floor run")
    return np.array(rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = gap_ratios(args.results)
    bins: list[dict[str, Any]] = []
    for lo, hi in zip(BIN_EDGES, (*BIN_EDGES[1:], np.inf), strict=True):
        mask = (rows[:, 0] >= lo) & (rows[:, 0] < hi)
        if not mask.any():
            continue
        bins.append(
            {
                "wakeups_a_pass": [lo, None if hi == np.inf else hi],
                "gaps": int(mask.sum()),
                "observed_over_predicted_median": round(float(np.median(rows[mask, 2])), 3),
                "sampled_a_pass_median": round(float(np.median(rows[mask, 1])), 2),
            }
        )
        print(
            f"wake-ups a pass {lo:4d}-{'' if hi == np.inf else int(hi):>4}: {mask.sum():6d} gaps,"
            f" observed ÷ predicted {bins[-1]['observed_over_predicted_median']:.3f},"
            f" sampled a pass {bins[-1]['sampled_a_pass_median']:.1f}"
        )
    if args.json:
        out = {"results": str(args.results), "bins": bins}
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
