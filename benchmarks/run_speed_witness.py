"""Would a loaded run's own single-request passes have told that the machine ran slow? (issue 26;
docs/simulator.md, "Would a run's own passes have told a slow block?").

    .venv/bin/python benchmarks/run_speed_witness.py [DAY ...] [--band 0.10] [--min-passes 20]
        [--json OUT.json]

For each DAY (a tag of the kept files, such as 2026-12-07-twenty-third), the comparison's summary
`docs/benchmarks/data/sim_vs_real-DAY.json`. Its `iterations` hold, per deployment, rate and
repetition, the median gap of the passes that carried one request, real and predicted. Where the
engine ran at its floor's speed, the two agree, whatever the scheduler did around them.

The witness of a block (a deployment at one rate) is the median over its repetitions of the real
gap ÷ the predicted gap, each repetition's from at least `--min-passes` passes on both sides (a
repetition with fewer is left out). Only the light-load blocks are read: the rates with TTFT checks
(up to 90% of capacity), where single-request passes are many. A block is *off* when its witness
lies outside [1/(1+band), 1+band].

Printed: each day's off blocks with their TTFT checks; then, over all days, the TTFT checks by
(off or not) and (met or missed), and Fisher's exact test (scipy) that off blocks miss more often
(one-sided); the share of the misses that lie in off blocks; and the same by block (a block
misses when any of its TTFT checks does). Then, per engine, its blocks' median witness and
Spearman's rank correlation of the witness with each TTFT ratio (a witness over 1 is an engine
slower than predicted, so a ratio under 1 goes with it), and Mann-Whitney's test (scipy,
two-sided) that the two engines' witnesses come from one distribution: the machine's speed would
move both engines alike over the same days. Last, for each day that keeps its floor residuals
(`sim_vs_real_floor_residuals-DAY.json`), each deployment's median witness beside its own floor's
speed against the same fit (observed ÷ predicted gap, the geometric mean over its floor runs):
whether the loaded runs' passes are slower against the fit than the floor's (docs/simulator.md,
"A twenty-fourth measurement" and "A twenty-fifth measurement", prediction 6), with a sign test
per engine; and where the day keeps `sim_vs_real_single_passes-DAY.json`, the same with its
passes made alone in place of the witness. Without DAY, the days made with the bracketing floor
(`measurement_days.py`); each one's summary has `iterations`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from scipy.stats import binomtest, fisher_exact, mannwhitneyu, spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurement_days import BRACKETED_DAYS

DATA = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "data"
TTFT_METRICS = ("ttft_p50", "ttft_p95")
SINGLE = "1"  # the summary's bucket of passes that carried one request


def repetition_witness(
    real: Mapping[str, Any], predicted: Mapping[str, Any], min_passes: int
) -> float | None:
    """One repetition's real ÷ predicted median gap of its single-request passes, or None when
    either side has fewer than `min_passes` of them."""
    real_single, predicted_single = real.get(SINGLE), predicted.get(SINGLE)
    if real_single is None or predicted_single is None:
        return None
    if min(real_single["iterations"], predicted_single["iterations"]) < min_passes:
        return None
    return float(real_single["median_gap_s"]) / float(predicted_single["median_gap_s"])


def block_witness(block: Mapping[str, Any], min_passes: int) -> float | None:
    """The median over a block's repetitions of their witnesses (None when none has one)."""
    if len(block["real"]) != len(block["predicted"]):
        raise ValueError(
            f"a block has {len(block['real'])} real repetitions and "
            f"{len(block['predicted'])} predicted"
        )
    witnesses = [
        witness
        for real, predicted in zip(block["real"], block["predicted"], strict=True)
        if (witness := repetition_witness(real, predicted, min_passes)) is not None
    ]
    return statistics.median(witnesses) if witnesses else None


def is_off(witness: float, band: float) -> bool:
    """Whether a witness lies outside [1/(1+band), 1+band]."""
    return abs(math.log(witness)) > math.log1p(band)


def light_load_blocks(summary: Mapping[str, Any], min_passes: int) -> Iterator[dict[str, Any]]:
    """Each deployment's blocks that have TTFT checks, with their witness and those checks."""
    for series in summary["series"]:
        checks_by_condition: dict[str, list[dict[str, Any]]] = {}
        for check in series["checks"]:
            if check["metric"] in TTFT_METRICS:
                checks_by_condition.setdefault(check["condition"], []).append(check)
        for condition, checks in sorted(checks_by_condition.items()):
            block = series["iterations"].get(condition)
            yield {
                "engine": series["engine"],
                "arm": series["arm"],
                "condition": condition,
                "witness": None if block is None else block_witness(block, min_passes),
                "checks": [
                    {"metric": c["metric"], "ratio": c["ratio"], "met": bool(c["met"])}
                    for c in checks
                ],
            }


def tally(blocks: list[dict[str, Any]], band: float) -> dict[str, Any]:
    """TTFT checks and blocks by (off or not) and (met or missed), and Fisher's exact test."""
    checks = {"off": {"met": 0, "missed": 0}, "on": {"met": 0, "missed": 0}}
    by_block = {"off": {"met": 0, "missed": 0}, "on": {"met": 0, "missed": 0}}
    no_witness = 0
    for block in blocks:
        if block["witness"] is None:
            no_witness += 1
            continue
        side = "off" if is_off(block["witness"], band) else "on"
        for check in block["checks"]:
            checks[side]["met" if check["met"] else "missed"] += 1
        missed = any(not check["met"] for check in block["checks"])
        by_block[side]["missed" if missed else "met"] += 1

    def test(table: dict[str, dict[str, int]]) -> dict[str, Any]:
        rows = [[table[side]["missed"], table[side]["met"]] for side in ("off", "on")]
        odds_ratio, p_value = fisher_exact(rows, alternative="greater")
        misses = table["off"]["missed"] + table["on"]["missed"]
        return {
            "table": table,
            "odds_ratio": round(float(odds_ratio), 4),
            "p_one_sided": round(float(p_value), 6),
            "misses_in_off_blocks": table["off"]["missed"],
            "misses": misses,
        }

    return {"checks": test(checks), "blocks": test(by_block), "blocks_without_witness": no_witness}


def describe(test: Mapping[str, Any]) -> str:
    """One line of a tally's test (`tally`): the misses on either side and Fisher's result."""
    off, on = test["table"]["off"], test["table"]["on"]
    return (
        f"off blocks missed {off['missed']} of {sum(off.values())}, the rest {on['missed']} of "
        f"{sum(on.values())}; odds ratio {test['odds_ratio']}, p (one-sided) "
        f"{test['p_one_sided']}; misses in off blocks {test['misses_in_off_blocks']} of "
        f"{test['misses']}"
    )


def by_engine(blocks: list[dict[str, Any]], band: float) -> dict[str, Any]:
    """Per engine, its blocks' median witness, the witness's rank correlation with each TTFT
    ratio, and its own tally; and whether the engines' witnesses differ (Mann-Whitney,
    two-sided)."""
    engines: dict[str, Any] = {}
    witnesses: dict[str, list[float]] = {}
    for engine in sorted({block["engine"] for block in blocks}):
        own = [b for b in blocks if b["engine"] == engine and b["witness"] is not None]
        witnesses[engine] = [b["witness"] for b in own]
        correlations = {}
        for metric in TTFT_METRICS:
            pairs = [
                (b["witness"], c["ratio"])
                for b in own
                for c in b["checks"]
                if c["metric"] == metric
            ]
            rho, p_value = spearmanr([w for w, _ in pairs], [r for _, r in pairs])
            correlations[metric] = {
                "n": len(pairs),
                "rho": round(float(rho), 4),
                "p": round(float(p_value), 6),
            }
        engines[engine] = {
            "blocks": len(own),
            "median_witness": round(statistics.median(witnesses[engine]), 4),
            "spearman": correlations,
            "tally": tally([b for b in blocks if b["engine"] == engine], band),
        }
    result: dict[str, Any] = {"engines": engines}
    if len(witnesses) == 2:
        first, second = witnesses.values()
        _, p_value = mannwhitneyu(first, second, alternative="two-sided")
        result["mann_whitney_p"] = round(float(p_value), 6)
    return result


def floor_speed(residuals: Mapping[str, Any], engine: str, arm: str) -> float | None:
    """A deployment's floor speed against its fit: the geometric mean over its floor runs of
    observed ÷ predicted median gap (`sim_vs_real_floor_residuals.py` keeps predicted ÷
    observed), or None when it has no run with a gap."""
    ratios = [
        run["gap"]["ratio"]
        for run in residuals["runs"]
        if run["engine"] == engine and run["arm"] == arm and run.get("gap")
    ]
    if not ratios:
        return None
    return math.exp(-statistics.fmean(math.log(r) for r in ratios))


def alone_ratio(single_passes: Mapping[str, Any], engine: str, arm: str) -> float | None:
    """The median over a deployment's light-load blocks of its passes made alone, real ÷
    predicted (`sim_vs_real_single_passes.py`'s `alone` ratio), or None without one."""
    ratios = [
        b["alone"]["ratio"]
        for b in single_passes["blocks"]
        if (b["engine"], b["arm"]) == (engine, arm) and b["alone"]["ratio"] is not None
    ]
    return statistics.median(ratios) if ratios else None


def sign_counts(differences: list[float]) -> dict[str, Any]:
    """How many of `differences` are positive, with the sign test's one-sided p."""
    positive = sum(d > 0 for d in differences)
    test = binomtest(positive, len(differences), 0.5, alternative="greater")
    return {"deployments": len(differences), "positive": positive, "p": round(test.pvalue, 6)}


def against_floor(by_day: Mapping[str, list[dict[str, Any]]], data: Path) -> dict[str, Any]:
    """Per day that keeps its floor residuals (`sim_vs_real_floor_residuals-DAY.json`) and per
    deployment: the median witness of its light-load blocks beside its floor's speed against the
    same fit, and their difference; where the day keeps its single passes
    (`sim_vs_real_single_passes-DAY.json`), the same for its passes made alone. Per engine, how
    many differences are positive, with the sign test's one-sided p (scipy's binomtest)."""
    rows = []
    for day, blocks in by_day.items():
        path = data / f"sim_vs_real_floor_residuals-{day}.json"
        if not path.is_file():
            continue
        residuals = json.loads(path.read_text(encoding="utf-8"))
        singles_path = data / f"sim_vs_real_single_passes-{day}.json"
        singles = (
            json.loads(singles_path.read_text(encoding="utf-8")) if singles_path.is_file() else None
        )
        for engine, arm in sorted({(b["engine"], b["arm"]) for b in blocks}):
            witnesses = [
                b["witness"]
                for b in blocks
                if (b["engine"], b["arm"]) == (engine, arm) and b["witness"] is not None
            ]
            floor = floor_speed(residuals, engine, arm)
            if not witnesses or floor is None:
                continue
            witness = statistics.median(witnesses)
            row = {
                "day": day,
                "engine": engine,
                "arm": arm,
                "witness": round(witness, 4),
                "floor": round(floor, 4),
                "difference": round(witness - floor, 4),
            }
            alone = None if singles is None else alone_ratio(singles, engine, arm)
            if alone is not None:
                row |= {"alone": round(alone, 4), "alone_difference": round(alone - floor, 4)}
            rows.append(row)
    engines: dict[str, Any] = {}
    for engine in sorted({r["engine"] for r in rows}):
        mine = [r for r in rows if r["engine"] == engine]
        engines[engine] = sign_counts([r["difference"] for r in mine])
        alone = [r["alone_difference"] for r in mine if "alone_difference" in r]
        if alone:
            engines[engine]["alone"] = sign_counts(alone) | {
                "median_difference": round(statistics.median(alone), 4)
            }
    return {"rows": rows, "engines": engines}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("days", nargs="*", default=list(BRACKETED_DAYS))
    parser.add_argument("--band", type=float, default=0.10)
    parser.add_argument("--min-passes", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not 0 < args.band < 1:
        raise SystemExit(f"--band {args.band}: not a fraction in (0, 1)")
    by_day: dict[str, list[dict[str, Any]]] = {}
    for day in args.days:
        path = DATA / f"sim_vs_real-{day}.json"
        if not path.is_file():
            raise SystemExit(f"day {day}: no {path}")
        summary = json.loads(path.read_text(encoding="utf-8"))
        if not any("iterations" in series for series in summary["series"]):
            raise SystemExit(f"day {day}: {path} has no `iterations`")
        by_day[day] = list(light_load_blocks(summary, args.min_passes))
    for day, blocks in by_day.items():
        print(f"{day}:")
        for block in blocks:
            witness = block["witness"]
            if witness is not None and not is_off(witness, args.band):
                continue
            checks = "  ".join(
                f"{c['metric']} {c['ratio']:.3f}{'' if c['met'] else ' (missed)'}"
                for c in block["checks"]
            )
            shown = "none" if witness is None else f"{witness:.3f}"
            print(
                f"  {block['engine']:<9} {block['arm']:<9} {block['condition']:<10}"
                f" witness {shown}  {checks}"
            )
    all_blocks = [block for blocks in by_day.values() for block in blocks]
    result = tally(all_blocks, args.band)
    for unit in ("checks", "blocks"):
        print(f"TTFT {unit}: {describe(result[unit])}")
    print(f"light-load blocks without a witness: {result['blocks_without_witness']}")
    engines = by_engine(all_blocks, args.band)
    for engine, entry in engines["engines"].items():
        rhos = "  ".join(
            f"{metric} rho {c['rho']:.3f} (p {c['p']:.4f}, n {c['n']})"
            for metric, c in entry["spearman"].items()
        )
        print(
            f"{engine:<9} {entry['blocks']} blocks, median witness {entry['median_witness']:.3f}; {rhos}"
        )
        print(f"{'':<9} TTFT checks: {describe(entry['tally']['checks'])}")
    if "mann_whitney_p" in engines:
        print(
            f"the engines' witnesses alike (Mann-Whitney, two-sided): p {engines['mann_whitney_p']}"
        )
    floors = against_floor(by_day, DATA)
    if floors["rows"]:
        print("witness against the deployment's own floor (observed ÷ predicted gap):")
        for r in floors["rows"]:
            alone = (
                f"  alone {r['alone']:.3f} ({r['alone_difference']:+.3f})" if "alone" in r else ""
            )
            print(
                f"  {r['day']:<26} {r['engine']:<9} {r['arm']:<9} witness {r['witness']:.3f}"
                f"  floor {r['floor']:.3f}  difference {r['difference']:+.3f}{alone}"
            )
        for engine, e in floors["engines"].items():
            print(
                f"  {engine:<9} witness above its floor in {e['positive']} of {e['deployments']}"
                f" (sign test, one-sided: p {e['p']})"
            )
            if "alone" in e:
                a = e["alone"]
                print(
                    f"  {engine:<9} passes alone above it in {a['positive']} of {a['deployments']}"
                    f" (p {a['p']}), median difference {a['median_difference']:+.3f}"
                )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "band": args.band,
                    "min_passes": args.min_passes,
                    "days": by_day,
                    **result,
                    "by_engine": engines,
                    "against_floor": floors,
                },
                indent=1,
                sort_keys=True,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
