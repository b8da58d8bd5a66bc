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
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from servelab.grid.settings import AnalysisSettings

__all__ = [
    "LogSummary",
    "PairedGap",
    "counter_increase",
    "fluid_predicted_gap",
    "fluid_wait_p50",
    "geomean",
    "keeps_pace",
    "log_skewness",
    "log_summary",
    "paired_gap",
    "percentile",
    "removed_fraction",
    "sd_log",
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
