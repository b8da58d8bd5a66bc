"""The model's error apart from the day's: one model's sim-vs-real measurements pooled (issue 26;
docs/simulator.md, "The model's error across measurements").

A single measurement of `results/sim_vs_real.csv` scores the model and the day together: the fit
takes the floor's prices on one day, and the machine's speed moves the loaded runs by a few percent
from run to run. Measured again, with the same scheduler code and fit rule, the day's part changes
and the model's does not. So over several measurements of one model each goal check's ln(predicted
/ real) splits into a mean, the model's own error on that check (its bias), and a spread, the day's.

Per check (engine, arm, metric, rate; and each deployment's saturation rate), over the
measurements where it is a goal check (a TTFT cell only where its rate is at most 90% of that
measurement's real saturation, as `goal_summary` counts it):
- the geometric mean of predicted / real and its t interval (`servelab.analysis.stats.log_summary`);
- `verdict`: `within` when the interval lies inside the goal's band, `outside` when it lies wholly
  outside it (the model misses that check whatever the day), `undecided` otherwise, and
  `one measurement` when only one measured it;
- `p_met`: the share of measurements that would meet it if a measurement's ln ratio were normal
  with that mean and spread (the plug-in estimate), and `met`, how many did.

The product of every check's `p_met` is what the same model would score on the whole goal in one
measurement, were the checks independent (they are not: a slow day moves every check of an engine
one way), printed beside the share of measurements that met all their checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from servelab.analysis.sim_vs_real import GOALS, goal_summary
from servelab.analysis.stats import log_summary

__all__ = ["held_out", "pooled_checks"]


def _band_verdict(low: float, high: float, goal: float, n: int) -> str:
    if n < 2:
        return "one measurement"
    if 1 - goal <= low and high <= 1 + goal:
        return "within"
    if high < 1 - goal or low > 1 + goal:
        return "outside"
    return "undecided"


def _p_met(mean_ln: float, sd_ln: float, goal: float) -> float:
    from scipy.stats import norm  # here, not at the top: a second of import

    if not (math.isfinite(mean_ln) and math.isfinite(sd_ln)):
        return math.nan
    lo, hi = math.log(1 - goal), math.log(1 + goal)
    if sd_ln == 0:
        return float(lo <= mean_ln <= hi)
    return float(norm.cdf((hi - mean_ln) / sd_ln) - norm.cdf((lo - mean_ln) / sd_ln))


def _predictive(logs_mean: float, sd_ln: float, n: int, level: float) -> tuple[float, float]:
    """Where one more measurement's ratio falls with probability `level`, were a measurement's ln
    ratio normal around the model's error: exp(mean ± t s sqrt(1 + 1/n)) (NaN when n < 2)."""
    from scipy.stats import t

    if n < 2 or not math.isfinite(sd_ln):
        return math.nan, math.nan
    half = float(t.ppf(0.5 + level / 2, n - 1)) * sd_ln * math.sqrt(1 + 1 / n)
    return math.exp(logs_mean - half), math.exp(logs_mean + half)


def pooled_checks(
    measurements: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    keeps_pace: float,
    level: float = 0.95,
) -> dict[str, Any]:
    """Each goal check's ratios over `measurements` (name -> the rows of one measurement's
    sim_vs_real.csv; a deployment left out of a measurement is simply not in its rows)."""
    ratios: dict[tuple[str, str, str, float | None], dict[str, float]] = {}
    whole: dict[str, dict[str, int]] = {}
    for name, rows in measurements.items():
        summary = goal_summary(rows, keeps_pace)
        met = checked = 0
        for series in summary["series"]:
            key = (series["engine"], series["arm"])
            rates = {
                r["condition"]: float(r["rate"]) for r in rows if (r["engine"], r["arm"]) == key
            }
            for check in series["checks"]:
                cell = (*key, check["metric"], rates[check["condition"]])
                if check["ratio"] is not None:
                    ratios.setdefault(cell, {})[name] = check["ratio"]
            if series["saturation_ratio"] is not None:
                ratios.setdefault((*key, "saturation", None), {})[name] = series["saturation_ratio"]
            met += series["met"] + series["saturation_met"]
            checked += series["checked"] + 1
        whole[name] = {"met": met, "checked": checked}
    cells: list[dict[str, Any]] = []
    for (engine, arm, metric, rate), by_name in sorted(
        ratios.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3] or 0.0)
    ):
        goal = GOALS[metric]
        values = list(by_name.values())
        pooled = log_summary(values, level)
        low, high = _predictive(math.log(pooled.gmean), pooled.sd_log, pooled.n, level)
        cells.append(
            {
                "engine": engine,
                "arm": arm,
                "metric": metric,
                "rate": rate,
                "n": pooled.n,
                "ratios": dict(sorted(by_name.items())),
                "gmean": round(pooled.gmean, 4),
                "ci": [_round(pooled.ci_low), _round(pooled.ci_high)],
                "sd_ln": _round(pooled.sd_log),
                "predictive": [_round(low), _round(high)],
                "verdict": _band_verdict(pooled.ci_low, pooled.ci_high, goal, pooled.n),
                "met": sum(abs(v - 1) <= goal for v in values),
                "p_met": _round(_p_met(math.log(pooled.gmean), pooled.sd_log, goal)),
            }
        )
    verdicts = [c["verdict"] for c in cells]
    p_all = math.prod(c["p_met"] for c in cells if c["p_met"] is not None)
    return {
        "goals": GOALS,
        "level": level,
        "keeps_pace": keeps_pace,
        "measurements": whole,
        # a measurement whose every deployment was left out checked nothing, and met nothing
        "all_met": sum(0 < w["checked"] == w["met"] for w in whole.values()),
        "checking": sum(w["checked"] > 0 for w in whole.values()),
        "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
        "p_all_independent": _round(p_all),
        "cells": cells,
    }


def _round(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def held_out(
    pooled: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], *, keeps_pace: float
) -> dict[str, Any]:
    """One more measurement (its sim_vs_real.csv rows, not among the pooled) against the pool:
    each of its goal checks' ratio beside that check's predictive interval. A check the pool has
    no interval for (fewer than two pooled measurements checked it) is counted apart."""
    intervals = {
        (c["engine"], c["arm"], c["metric"], c["rate"]): c["predictive"] for c in pooled["cells"]
    }
    summary = goal_summary(rows, keeps_pace)
    checks: list[dict[str, Any]] = []
    for series in summary["series"]:
        key = (series["engine"], series["arm"])
        rates = {r["condition"]: float(r["rate"]) for r in rows if (r["engine"], r["arm"]) == key}
        mine: list[tuple[str, float | None, float | None]] = [
            (c["metric"], rates[c["condition"]], c["ratio"]) for c in series["checks"]
        ]
        mine.append(("saturation", None, series["saturation_ratio"]))
        for metric, rate, ratio in mine:
            low, high = intervals.get((*key, metric, rate), (None, None))
            inside = None
            if low is not None and high is not None:
                # no ratio: one side never saturated or had no value, which no interval holds
                inside = ratio is not None and low <= ratio <= high
            checks.append(
                {
                    "engine": key[0],
                    "arm": key[1],
                    "metric": metric,
                    "rate": rate,
                    "ratio": ratio,
                    "predictive": [low, high],
                    "inside": inside,
                }
            )
    judged = [c for c in checks if c["inside"] is not None]
    return {
        "level": pooled["level"],
        "inside": sum(c["inside"] for c in judged),
        "judged": len(judged),
        "no_interval": len(checks) - len(judged),
        "checks": checks,
    }
