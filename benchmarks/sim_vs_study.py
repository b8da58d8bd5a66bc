"""The sim backend's Tables 4 and 5 beside the study's, with the agreement counts of issue 14.

    .venv/bin/snakemake --cores 1 all -d /tmp/simgrid        # the full grid on the sim backend
    .venv/bin/python benchmarks/sim_vs_study.py --results /tmp/simgrid/results

Reads only analysis outputs (results/table5.csv, table4.csv, numbers.json) and prints markdown
for docs/simulator.md: Table 5 side by side with the study's (its Table 5), the count of gaps
within a factor 2 of the study's and of significance marks (paired p < 0.05) that agree, F2's
removed fractions, F3 (matched vLLM keeping pace at rate 0.28), Table 4 beside the study's, and
the spread of ln median TPOT across repetitions (the study's §7.2: a median of 0.021).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path

# The study's Table 5: (condition, metric) -> (defaults gap, p<0.05, matched gap, p<0.05, φ).
STUDY_TABLE5: dict[tuple[str, str], tuple[float, bool, float, bool, float | None]] = {
    ("rate-0.12", "ttft_p50"): (1.09, False, 0.95, True, None),
    ("rate-0.12", "ttft_p95"): (8.10, True, 2.44, True, 0.57),
    ("rate-0.28", "ttft_p50"): (36.4, True, 12.3, True, 0.30),
    ("rate-0.28", "ttft_p95"): (4.16, True, 1.70, False, 0.63),
    ("length-8192", "ttft_p50"): (64.1, True, 3.94, False, 0.67),
    ("length-8192", "ttft_p95"): (27.0, True, 6.43, True, 0.43),
    ("rate-0.28", "throughput"): (1.22, True, 1.046, False, 0.78),
}
# The study's Table 4: SGLang's change from the first to the second deployment (%, p < 0.05).
STUDY_TABLE4: dict[tuple[str, str], tuple[float, bool]] = {
    ("rate-0.12", "ttft_p50"): (-2.2, False),
    ("rate-0.12", "ttft_p95"): (-5.4, False),
    ("rate-0.12", "e2e_p50"): (-0.8, False),
    ("rate-0.28", "ttft_p50"): (-11.7, True),
    ("rate-0.28", "ttft_p95"): (-6.1, False),
    ("rate-0.28", "e2e_p50"): (-1.8, True),
    ("length-8192", "ttft_p50"): (-2.8, False),
    ("length-8192", "ttft_p95"): (-3.2, True),
    ("length-8192", "e2e_p50"): (-0.5, False),
}
STUDY_TPOT_SPREAD = 0.021  # §7.2: median over all conditions of sd(ln median TPOT), 3 reps


def _rows(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with path.open() as f:
        return {(r["condition"], r["metric"]): r for r in csv.DictReader(f)}


def _float(text: str) -> float:
    return float(text) if text not in ("", "nan") else math.nan


def _star(p: str) -> bool:
    value = _float(p)
    return math.isfinite(value) and value < 0.05


def within_2x(sim: float, study: float) -> bool:
    return math.isfinite(sim) and sim > 0 and abs(math.log(sim / study)) <= math.log(2)


def table5_counts(results: Path) -> dict[str, int]:
    """Gaps within a factor 2 of the study's and significance marks that agree (of all gaps)."""
    rows = _rows(results / "table5.csv")
    within = marks = total = 0
    for (cond, metric), (d, d_star, m, m_star, _) in STUDY_TABLE5.items():
        row = rows[cond, metric]
        for sim, study, s_p, t_star in (
            (_float(row["defaults_gap"]), d, row["defaults_p"], d_star),
            (_float(row["matched_gap"]), m, row["matched_p"], m_star),
        ):
            total += 1
            within += within_2x(sim, study)
            marks += _star(s_p) == t_star
    return {"gaps_within_2x": within, "marks_agree": marks, "gaps": total}


def table5_report(results: Path) -> list[str]:
    rows = _rows(results / "table5.csv")
    out = [
        "| condition, metric | defaults: study | sim | matched: study | sim | φ study | φ sim |",
        "|---|---|---|---|---|---|---|",
    ]
    within = marks = total = 0
    for (cond, metric), (d, d_star, m, m_star, phi) in STUDY_TABLE5.items():
        row = rows[cond, metric]
        sd, sm = _float(row["defaults_gap"]), _float(row["matched_gap"])
        sd_star, sm_star = _star(row["defaults_p"]), _star(row["matched_p"])
        sim_phi = _float(row["removed_fraction"])
        for sim, study, s_star, t_star in ((sd, d, sd_star, d_star), (sm, m, sm_star, m_star)):
            total += 1
            within += within_2x(sim, study)
            marks += s_star == t_star
        out.append(
            f"| {cond}, {metric} | {d:.3g}{'*' if d_star else ''} | {sd:.3g}"
            f"{'*' if sd_star else ''} | {m:.3g}{'*' if m_star else ''} | {sm:.3g}"
            f"{'*' if sm_star else ''} | {'—' if phi is None else f'{phi:.0%}'} | "
            f"{'—' if not math.isfinite(sim_phi) else f'{sim_phi:.0%}'} |"
        )
    out.append("")
    out.append(
        f"gaps within x2 of the study's: {within} of {total}; significance marks that agree: "
        f"{marks} of {total}"
    )
    in_range = [
        (cond, metric)
        for (cond, metric), (*_, phi) in STUDY_TABLE5.items()
        if phi is not None and 0 < _float(rows[cond, metric]["removed_fraction"]) < 1
    ]
    with_phi = sum(1 for *_, phi in STUDY_TABLE5.values() if phi is not None)
    out.append(f"removed fractions strictly between 0 and 100%: {len(in_range)} of {with_phi}")
    return out


def f3_report(results: Path) -> list[str]:
    numbers = json.loads((results / "numbers.json").read_text())
    out = []
    for engine in ("vllm", "sglang"):
        g = numbers["groups"][f"matched/{engine}/rate-0.28"]
        x = g["geomean"]["throughput"]["gmean"]
        out.append(
            f"matched {engine} at rate-0.28: X {x:.3f} req/s of {g['offered_load_rps']:.3f} "
            f"offered ({x / g['offered_load_rps']:.1%}); keeps pace {g['keeps_pace']}"
        )
    return out


def table4_report(results: Path) -> list[str]:
    rows = _rows(results / "table4.csv")
    out = ["| condition, metric | study change | sim change | sim p |", "|---|---|---|---|"]
    computed = 0
    for (cond, metric), (change, star) in STUDY_TABLE4.items():
        row = rows[cond, metric]
        p = _float(row["p"])
        computed += math.isfinite(p)
        out.append(
            f"| {cond}, {metric} | {change:+.1f}%{'*' if star else ''} | "
            f"{_float(row['change_pct']):+.2f}% | {row['p'] or '—'} |"
        )
    sim = [abs(_float(rows[k]["change_pct"])) for k in STUDY_TABLE4]
    out.append("")
    out.append(
        f"|change| sim: {min(sim):.1f} to {max(sim):.1f}% (study 0.5 to 11.7%); "
        f"paired p computed for {computed} of {len(STUDY_TABLE4)}"
    )
    return out


def tpot_spread_report(results: Path) -> list[str]:
    numbers = json.loads((results / "numbers.json").read_text())
    spreads = [
        g["sd_ln_tpot_p50"]
        for g in numbers["groups"].values()
        if g["sd_ln_tpot_p50"] is not None and math.isfinite(g["sd_ln_tpot_p50"])
    ]
    median = statistics.median(spreads)
    return [
        f"spread of ln median TPOT across repetitions: median {median:.4f} over {len(spreads)} "
        f"(arm, engine, condition) groups, max {max(spreads):.4f} "
        f"(study: median {STUDY_TPOT_SPREAD}, never above 0.09); within x2: "
        f"{STUDY_TPOT_SPREAD / 2 <= median <= STUDY_TPOT_SPREAD * 2}"
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument(
        "--json", action="store_true", help="only Table 5's counts, as JSON (table5.csv suffices)"
    )
    args = ap.parse_args(argv)
    if args.json:
        print(json.dumps(table5_counts(args.results)))
        return 0
    sections = (
        ("Table 5", table5_report),
        ("F3", f3_report),
        ("Table 4", table4_report),
        ("TPOT spread", tpot_spread_report),
    )
    for title, report in sections:
        print(f"### {title}\n")
        print("\n".join(report(args.results)))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
