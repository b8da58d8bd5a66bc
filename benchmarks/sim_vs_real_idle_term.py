"""What would an after-idle term do to the comparison? One sim-vs-real measurement scored with the
simulated llama-server's passes slowed after an idle (issue 26; docs/simulator.md, "An eleventh
measurement").

    .venv/bin/python benchmarks/sim_vs_real_idle_term.py --results results \\
        [--gain 0.65] [--rise-s 2] [--decay-s 0.1] [--engines llamacpp ...] \\
        [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml] [--json OUT]

A llama-server pass after seconds of idle takes up to 1.6 times as long, and the engine comes
back to speed over about 0.1 s of work (`idle_wake_cost.py --after`). The floor is a closed loop
that never idles, so the fitted platform cannot price this. This script asks what a term for it
would change, on a measurement already made: it fits the platform from the results folder's
floor as the workflow does (`sim_vs_real_fit_rules.py`'s `gaps` rule), predicts every loaded run
twice, as the workflow does and with the term, and prints the goal checks of each.

The term is the CPU platform's own after-idle term (servelab.sim.cpu_platform): a coldness c in
[0, 1] that rises toward 1 with time constant `--rise-s` while the engine idles; a pass costs
(1 + gain * c) times its linear time, and c then decays by exp(-pass time / `--decay-s`). The
workflow fits it from a floor with idle gaps (config `floor.idle_gaps`); this script sets it by
hand on the fitted step cost of each of `--engines` (default llama.cpp's), replacing any fitted
one, to ask what given constants would do; `--gain 0` scores the fitted platform without its term.
The defaults are the benchmark's shape read by eye, not a fit. The other engines' step costs are
left as fitted. Nothing under `--results` is written.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import floor_runs
from sim_vs_real_fit_rules import fit_platform, loaded_runs, score, tally
from sim_vs_real_slowdown import add_config_arguments, config_of


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--gain", type=float, default=0.65)
    parser.add_argument("--rise-s", type=float, default=2.0)
    parser.add_argument("--decay-s", type=float, default=0.1)
    parser.add_argument("--engines", nargs="+", default=["llamacpp"])
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.gain < 0 or args.rise_s <= 0 or args.decay_s <= 0:
        raise SystemExit("--gain must be >= 0, --rise-s and --decay-s > 0")
    config = config_of(args)
    runs = floor_runs(args.results)
    if not runs or not loaded_runs(args.results):
        raise SystemExit(f"{args.results}: no ok floor run or no loaded run to score")
    platform = fit_platform(runs, dict.fromkeys(sorted({r.engine for r in runs}), "gaps"), config)
    out: dict[str, Any] = {
        "results": str(args.results),
        "term": {
            "gain": args.gain,
            "rise_s": args.rise_s,
            "decay_s": args.decay_s,
            "engines": args.engines,
        },
    }
    given = copy.deepcopy(platform)
    for engine in args.engines:
        if engine not in given["engines"]:
            raise SystemExit(f"--engines {engine}: no floor run of that engine in {args.results}")
        given["engines"][engine]["step_cost"].update(
            idle_gain=args.gain, idle_rise_s=args.rise_s, idle_decay_s=args.decay_s
        )
    for name, scored in (("as the workflow", platform), ("with the term", given)):
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            summary = score(scored, args.results, config, Path(tmp))
        result = tally(summary)
        result["ratios"] = {  # every goal check's predicted ÷ real, met or not
            f"{s['engine']}/{s['arm']}": {
                f"{c['condition']} {c['metric']}": c["ratio"] for c in s["checks"]
            }
            for s in summary["series"]
        }
        out[name] = result
        print(f"{name}: {result['met']} of {result['checked']} checks met")
        for series, values in result["series"].items():
            print(f"  {series:20s} {values['met']:2d} of {values['checked']}: {values['missed']}")
        light = {
            series: {k: v for k, v in checks.items() if k.startswith("rate-0.50 ttft")}
            for series, checks in result["ratios"].items()
        }
        print(f"  TTFT at 0.5 graphs/s, predicted ÷ real: {light}")
        print(f"  ({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
