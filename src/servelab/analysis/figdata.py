"""The numbers each figure shows, as plain dictionaries (no matplotlib).

`figures.py` draws exactly these dictionaries and `numbers.py` writes them into numbers.json, so
a number in a figure is always a number in numbers.json. Series are keyed `"{arm}/{engine}"`;
points carry the condition id, its x value, the geometric mean, its 95% interval and n.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np

from servelab.analysis import stats
from servelab.analysis.restarts import RESTART_PHASES
from servelab.analysis.runs import condition_value
from servelab.analysis.summary import Analysis, table5_keys

__all__ = ["FIGURES", "FIGURE_DATA", "FORMATS", "figure_data"]

# The files each figure is drawn to (here, not in figures.py, so choosing them imports no matplotlib)
FORMATS = ("png", "pdf")

ARMS = ("defaults", "matched")
ECDF_POINTS = 400  # quantile grid drawn for each empirical distribution


def _point(an: Analysis, arm: str, engine: str, condition: str, metric: str) -> dict[str, Any]:
    g = an.group(arm, engine, condition)
    s = g.summaries[metric]
    return {
        "condition": condition,
        "x": condition_value(condition)[1],
        "gmean": s.gmean,
        "ci_low": s.ci_low,
        "ci_high": s.ci_high,
        "n": s.n,
    }


def _sweep_series(
    an: Analysis, sweep: str, metric: str, arms: tuple[str, ...] = ARMS
) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for arm in arms:
        for engine in an.engines:
            pts = [
                _point(an, arm, engine, c, metric)
                for c in an.sweep_conditions(arm, sweep)
                if an.has_group(arm, engine, c)
            ]
            if pts:
                out[f"{arm}/{engine}"] = pts
    return out


def _holm(an: Analysis, scope: str, condition: str, metric: str) -> dict[str, Any]:
    """A starred test's Holm-adjusted p-value, only under `analysis.multiplicity: holm` (with
    none, the figures' data and numbers.json are the study's, unchanged)."""
    return {"p_holm": an.star_p(scope, condition, metric)} if an.multiplicity == "holm" else {}


def _rule(an: Analysis) -> dict[str, Any]:
    """The figure's star rule, named in its data only when it is not the study's (none)."""
    return {"multiplicity": an.multiplicity} if an.multiplicity != "none" else {}


def _gap_point(an: Analysis, arm: str, condition: str, metric: str) -> dict[str, Any]:
    g = an.gap(arm, condition, metric).gap
    return {
        "condition": condition,
        "x": condition_value(condition)[1],
        "gap": g.gap,
        "ci_low": g.ci_low,
        "ci_high": g.ci_high,
        "p": g.p,
        "significant": an.significant(arm, condition, metric),
        "n": g.n,
        **_holm(an, arm, condition, metric),
    }


def figure1(an: Analysis) -> dict[str, Any]:
    """Decomposition: Table 5's gaps, defaults against matched, with φ; for one engine, Table 5's
    arm effect (matched ÷ defaults) at the same conditions."""
    rows: list[dict[str, Any]] = []
    if len(an.engines) == 1:
        for row in an.arm_effect_rows(table5_keys(an.table_conditions)):
            rows.append(
                {
                    "condition": row["condition"],
                    "metric": row["metric"],
                    "change": {
                        "gap": row["change"],
                        "ci_low": row["ci_low"],
                        "ci_high": row["ci_high"],
                        "p": row["p"],
                        "significant": an.significant(
                            "arm_effect", str(row["condition"]), str(row["metric"])
                        ),
                        "n": row["n"],
                        **_holm(an, "arm_effect", str(row["condition"]), str(row["metric"])),
                    },
                }
            )
        return {"mode": "arm_effect", "engines": list(an.engines), "rows": rows, **_rule(an)}
    keys = table5_keys(an.table_conditions) if len(an.engines) == 2 else ()
    for row in an.table5_rows(keys):
        condition, metric = str(row["condition"]), str(row["metric"])
        d = an.gap("defaults", condition, metric).gap
        m = an.gap("matched", condition, metric).gap
        rows.append(
            {
                "condition": row["condition"],
                "metric": row["metric"],
                "defaults": {
                    "gap": d.gap,
                    "ci_low": d.ci_low,
                    "ci_high": d.ci_high,
                    "p": d.p,
                    "significant": an.significant("defaults", condition, metric),
                    "n": d.n,
                    **_holm(an, "defaults", condition, metric),
                },
                "matched": {
                    "gap": m.gap,
                    "ci_low": m.ci_low,
                    "ci_high": m.ci_high,
                    "p": m.p,
                    "significant": an.significant("matched", condition, metric),
                    "n": m.n,
                    **_holm(an, "matched", condition, metric),
                },
                "removed_fraction": row["removed_fraction"],
            }
        )
    return {
        "mode": "gap",
        "engines": list(an.engines),
        "rows": rows,
        "phi_guard": an.phi_guard,
        **_rule(an),
    }


def figure6(an: Analysis) -> dict[str, Any]:
    """TTFT p50 and p95 against arrival rate (rate sweep), both arms."""
    return {
        "ttft_p50": _sweep_series(an, "rate", "ttft_p50"),
        "ttft_p95": _sweep_series(an, "rate", "ttft_p95"),
    }


def figure7(an: Analysis) -> dict[str, Any]:
    """Median TPOT against rate; achieved against offered load with keeps-pace per repetition."""
    tpot = _sweep_series(an, "rate", "tpot_p50")
    load: dict[str, list[dict[str, Any]]] = {}
    for arm in ARMS:
        for engine in an.engines:
            pts = []
            for c in an.sweep_conditions(arm, "rate"):
                if not an.has_group(arm, engine, c):
                    continue
                g = an.group(arm, engine, c)
                p = _point(an, arm, engine, c, "throughput")
                p["offered"] = g.offered
                p["keeps_pace_reps"] = int(sum(g.keeps_pace))
                pts.append(p)
            if pts:
                load[f"{arm}/{engine}"] = pts
    return {"tpot_p50": tpot, "throughput": load, "keeps_pace": an.keeps_pace}


def figure8(an: Analysis) -> dict[str, Any]:
    """Fluid queue model: (a) predicted against measured vLLM p50; (b) gap against δ for T/2, T, 2T."""
    runs = [
        {
            "arm": f.arm,
            "condition": f.condition,
            "rep": f.rep,
            "delta": f.delta,
            "run_length_s": f.run_length_s,
            "w50_s": f.w50_s,
            "sglang_p50": f.sglang_p50,
            "vllm_p50": f.vllm_p50,
            "predicted_vllm_p50": f.predicted_vllm_p50,
        }
        for f in an.fluid_runs
        if f.eligible
    ]
    summary = an.fluid_summary
    ref = dict(cast("dict[str, Any]", summary["reference"]))
    curves = []
    baseline = float(ref["baseline_p50_s"])
    if np.isfinite(baseline) and ref["run_lengths_s"]:
        d_meas = float(ref["measured_delta"])
        d_max = max(0.10, 1.25 * d_meas) if np.isfinite(d_meas) else 0.10
        for length in ref["run_lengths_s"]:
            curves.append(
                {
                    "run_length_s": length,
                    "delta_max": d_max,
                    "gap_at_measured_delta": (
                        stats.fluid_predicted_gap(d_meas, length, baseline)
                        if np.isfinite(d_meas)
                        else float("nan")
                    ),
                }
            )
    return {
        "eligible_runs": runs,
        "r_log": summary["r_log"],
        "overprediction": summary["overprediction"],
        "by_condition": summary["by_condition"],
        "reference": ref,
        "curves": curves,
    }


def figure9(an: Analysis) -> dict[str, Any]:
    """Sharing sweep (defaults): p50 TTFT per engine and the paired gap."""
    return {
        "ttft_p50": _sweep_series(an, "sharing", "ttft_p50", ("defaults",)),
        "gap": [
            _gap_point(an, "defaults", c, "ttft_p50")
            for c in an.sweep_conditions("defaults", "sharing")
            if c in an.paired_conditions("defaults")
        ],
        **_rule(an),
    }


def figure10(an: Analysis) -> dict[str, Any]:
    """Peak KV-cache utilisation against σ (defaults): arithmetic means and each repetition."""
    out: dict[str, list[dict[str, Any]]] = {}
    for engine in an.engines:
        pts = []
        for c in an.sweep_conditions("defaults", "sharing"):
            if not an.has_group("defaults", engine, c):
                continue
            g = an.group("defaults", engine, c)
            kv = [k for k in g.kv_peak if np.isfinite(k)]
            pts.append(
                {
                    "condition": c,
                    "x": condition_value(c)[1],
                    "mean": g.kv_peak_mean,
                    "reps": kv,
                    "n": len(kv),
                }
            )
        if pts:
            out[f"defaults/{engine}"] = pts
    return {"kv_peak": out}


def figure11(an: Analysis) -> dict[str, Any]:
    """Empirical TTFT distributions pooled over repetitions, at the campaign's table conditions
    (the study's: rate-0.12, rate-0.28, length-8192)."""
    panels = []
    for condition in an.table_conditions:
        series = {}
        for arm in ARMS:
            for engine in an.engines:
                if not an.has_group(arm, engine, condition):
                    continue
                g = an.group(arm, engine, condition)
                t = g.pooled_ttft[np.isfinite(g.pooled_ttft)]
                q = np.linspace(0.0, 100.0, ECDF_POINTS)
                series[f"{arm}/{engine}"] = {
                    "n_requests": int(t.size),
                    "n_reps": g.n,
                    "p50": g.pooled["p50"],
                    "p95": g.pooled["p95"],
                    "quantiles": [float(v) for v in np.percentile(t, q)] if t.size else [],
                }
        panels.append({"condition": condition, "series": series})
    return {"panels": panels, "ecdf_points": ECDF_POINTS}


def figure12(an: Analysis) -> dict[str, Any]:
    """Variability against rate: (a) pooled tail ratio; (b) sd of ln p50 across repetitions."""
    tail: dict[str, list[dict[str, Any]]] = {}
    spread: dict[str, list[dict[str, Any]]] = {}
    for arm in ARMS:
        for engine in an.engines:
            conds = [c for c in an.sweep_conditions(arm, "rate") if an.has_group(arm, engine, c)]
            if not conds:
                continue
            key = f"{arm}/{engine}"
            tail[key] = []
            spread[key] = []
            for c in conds:
                g = an.group(arm, engine, c)
                x = condition_value(c)[1]
                tail[key].append(
                    {"condition": c, "x": x, "tail_ratio": g.pooled["tail_ratio"], "n_reps": g.n}
                )
                spread[key].append(
                    {"condition": c, "x": x, "sd_ln_p50": g.summaries["ttft_p50"].sd_log, "n": g.n}
                )
    return {"tail_ratio": tail, "sd_ln_p50": spread}


def figure13(an: Analysis) -> dict[str, Any]:
    """Paired gap in median and p95 TTFT across the rate sweep, vendor defaults."""
    conds = [
        c for c in an.sweep_conditions("defaults", "rate") if c in an.paired_conditions("defaults")
    ]
    out: dict[str, Any] = {
        m: [_gap_point(an, "defaults", c, m) for c in conds] for m in ("ttft_p50", "ttft_p95")
    }
    return {**out, **_rule(an)}


def figure14(an: Analysis) -> dict[str, Any]:
    """Restart time by phase (mean of repetitions); empty when there are no restart records."""
    return {"phases": list(RESTART_PHASES), "engines": an.restart_summary}


FIGURE_DATA: dict[str, Callable[[Analysis], dict[str, Any]]] = {
    "figure1": figure1,
    "figure6": figure6,
    "figure7": figure7,
    "figure8": figure8,
    "figure9": figure9,
    "figure10": figure10,
    "figure11": figure11,
    "figure12": figure12,
    "figure13": figure13,
    "figure14": figure14,
}
FIGURES = tuple(FIGURE_DATA)


def figure_data(an: Analysis) -> dict[str, dict[str, Any]]:
    return {name: fn(an) for name, fn in FIGURE_DATA.items()}
