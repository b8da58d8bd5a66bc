"""The model's error apart from the day's: one model's sim-vs-real measurements pooled, check by
check (issue 26; docs/simulator.md, "The model's error across measurements").

    .venv/bin/python benchmarks/sim_vs_real_pooled.py CSV [CSV ...] [--max-noise SD]
        [--level 0.95] [--held-out CSV] [--json OUT]

Each CSV is one measurement's results/sim_vs_real.csv, all of one model (the same scheduler code
and fit rule). For every goal check this prints its ratio predicted / real on each measurement
that checked it, their geometric mean with its t interval, and whether that interval lies within
the goal's band, outside it, or across its edge (servelab.analysis.sim_vs_real_pooled).

With `--max-noise`, a measurement's engine counts only where its floor was quiet by the gate's bar
(the workflow's floor.bracket.max_noise): both of the engine's floor spreads (`noise` in the
measurement's CPU platform, the file named as the CSV with cpu_platform for sim_vs_real and .json
for .csv) at most SD.

With `--held-out`, one more measurement of the same model, not pooled, is set against the pool:
each of its checks' ratio beside the check's predictive interval (where one more measurement's
ratio falls with probability `--level`, were the ln ratios normal), and how many fall inside.
Nothing is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from servelab.analysis.sim_vs_real import read_sim_vs_real_csv
from servelab.analysis.sim_vs_real_pooled import held_out, pooled_checks
from servelab.grid.settings import AnalysisSettings


def platform_of(csv_path: Path) -> Path:
    return csv_path.with_name(
        csv_path.name.replace("sim_vs_real", "cpu_platform", 1).removesuffix(".csv") + ".json"
    )


def noisy_engines(csv_path: Path, max_noise: float) -> set[str]:
    path = platform_of(csv_path)
    if not path.is_file():
        raise SystemExit(f"{csv_path}: --max-noise needs its platform file, {path}: not found")
    engines = json.loads(path.read_text(encoding="utf-8"))["engines"]
    noisy = set()
    for engine, entry in engines.items():
        noise = entry.get("noise") or {}
        spreads = [noise.get("ttft_ln_sd"), noise.get("itl_ln_sd")]
        if any(s is None or s > max_noise for s in spreads):
            noisy.add(engine)
    return noisy


def measurement_rows(path: Path, max_noise: float | None) -> tuple[list[dict[str, Any]], list[str]]:
    """A kept measurement's rows, without the engines whose floor was noisier than `max_noise`
    (none left out without a bar), and the engines left out."""
    rows = read_sim_vs_real_csv(path)
    if max_noise is None:
        return rows, []
    noisy = noisy_engines(path, max_noise)
    return [r for r in rows if r["engine"] not in noisy], sorted(noisy)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("csv", nargs="+", type=Path, help="sim_vs_real.csv of each measurement")
    parser.add_argument(
        "--keeps-pace", type=float, default=AnalysisSettings.keeps_pace, help="as config"
    )
    parser.add_argument("--max-noise", type=float, help="count an engine only on quiet floors")
    parser.add_argument("--level", type=float, default=0.95, help="the intervals' level")
    parser.add_argument(
        "--held-out", type=Path, help="one more sim_vs_real.csv, set against the pool"
    )
    parser.add_argument("--json", type=Path, help="also write the cells here")
    args = parser.parse_args()
    if len(args.csv) < 2:
        parser.error("give two or more measurements")
    measurements: dict[str, list[dict[str, Any]]] = {}
    left_out: dict[str, list[str]] = {}
    for path in args.csv:
        name = path.stem.removeprefix("sim_vs_real-")
        measurements[name], left_out[name] = measurement_rows(path, args.max_noise)
    result = pooled_checks(measurements, keeps_pace=args.keeps_pace, level=args.level)
    result["max_noise"] = args.max_noise
    result["left_out"] = left_out
    for name, whole in result["measurements"].items():
        gone = f"  (left out: {', '.join(left_out[name])})" if left_out.get(name) else ""
        print(f"{name:28s} met {whole['met']:3d} of {whole['checked']:3d}{gone}")
    print()
    for cell in result["cells"]:
        rate = "" if cell["rate"] is None else f"{cell['rate']:4.1f}"
        gmean = "none" if cell["gmean"] is None else f"{cell['gmean']:.3f}"
        low, high = cell["ci"]
        interval = "" if low is None else f"[{low:.3f}, {high:.3f}]"
        p_met = "" if cell["p_met"] is None else f"p_met {cell['p_met']:.2f}"
        low, high = cell["predictive"]
        predictive = "" if low is None else f"next [{low:.3f}, {high:.3f}]"
        print(
            f"{cell['engine']:9s} {cell['arm']:9s} {cell['metric']:10s} {rate:4s} "
            f"n {cell['n']:2d}  gmean {gmean:5s} {interval:17s} {predictive:22s} "
            f"met {cell['met']:2d}/{cell['n']:<2d} {p_met:11s} {cell['verdict']}"
            + (f"  no ratio: {', '.join(cell['no_ratio'])}" if cell["no_ratio"] else "")
        )
    print()
    print(f"checks by verdict: {result['verdicts']}")
    print(
        f"measurements that met every check: {result['all_met']} of {result['checking']} "
        "that checked any; "
        f"the product of the checks' p_met: {result['p_all_independent']}"
    )
    if args.held_out is not None:
        rows, noisy = measurement_rows(args.held_out, args.max_noise)
        against = held_out(result, rows, keeps_pace=args.keeps_pace)
        result["held_out"] = {"csv": str(args.held_out), "left_out": noisy, **against}
        print()
        gone = f"  (left out: {', '.join(noisy)})" if noisy else ""
        print(f"held out: {args.held_out}{gone}")
        for check in against["checks"]:
            rate = "" if check["rate"] is None else f"{check['rate']:4.1f}"
            low, high = check["predictive"]
            ratio = "none" if check["ratio"] is None else f"{check['ratio']:.3f}"
            where = "no interval" if check["inside"] is None else f"[{low:.3f}, {high:.3f}]"
            flag = ("" if check["inside"] is not False else "  OUTSIDE") + (
                "" if check["met"] else "  (goal missed)"
            )
            print(
                f"{check['engine']:9s} {check['arm']:9s} {check['metric']:10s} {rate:4s} "
                f"{ratio:>6s} {where}{flag}"
            )
        print(
            f"{against['inside']} of {against['judged']} checks inside their "
            f"{against['level']:.0%} predictive intervals ({against['no_interval']} without one)"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
