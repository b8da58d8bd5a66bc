"""The study's statistics (§4, §6.3, §7), as pure functions on numbers.

Every function takes plain floats or arrays and returns plain floats (NaN where a quantity is
undefined), so each one can be checked by hand and against scipy directly.

- Percentiles are numpy's default linear interpolation (`np.percentile(..., method="linear")`).
- Aggregation across repetitions is the geometric mean; its 95% interval is
  exp(mean ln x ± t_{0.975, n−1} · s / √n) with s the sample standard deviation (ddof = 1).
- The paired test is a one-sample t-test on d_k = ln R_k (identical to `scipy.stats.ttest_rel` on the
  two engines' log values, which the unit tests check).
- g1 is `scipy.stats.skew(ln TTFT, bias=True)`: the moment coefficient E[(Y−μ)³]/σ_Y³ of §7.1, with
  population moments (no small-sample correction).
- Power of that paired test (`paired_power`, `paired_sample_size`): the noncentral t distribution
  (`scipy.stats.nct`) with df = n − 1 and noncentrality |ln effect| / (s/√n), two-sided.
- Multiplicity (`holm`): Holm's step-down adjusted p-values over a family of tests.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servelab.grid.settings import AnalysisSettings

__all__ = [
    "LogSummary",
    "PairedGap",
    "counter_increase",
    "fluid_predicted_gap",
    "fluid_wait_p50",
    "geomean",
    "holm",
    "keeps_pace",
    "log_skewness",
    "log_summary",
    "paired_gap",
    "paired_power",
    "paired_sample_size",
    "percentile",
    "removed_fraction",
    "sd_log",
    "t_test_power",
    "tail_ratio",
]

FloatArray = npt.NDArray[np.float64]
NAN = float("nan")


def _finite(values: Sequence[float] | FloatArray) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    return arr[np.isfinite(arr)]


def percentile(values: Sequence[float] | FloatArray, q: float) -> float:
    """Linear-interpolated percentile `q` (0..100) of the finite values; NaN when there are none."""
    arr = _finite(values)
    if arr.size == 0:
        return NAN
    return float(np.percentile(arr, q, method="linear"))


def geomean(values: Sequence[float] | FloatArray) -> float:
    """Geometric mean of positive values; NaN when empty or when any value is not positive."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        return NAN
    return float(np.exp(np.mean(np.log(arr))))


def _t_interval(logs: FloatArray, level: float) -> tuple[float, float, float]:
    """(mean, low, high) of `logs` on the log scale; low/high NaN when n < 2."""
    from scipy import stats as sps  # here, not at the top: a second of import

    n = logs.size
    mean = float(np.mean(logs))
    if n < 2:
        return mean, NAN, NAN
    s = float(np.std(logs, ddof=1))
    half = float(sps.t.ppf(0.5 + level / 2.0, n - 1)) * s / math.sqrt(n)
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class LogSummary:
    """Geometric mean of repetitions with its log-scale confidence interval."""

    n: int
    gmean: float
    ci_low: float
    ci_high: float
    sd_log: float  # sample sd of ln x (ddof = 1); NaN when n < 2


def log_summary(values: Sequence[float] | FloatArray, level: float = 0.95) -> LogSummary:
    """Geometric mean and exp(mean ln x ± t s/√n) of positive values (NaN parts where undefined)."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr) & (arr > 0)]
    if arr.size == 0:
        return LogSummary(0, NAN, NAN, NAN, NAN)
    logs = np.log(arr)
    mean, lo, hi = _t_interval(logs, level)
    sd = float(np.std(logs, ddof=1)) if arr.size >= 2 else NAN
    return LogSummary(int(arr.size), math.exp(mean), math.exp(lo), math.exp(hi), sd)


@dataclass(frozen=True)
class PairedGap:
    """The engine gap over seed-paired repetitions (§4.3, §4.5).

    `ratios[k]` = numerator_k / denominator_k; `gap` their geometric mean; `ci_low`/`ci_high` the 95%
    interval on the log scale; `p` the two-sided paired t-test on ln ratios (NaN when n < 2 or when
    every ratio is exactly 1); `reps` the repetition labels the pairs came from.
    """

    n: int
    gap: float
    ci_low: float
    ci_high: float
    p: float
    ratios: tuple[float, ...]
    reps: tuple[str, ...]

    @property
    def significant(self) -> bool:
        return bool(np.isfinite(self.p) and self.p < 0.05)


def paired_gap(
    numerator: Sequence[float],
    denominator: Sequence[float],
    reps: Sequence[str] | None = None,
    level: float = 0.95,
) -> PairedGap:
    """Paired ratio R_k = numerator_k / denominator_k aggregated over k.

    For latency pass (vLLM, SGLang); for throughput pass (SGLang, vLLM), so R > 1 favours SGLang
    either way. Pairs where either value is missing, infinite or not positive are dropped (the caller
    records how many pairs were used: `n`).
    """
    from scipy import stats as sps  # here, not at the top: a second of import

    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    if num.shape != den.shape:
        raise ValueError(f"paired_gap: {num.size} numerators but {den.size} denominators")
    labels = list(reps) if reps is not None else [str(i + 1) for i in range(num.size)]
    keep = np.isfinite(num) & np.isfinite(den) & (num > 0) & (den > 0)
    d = np.log(num[keep]) - np.log(den[keep])
    kept = tuple(lab for lab, k in zip(labels, keep, strict=True) if k)
    if d.size == 0:
        return PairedGap(0, NAN, NAN, NAN, NAN, (), ())
    mean, lo, hi = _t_interval(d, level)
    p = NAN
    if d.size >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(sps.ttest_1samp(d, 0.0).pvalue)
    return PairedGap(
        n=int(d.size),
        gap=math.exp(mean),
        ci_low=math.exp(lo) if np.isfinite(lo) else NAN,
        ci_high=math.exp(hi) if np.isfinite(hi) else NAN,
        p=p,
        ratios=tuple(float(r) for r in np.exp(d)),
        reps=kept,
    )


def removed_fraction(
    gap_defaults: float, gap_matched: float, guard: float = AnalysisSettings.phi_guard
) -> float:
    """φ = ln(R̄_def / R̄_mat) / ln R̄_def (Eq. 7), NaN unless |ln R̄_def| > ln `guard`."""
    if not (np.isfinite(gap_defaults) and np.isfinite(gap_matched)):
        return NAN
    if gap_defaults <= 0 or gap_matched <= 0:
        return NAN
    log_def = math.log(gap_defaults)
    if not abs(log_def) > math.log(guard):
        return NAN
    return math.log(gap_defaults / gap_matched) / log_def


def keeps_pace(
    achieved: float, offered: float, threshold: float = AnalysisSettings.keeps_pace
) -> bool:
    """An engine keeps pace with the offered load when X ≥ threshold · Λ (boundary included)."""
    return bool(np.isfinite(achieved) and achieved >= threshold * offered)


def tail_ratio(values: Sequence[float] | FloatArray) -> float:
    """p95 / p50 of the finite values (NaN when empty or the median is not positive)."""
    p50 = percentile(values, 50.0)
    if not np.isfinite(p50) or p50 <= 0:
        return NAN
    return percentile(values, 95.0) / p50


def log_skewness(values: Sequence[float] | FloatArray) -> float:
    """g1 of ln x: `scipy.stats.skew(ln x, bias=True)`; NaN for fewer than 3 positive values."""
    from scipy import stats as sps  # here, not at the top: a second of import

    arr = _finite(values)
    arr = arr[arr > 0]
    if arr.size < 3:
        return NAN
    logs = np.log(arr)
    if float(np.ptp(logs)) == 0.0:
        return NAN
    return float(sps.skew(logs, bias=True))


def sd_log(values: Sequence[float] | FloatArray) -> float:
    """Sample standard deviation (ddof = 1) of ln x over positive values; NaN for fewer than two."""
    arr = _finite(values)
    arr = arr[arr > 0]
    if arr.size < 2:
        return NAN
    return float(np.std(np.log(arr), ddof=1))


def counter_increase(times: Sequence[float], values: Sequence[float]) -> float:
    """Increase of a monotonic counter over the samples, reset-aware like PromQL `increase`.

    Samples are ordered by time; a drop is read as a counter reset, after which the new value counts
    in full. NaN when there are no samples.
    """
    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return NAN
    v = v[np.argsort(t, kind="stable")]
    steps = np.diff(v)
    return float(np.sum(np.where(steps >= 0, steps, v[1:])))


def fluid_wait_p50(delta: float, run_length_s: float) -> float:
    """Eq. 8: w50 = (T/2) · δ/(1 − δ), the wait of the request arriving halfway through the window."""
    if not (np.isfinite(delta) and delta < 1):
        return NAN
    return (run_length_s / 2.0) * delta / (1.0 - delta)


def fluid_predicted_gap(delta: float, run_length_s: float, baseline_p50_s: float) -> float:
    """Predicted median-TTFT gap (baseline + w50) / baseline for shortfall δ and run length T."""
    return (baseline_p50_s + fluid_wait_p50(delta, run_length_s)) / baseline_p50_s


# ------------------------------------------------------------------ power and multiplicity


def t_test_power(noncentrality: float, df: float, alpha: float = 0.05) -> float:
    """Power of a two-sided t-test at level `alpha` whose statistic is noncentral t(df, nc):
    P(T > c) + P(T < −c), c = t_{1−α/2, df}, T ~ `scipy.stats.nct(df, noncentrality)`.

    Both tails are counted (R's `power.t.test(strict = TRUE)`), so a zero noncentrality gives
    exactly `alpha`. The power is the same for ±nc; the far tail P(T < −c) is taken as the equal
    P(T' > c), T' ~ nct(df, −nc), because scipy's `nct.cdf` returns NaN far out in that tail (e.g.
    df 1, nc 13.5) where `nct.sf` returns its value. `df` may be fractional (a continuous sample
    size). NaN when df ≤ 0.
    """
    from scipy import stats as sps  # here, not at the top: a second of import

    if not (df > 0 and 0 < alpha < 1 and math.isfinite(noncentrality)):
        return NAN
    crit = float(sps.t.ppf(1.0 - alpha / 2.0, df))
    nc = abs(noncentrality)
    upper = float(sps.nct.sf(crit, df, nc))
    lower = float(sps.nct.sf(crit, df, -nc))
    return min(upper + lower, 1.0)


def paired_power(n: float, sd_log: float, effect: float, alpha: float = 0.05) -> float:
    """Power of `paired_gap`'s test (two-sided one-sample t on d_k = ln R_k) with `n` pairs to
    detect a true gap `effect` (a ratio; 1.25 and 0.8 are the same size) when the sd of d_k is
    `sd_log`: `t_test_power(|ln effect| · √n / sd_log, n − 1, alpha)`.

    An sd of 0 (every d_k alike) has infinite noncentrality: the power is 1 for any n ≥ 2. NaN for
    n < 2 (no test), a negative or non-finite sd, or an effect that is not a positive ratio.
    """
    if not (n >= 2 and math.isfinite(sd_log) and sd_log >= 0 and effect > 0):
        return NAN
    size = abs(math.log(effect))
    if sd_log == 0:
        return 1.0 if size > 0 else alpha
    return t_test_power(size * math.sqrt(n) / sd_log, n - 1.0, alpha)


def paired_sample_size(
    sd_log: float,
    effect: float,
    power: float = 0.8,
    alpha: float = 0.05,
    max_n: int = 1_000_000,
) -> int | None:
    """The fewest pairs n ≥ 2 whose `paired_power` reaches `power`; None if even `max_n` do not.

    The power of the t-test grows with n at fixed sd and effect, so the answer is found by
    doubling n until it is reached, then bisecting. `effect` must be a ratio other than 1.
    """
    if not (0 < power < 1):
        raise ValueError(f"power must be in (0, 1), not {power}")
    if not (effect > 0 and effect != 1):
        raise ValueError(f"the effect is a ratio other than 1 (1.25: 25% apart), not {effect}")
    if not (math.isfinite(sd_log) and sd_log >= 0):
        raise ValueError(f"the sd of the log differences must be finite and >= 0, not {sd_log}")

    def enough(n: int) -> bool:
        return paired_power(n, sd_log, effect, alpha) >= power

    low, high = 1, 2  # enough(low) is false by definition (no test with one pair)
    while not enough(high):
        if high >= max_n:
            return None
        low, high = high, min(2 * high, max_n)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple
    test procedure", Scand. J. Statist. 6: 65-70).

    With the m finite p-values sorted p_(1) ≤ ... ≤ p_(m), the adjusted value of the i-th is
    max_{j ≤ i} min(1, (m − j + 1) · p_(j)). Rejecting every hypothesis whose adjusted p-value is
    at most α is Holm's procedure at level α, which holds the family-wise error rate at α under
    any dependence between the tests. Values come back in the order given; a NaN (a test that
    could not be run) stays NaN and is not counted in m. Ties keep their input order, which does
    not change any adjusted value.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, NAN)
    finite = np.flatnonzero(np.isfinite(p))
    m = finite.size
    if m == 0:
        return [float(x) for x in out]
    order = finite[np.argsort(p[finite], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return [float(x) for x in out]
