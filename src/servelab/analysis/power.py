"""How many repetitions a campaign needs: the power of its own paired test, from its own spread.

`servelab campaign power --metric ttft_p50 --effect 1.25` reads a finished campaign's runs (the
analysis' loader, `load_runs`: artifacts only) and, for every seed-paired condition of each arm,
takes the test the analysis runs there (`Analysis.gap`, or a one-engine campaign's
`Analysis.arm_effect`: `stats.paired_gap`, a two-sided one-sample t-test on d_k = ln R_k over the
n paired repetitions). From the sample sd s of those d_k it computes, with
`stats.paired_power` (the noncentral t of `scipy.stats.nct`, df = n − 1, noncentrality
|ln effect| · √n / s):

- `n_required`: the fewest repetitions whose power to detect a true gap of `effect` reaches the
  target power (`stats.paired_sample_size`);
- `power_at_n`: the power the campaign had, with its own n, to detect that gap.

The effect is the ratio the question is about, not the one observed: power computed at the
observed gap ("observed power") is a function of the p-value and says nothing new. The sd is an
estimate from n repetitions itself; `sd_interval` gives its 95% interval (χ² with n − 1 degrees of
freedom), so a reader can see how far the answer could move.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as sps

from servelab.analysis import stats
from servelab.analysis.runs import discover_run_dirs, load_runs
from servelab.analysis.summary import LATENCY_METRICS, METRICS, Analysis
from servelab.grid.settings import AnalysisSettings

__all__ = [
    "POWER_COLUMNS",
    "PowerError",
    "PowerRow",
    "campaign_power",
    "format_power",
    "power_csv",
    "results_power",
    "sd_interval",
]

PathLike = str | os.PathLike[str]
MAX_N = 1_000_000  # beyond this many repetitions the answer is "more than", not a number


class PowerError(ValueError):
    """The power cannot be computed: a bad argument, or missing data (the message names them)."""


@dataclass(frozen=True)
class PowerRow:
    """One test of the campaign: its spread and the repetitions its power needs."""

    scope: str  # the arm of an engine gap; "arm_effect" for a one-engine campaign
    condition: str
    pair: str  # the ratio tested, numerator first ("vllm ÷ sglang", "matched ÷ defaults")
    metric: str
    n: int  # paired repetitions the campaign has
    reps: tuple[str, ...]
    gap: float  # the geometric mean of the ratios observed (context only)
    sd_log: float  # sample sd (ddof 1) of ln R_k over the n repetitions
    effect: float
    alpha: float
    target_power: float
    n_required: int | None  # None: more than MAX_N
    power_at_n: float
    # the repetitions needed if the true sd is the upper end of its 95% interval (sd_interval)
    n_required_sd_high: int | None


def sd_interval(sd_log: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The `level` interval of the true sd from a sample sd of n values (χ², n − 1 df)."""
    if n < 2 or not math.isfinite(sd_log):
        return (math.nan, math.nan)
    df = n - 1
    hi_q = float(sps.chi2.ppf(0.5 + level / 2.0, df))
    lo_q = float(sps.chi2.ppf(0.5 - level / 2.0, df))
    return (sd_log * math.sqrt(df / hi_q), sd_log * math.sqrt(df / lo_q))


def _check_arguments(metric: str, effect: float, power: float, alpha: float) -> None:
    if metric not in METRICS:
        raise PowerError(
            f"--metric {metric!r}: not a run metric the campaign's paired tests use; "
            f"choose from {', '.join(METRICS)}"
        )
    if not (math.isfinite(effect) and effect > 0 and effect != 1):
        raise PowerError(
            f"--effect {effect}: the gap to detect is a ratio other than 1 (1.25: 25% apart)"
        )
    if not 0 < power < 1:
        raise PowerError(f"--power {power}: the target power is a probability in (0, 1)")
    if not 0 < alpha < 1:
        raise PowerError(f"--alpha {alpha}: the test's level is a probability in (0, 1)")


def _tests(an: Analysis, metric: str) -> list[tuple[str, str, str, stats.PairedGap]]:
    """(scope, condition, pair, test) of `metric` at every paired condition, in table order."""
    if len(an.engines) == 1:
        engine = an.engines[0]
        return [
            (
                "arm_effect",
                c,
                f"{engine}: matched ÷ defaults",
                an.arm_effect(c, metric),
            )
            for c in an.runset.conditions()
            if an.runset.arm_pairs(engine, c)
        ]
    first, second = an.engine_pair
    pair = f"{first} ÷ {second}" if metric in LATENCY_METRICS else f"{second} ÷ {first}"
    return [
        (arm, c, pair, an.gap(arm, c, metric).gap)
        for arm in an.arms()
        for c in an.paired_conditions(arm)
    ]


def campaign_power(
    an: Analysis,
    metric: str,
    effect: float,
    *,
    power: float = 0.8,
    alpha: float = 0.05,
    conditions: Sequence[str] | None = None,
) -> list[PowerRow]:
    """Per seed-paired (arm, condition): the spread of the campaign's test of `metric`, the
    repetitions that give `power` to detect a true ratio `effect` at level `alpha`, and the power
    at the campaign's own n. `conditions` restricts the rows (None: every paired condition).

    PowerError when an argument is out of range, when no condition is paired, when a condition
    asked for is not among the paired ones, or when a condition has fewer than two repetitions
    with a value of `metric` (a spread needs two); the message names the metric and conditions.
    """
    _check_arguments(metric, effect, power, alpha)
    if not an.runset.runs:
        raise PowerError(
            f"no measured run among the {an.runset.found} found: nothing to take a spread from"
        )
    found = _tests(an, metric)
    if not found:
        raise PowerError(
            "no seed-paired condition: the spread is that of paired repetitions "
            + (
                "(one engine measured in both arms)"
                if len(an.engines) == 1
                else f"(both of {', '.join(an.engines)} in the same arm and repetition)"
            )
        )
    if conditions:
        available = sorted({c for _, c, _, _ in found})
        unknown = [c for c in conditions if c not in available]
        if unknown:
            raise PowerError(
                f"--condition {', '.join(unknown)}: no seed-paired runs of it in this campaign; "
                f"paired conditions: {', '.join(available)}"
            )
        found = [t for t in found if t[1] in conditions]
    short = [
        f"{scope}/{condition} ({test.n} with a {metric}: {', '.join(test.reps) or 'none'})"
        for scope, condition, _, test in found
        if test.n < 2
    ]
    if short:
        raise PowerError(
            f"{metric}: fewer than two paired repetitions at {'; '.join(short)}; a spread needs "
            "two (leave the condition out with --condition, or measure more repetitions)"
        )
    rows = []
    for scope, condition, pair, test in found:
        sd = float(np.std(np.log(test.ratios), ddof=1))
        rows.append(
            PowerRow(
                scope=scope,
                condition=condition,
                pair=pair,
                metric=metric,
                n=test.n,
                reps=test.reps,
                gap=test.gap,
                sd_log=sd,
                effect=effect,
                alpha=alpha,
                target_power=power,
                n_required=stats.paired_sample_size(sd, effect, power, alpha, max_n=MAX_N),
                power_at_n=stats.paired_power(test.n, sd, effect, alpha),
                n_required_sd_high=stats.paired_sample_size(
                    sd_interval(sd, test.n)[1], effect, power, alpha, max_n=MAX_N
                ),
            )
        )
    return rows


def results_power(
    results: PathLike,
    metric: str,
    effect: float,
    *,
    settings: AnalysisSettings | None = None,
    power: float = 0.8,
    alpha: float = 0.05,
    conditions: Sequence[str] | None = None,
) -> list[PowerRow]:
    """`campaign_power` of the runs under `{results}/runs`, read as the analysis reads them
    (`settings`: the campaign's config `analysis:` and engines; None: the defaults)."""
    _check_arguments(metric, effect, power, alpha)
    settings = AnalysisSettings() if settings is None else settings
    runs_root = Path(results) / "runs"
    run_dirs = discover_run_dirs(runs_root)
    if not run_dirs:
        raise PowerError(f"{runs_root}: no run (no run.json under {{arm}}/{{engine}}/...)")
    runset = load_runs(run_dirs, exclude_first_graph=settings.exclude_first_graph, telemetry=False)
    an = Analysis(runset, settings=settings)
    return campaign_power(an, metric, effect, power=power, alpha=alpha, conditions=conditions)


# ------------------------------------------------------------------------------------ output

POWER_COLUMNS = (
    "scope",
    "condition",
    "pair",
    "metric",
    "n",
    "reps",
    "gap",
    "sd_log",
    "sd_log_ci_low",
    "sd_log_ci_high",
    "effect",
    "alpha",
    "target_power",
    "n_required",
    "power_at_n",
    "n_required_sd_high",
)


def _g(value: float, digits: int = 4) -> str:
    return "" if not math.isfinite(value) else f"{value:.{digits}g}"


def power_csv(rows: Sequence[PowerRow]) -> str:
    """The rows as CSV (`POWER_COLUMNS`, `\\n` line ends, fixed formats: byte-identical on re-run);
    `n_required` is empty when more than MAX_N repetitions would be needed."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(POWER_COLUMNS)
    for r in rows:
        lo, hi = sd_interval(r.sd_log, r.n)
        writer.writerow(
            [
                r.scope,
                r.condition,
                r.pair,
                r.metric,
                r.n,
                " ".join(r.reps),
                _g(r.gap, 5),
                _g(r.sd_log, 5),
                _g(lo, 5),
                _g(hi, 5),
                _g(r.effect, 6),
                _g(r.alpha, 6),
                _g(r.target_power, 6),
                "" if r.n_required is None else r.n_required,
                f"{r.power_at_n:.4f}",
                "" if r.n_required_sd_high is None else r.n_required_sd_high,
            ]
        )
    return buf.getvalue()


def _count(n: int | None) -> str:
    return f">{MAX_N}" if n is None else str(n)


def format_power(rows: Sequence[PowerRow]) -> str:
    """The rows as a text table with a header and notes saying what was computed and how."""
    if not rows:
        return "no paired condition\n"
    first = rows[0]
    metric, effect, power, alpha = first.metric, first.effect, first.target_power, first.alpha
    target = f"n for {power:.0%}"
    header = ("arm", "condition", "pair", "n", "gap", "sd ln R", target, "power at n", "sd high")
    body = [
        (
            r.scope,
            r.condition,
            r.pair,
            str(r.n),
            _g(r.gap, 3),
            _g(r.sd_log, 3),
            _count(r.n_required),
            f"{r.power_at_n:.3f}",
            _count(r.n_required_sd_high),
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    left = {0, 1, 2}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    factors = []
    for n in sorted({r.n for r in rows}):
        lo, hi = sd_interval(1.0, n)
        factors.append(f"n = {n}: {lo:.2f} to {hi:.2f} times the sd")
    lines = [
        f"Power of the campaign's paired test of {metric} to detect a true ratio of {effect:g}",
        f"(two-sided, alpha = {alpha:g}), from the spread of its seed-paired repetitions.",
        "",
        line(header),
        "  ".join("-" * w for w in widths),
        *(line(b) for b in body),
        "",
        "gap: geometric mean of the paired ratios observed (context only; the power is for the",
        f"  ratio {effect:g}). sd ln R: sample sd (ddof 1) of the log ratios the t-test runs on.",
        f"{target}: the fewest repetitions whose power reaches {power:g} with that sd. power at n:",
        "  with the campaign's n. Noncentral t (scipy.stats.nct), df n - 1, noncentrality",
        f"  |ln {effect:g}| * sqrt(n) / sd.",
        "sd high: the repetitions needed if the true sd is the top of its 95% interval (chi-square,",
        "  n - 1 df): " + "; ".join(factors) + ".",
    ]
    return "\n".join(lines) + "\n"
