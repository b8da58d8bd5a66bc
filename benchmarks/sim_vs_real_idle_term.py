"""What would an after-idle term do to the comparison? One sim-vs-real measurement scored with the
simulated llama-server's passes slowed after an idle (issue 26; docs/simulator.md, "An eleventh
measurement").

    .venv/bin/python benchmarks/sim_vs_real_idle_term.py --results results \\
        [--gain 0.65] [--rise-s 2] [--decay-s 0.1] \\
        [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml] [--json OUT]

A llama-server pass after seconds of idle takes up to 1.6 times as long, and the engine comes
back to speed over about 0.1 s of work (`idle_wake_cost.py --after`). The floor is a closed loop
that never idles, so the fitted platform cannot price this. This script asks what a term for it
would change, on a measurement already made: it fits the platform from the results folder's
floor as the workflow does (`sim_vs_real_fit_rules.py`'s `gaps` rule), predicts every loaded run
twice, as the workflow does and with the term, and prints the goal checks of each.

The term is a coldness c in [0, 1] of the simulated llama-server. While the server idles, c rises
toward 1 with time constant `--rise-s`. A llama_decode call costs (1 + gain * c) times its
modelled time, and c then decays by exp(-call time / `--decay-s`). The defaults are the
benchmark's shape read by eye, not a fit. The term lives in this script only: it wraps the
simulated server's `_run` and `_decode_time` for the script's own predictions and restores them.
vLLM's model is left as it is. Nothing under `--results` is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import floor_runs
from sim_vs_real_fit_rules import fit_platform, loaded_runs, score, tally
from sim_vs_real_slowdown import add_config_arguments, config_of

from servelab.sim.llamacpp import LlamacppModel


@contextlib.contextmanager
def after_idle_term(gain: float, rise_s: float, decay_s: float) -> Iterator[None]:
    """The simulated llama-server with the module docstring's after-idle term, for the block."""
    run, decode_time = LlamacppModel._run, LlamacppModel._decode_time

    def slowed_run(self: Any, now: float, *args: Any, **kwargs: Any) -> Any:
        idle = max(0.0, now - self._last_end)
        cold = getattr(self, "_cold", 0.0)
        self._cold = 1.0 - (1.0 - cold) * math.exp(-idle / rise_s)
        return run(self, now, *args, **kwargs)

    def slowed_decode_time(self: Any, sub: Any) -> float:
        seconds = float(decode_time(self, sub)) * (1.0 + gain * self._cold)
        self._cold *= math.exp(-seconds / decay_s)
        return seconds

    LlamacppModel._run = slowed_run  # type: ignore[method-assign]
    LlamacppModel._decode_time = slowed_decode_time  # type: ignore[method-assign]
    try:
        yield
    finally:
        LlamacppModel._run = run  # type: ignore[method-assign]
        LlamacppModel._decode_time = decode_time  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--gain", type=float, default=0.65)
    parser.add_argument("--rise-s", type=float, default=2.0)
    parser.add_argument("--decay-s", type=float, default=0.1)
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
        "term": {"gain": args.gain, "rise_s": args.rise_s, "decay_s": args.decay_s},
    }
    for name, term in (
        ("as the workflow", contextlib.nullcontext()),
        ("with the term", after_idle_term(args.gain, args.rise_s, args.decay_s)),
    ):
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp, term:
            summary = score(platform, args.results, config, Path(tmp))
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
