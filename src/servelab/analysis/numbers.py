"""numbers.json (every number the tables and figures show, keyed) and the analysis notes file.

Floats are rounded to 10 significant digits, NaN becomes null, keys are sorted on writing
(`artifacts.write_json`), so the file is byte-identical across analyses of the same runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from servelab.analysis import figdata, stats
from servelab.analysis.summary import METRICS, Analysis

__all__ = ["NUMBERS_FORMAT", "build_numbers", "clean", "render_notes"]

NUMBERS_FORMAT = "servelab-analysis-numbers/1"


def clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf -> None, numpy scalars -> Python, floats to 10 significant digits."""
    if isinstance(obj, Mapping):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [clean(v) for v in obj.tolist()]
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        x = float(obj)
        if not math.isfinite(x):
            return None
        return float(f"{x:.10g}")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return clean(dataclasses.asdict(obj))
    return obj


def _run_entry(an: Analysis, run_id: str) -> dict[str, Any]:
    r = an.runset.runs[run_id]
    m = r.metrics
    return {
        "arm": r.arm,
        "engine": r.engine,
        "condition": r.condition,
        "rep": r.rep,
        "seed": r.seed,
        "backend": r.backend,
        "resolved_config": dict(r.resolved_config),
        "offered_load_rps": r.offered_load,
        "throughput_rps": m.throughput,
        "keeps_pace": stats.keeps_pace(m.throughput, r.offered_load, an.keeps_pace),
        "window_s": m.window_s,
        "ttft_p50_s": m.ttft_p50,
        "ttft_p95_s": m.ttft_p95,
        "tpot_p50_s": m.tpot_p50,
        "e2e_p50_s": m.e2e_p50,
        "n_requests": m.n_requests,
        "n_measured": m.n_measured,
        "n_measured_success": m.n_measured_success,
        "n_latency_sample": m.n_sample,
        "n_ok": m.n_ok,
        "role_counts": m.role_counts,
        "lag_median_s": m.lag_median,
        "lag_max_s": m.lag_max,
        "kv_peak": r.kv_peak,
        "preemptions": r.preemptions,
    }


def _group_entry(an: Analysis, arm: str, engine: str, condition: str) -> dict[str, Any]:
    g = an.group(arm, engine, condition)
    return {
        "n": g.n,
        "reps": list(g.reps),
        "values": {m: list(v) for m, v in g.values.items()},
        "geomean": {m: dataclasses.asdict(s) for m, s in g.summaries.items()},
        "offered_load_rps": g.offered,
        "keeps_pace": list(g.keeps_pace),
        "kv_peak": list(g.kv_peak),
        "kv_peak_mean": g.kv_peak_mean,
        "preemptions": list(g.preemptions),
        "pooled_ttft": g.pooled,
        "ttft_by_role": g.roles,
        "sd_ln_ttft_p50": g.summaries["ttft_p50"].sd_log,
        "sd_ln_tpot_p50": g.summaries["tpot_p50"].sd_log,
    }


def _gap_entry(an: Analysis, arm: str, condition: str, metric: str) -> dict[str, Any]:
    res = an.gap(arm, condition, metric)
    g = res.gap
    return {
        "gap": g.gap,
        "ci_low": g.ci_low,
        "ci_high": g.ci_high,
        "p": g.p,
        "significant": an.significant(arm, condition, metric),  # under analysis.multiplicity
        "n": g.n,
        "reps": list(g.reps),
        "ratios": list(g.ratios),
        "expected_reps": list(res.expected_reps),
        "vllm_geomean": res.vllm.gmean,
        "sglang_geomean": res.sglang.gmean,
        **({"p_holm": an.star_p(arm, condition, metric)} if an.multiplicity == "holm" else {}),
    }


def multiplicity_entry(an: Analysis) -> dict[str, Any]:
    """How the campaign's p-values were adjusted (only written when they were: with the
    default, none, numbers.json is the study's, unchanged)."""
    return {
        "rule": an.multiplicity,
        "reference": "Holm (1979), Scand. J. Statist. 6: 65-70",
        "family": (
            "every paired test the analysis runs: "
            + (
                "the arm effect of each metric at each condition measured in both arms"
                if len(an.engines) == 1
                else "the engine gap of each metric at each seed-paired condition of each arm"
            )
        ),
        "metrics": list(METRICS),
        "tests": an.family_size,
        "stars": "adjusted p < 0.05 (*), < 0.01 (**), < 0.001 (***)",
    }


def build_numbers(an: Analysis) -> dict[str, Any]:
    """Every number of the tables and figures plus the run-level values behind them."""
    rs = an.runset
    groups = {}
    for arm in an.arms():
        for condition in rs.conditions(arm):
            for engine in an.engines:
                if an.has_group(arm, engine, condition):
                    groups[f"{arm}/{engine}/{condition}"] = _group_entry(an, arm, engine, condition)
    gaps = {
        f"{arm}/{condition}/{metric}": _gap_entry(an, arm, condition, metric)
        for arm in an.arms()
        for condition in an.paired_conditions(arm)
        for metric in METRICS
    }
    tables = {
        "table3": an.table3_rows(),
        "table4": an.table4_rows(),
        "table5": an.table5_rows(),
        "table6": an.table6_rows(),
    }
    figures = figdata.figure_data(an)
    runs = list(rs.runs.values())
    role_totals = {
        role: sum(r.metrics.role_counts[role] for r in runs)
        for role in ("planner", "worker", "aggregator")
    }
    lag_medians = [r.metrics.lag_median for r in runs if math.isfinite(r.metrics.lag_median)]
    lag_max = [r.metrics.lag_max for r in runs if math.isfinite(r.metrics.lag_max)]
    numbers = {
        "format": NUMBERS_FORMAT,
        # the campaign's engines in gap order: latency gaps are the first ÷ the second
        "engines": list(an.engines),
        "parameters": {
            "keeps_pace": an.keeps_pace,
            "phi_guard": an.phi_guard,
            "exclude_first_graph": rs.exclude_first_graph,
            "fluid_shortfall": an.fluid_shortfall,
            "fluid_reference": list(an.fluid_reference),
            "percentiles": "numpy linear interpolation",
            "g1": "scipy.stats.skew(ln TTFT, bias=True)",
            "ci": "exp(mean ln x ± t_{0.975,n-1} s/sqrt(n)), s with ddof=1",
        },
        "runs": {
            "found": rs.found,
            "parsed": rs.parsed,
            "skipped": len(rs.skipped),
            "backend": rs.backend,
            "skipped_runs": [dataclasses.asdict(s) for s in rs.skipped],
        },
        "run_metrics": {rid: _run_entry(an, rid) for rid in rs.runs},
        "groups": groups,
        "gaps": gaps,
        "tables": tables,
        "fluid_model": {"pairs": list(an.fluid_runs), "summary": an.fluid_summary},
        "restarts": an.restart_summary,
        "workload": {
            "measured_by_role": role_totals,
            "lag_median_of_run_medians_s": float(np.median(lag_medians)) if lag_medians else None,
            "lag_max_s": max(lag_max) if lag_max else None,
        },
        "figures": figures,
    }
    if an.multiplicity != "none":
        cast("dict[str, Any]", numbers["parameters"])["multiplicity"] = an.multiplicity
        numbers["multiplicity"] = multiplicity_entry(an)
    numbers["notes"] = an.notes()
    return cast("dict[str, Any]", clean(numbers))


def render_notes(an: Analysis) -> str:
    """A plain-text account: runs found/parsed/skipped, skipped runs, cells with missing reps."""
    rs = an.runset
    lines = [
        "servelab analysis notes",
        "",
        rs.summary_line(),
        f"first agent graph excluded: {'yes' if rs.exclude_first_graph else 'no'}",
        "",
        "skipped runs (failed or interrupted; not analysed):",
    ]
    lines += [f"  {s.run_id}: {s.reason}" for s in rs.skipped] or ["  none"]
    lines += ["", "cells computed from fewer repetitions than were found, or left empty:"]
    lines += [f"  {n}" for n in an.notes()] or ["  none"]
    if an.multiplicity == "holm":
        lines += [
            "",
            f"multiple tests: Holm (1979) over the campaign's {an.family_size} paired tests "
            "with a p-value; Table 5's and the figures' stars are read from the adjusted p-values "
            "(table5.csv *_p_holm), the p columns keep each test's own",
        ]
    return "\n".join(lines) + "\n"
