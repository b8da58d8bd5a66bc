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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Check:
    engine: str
    arm: str
    metric: str
    rate: float | None  # None for the saturation rate, a check of the deployment as a whole
    ratio: float | None  # None where a side had no value (a prediction that never saturated)
    met: bool

    @property
    def cell(self) -> tuple[str, str, str, float | None]:
        return (self.engine, self.arm, self.metric, self.rate)


def _checks_of(rows: Sequence[Mapping[str, Any]], keeps_pace: float) -> list[_Check]:
    """One measurement's goal checks, as `goal_summary` counts them, each with its rate."""
    checks: list[_Check] = []
    for series in goal_summary(rows, keeps_pace)["series"]:
        key = (series["engine"], series["arm"])
        rates = {r["condition"]: float(r["rate"]) for r in rows if (r["engine"], r["arm"]) == key}
        for check in series["checks"]:
            rate = rates[check["condition"]]
            checks.append(_Check(*key, check["metric"], rate, check["ratio"], check["met"]))
        saturation = series["saturation_ratio"]
        checks.append(_Check(*key, "saturation", None, saturation, series["saturation_met"]))
    return checks


def pooled_checks(
    measurements: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    keeps_pace: float,
    level: float = 0.95,
) -> dict[str, Any]:
    """Each goal check's ratios over `measurements` (name -> the rows of one measurement's
    sim_vs_real.csv; a deployment left out of a measurement is simply not in its rows). A check
    a measurement made without a ratio is named in the cell's `no_ratio`, and missed."""
    ratios: dict[tuple[str, str, str, float | None], dict[str, float]] = {}
    no_ratio: dict[tuple[str, str, str, float | None], list[str]] = {}
    whole: dict[str, dict[str, int]] = {}
    for name, rows in measurements.items():
        checks = _checks_of(rows, keeps_pace)
        for check in checks:
            if check.ratio is None:
                no_ratio.setdefault(check.cell, []).append(name)
            else:
                ratios.setdefault(check.cell, {})[name] = check.ratio
        whole[name] = {"met": sum(c.met for c in checks), "checked": len(checks)}
    cells: list[dict[str, Any]] = []
    for cell in sorted(set(ratios) | set(no_ratio), key=lambda c: (*c[:3], c[3] or 0.0)):
        engine, arm, metric, rate = cell
        goal = GOALS[metric]
        by_name = ratios.get(cell, {})
        values = list(by_name.values())
        pooled = log_summary(values, level)
        mean_ln = math.log(pooled.gmean) if pooled.n else math.nan
        low, high = _predictive(mean_ln, pooled.sd_log, pooled.n, level)
        cells.append(
            {
                "engine": engine,
                "arm": arm,
                "metric": metric,
                "rate": rate,
                "n": pooled.n,
                "ratios": dict(sorted(by_name.items())),
                "no_ratio": sorted(no_ratio.get(cell, [])),
                "gmean": _round(pooled.gmean),
                "ci": [_round(pooled.ci_low), _round(pooled.ci_high)],
                "sd_ln": _round(pooled.sd_log),
                "predictive": [_round(low), _round(high)],
                "verdict": _band_verdict(pooled.ci_low, pooled.ci_high, goal, pooled.n),
                "met": sum(abs(v - 1) <= goal for v in values),
                "p_met": _round(_p_met(mean_ln, pooled.sd_log, goal)),
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


def held_out(
    pooled: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], *, keeps_pace: float
) -> dict[str, Any]:
    """One more measurement (its sim_vs_real.csv rows, not among the pooled) against the pool:
    each of its goal checks' ratio beside that check's predictive interval. A check the pool has
    no interval for (fewer than two pooled measurements checked it) is counted apart."""
    intervals = {
        (c["engine"], c["arm"], c["metric"], c["rate"]): c["predictive"] for c in pooled["cells"]
    }
    checks: list[dict[str, Any]] = []
    for check in _checks_of(rows, keeps_pace):
        low, high = intervals.get(check.cell, (None, None))
        inside = None
        if low is not None and high is not None:
            # no ratio: one side never saturated or had no value, which no interval holds
            inside = check.ratio is not None and low <= check.ratio <= high
        checks.append(
            {
                "engine": check.engine,
                "arm": check.arm,
                "metric": check.metric,
                "rate": check.rate,
                "ratio": check.ratio,
                "met": check.met,
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


def _round(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None
