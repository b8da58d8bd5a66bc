"""The study's statistics on hand-computed fixtures, and against scipy directly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from servelab.analysis import stats


def test_percentile_is_linear_interpolation() -> None:
    # rank (n-1)·q = 3·0.95 = 2.85 -> 3 + 0.85·(4 − 3)
    assert stats.percentile([4, 1, 3, 2], 95) == pytest.approx(3.85)
    assert stats.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert math.isnan(stats.percentile([], 50))
    assert stats.percentile([1.0, float("nan"), 3.0], 50) == pytest.approx(2.0)


def test_geomean() -> None:
    assert stats.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert stats.geomean([2.0, 8.0, 4.0]) == pytest.approx(4.0)
    assert math.isnan(stats.geomean([1.0, 0.0]))
    assert math.isnan(stats.geomean([]))


def test_paired_gap_hand_computed() -> None:
    # ln R_k = 0.1, 0.2, 0.3: mean 0.2, s = 0.1, se = 0.1/√3, t_{0.975,2} = 4.3027
    num = [math.exp(0.1) * 2.0, math.exp(0.2) * 3.0, math.exp(0.3) * 5.0]
    den = [2.0, 3.0, 5.0]
    g = stats.paired_gap(num, den, ["rep1", "rep2", "rep3"])
    assert g.n == 3
    assert g.gap == pytest.approx(math.exp(0.2))
    assert g.ci_low == pytest.approx(0.952739, rel=1e-5)
    assert g.ci_high == pytest.approx(1.565826, rel=1e-5)
    assert g.p == pytest.approx(0.0741799, rel=1e-5)  # t = 0.2/(0.1/√3) = 3.4641, df 2
    assert not g.significant
    assert g.ratios == pytest.approx((math.exp(0.1), math.exp(0.2), math.exp(0.3)))


def test_paired_gap_ci_and_p_agree_with_scipy() -> None:
    vllm = np.array([2.0, 3.0, 4.0, 2.5])
    sglang = np.array([1.0, 1.2, 1.1, 1.4])
    g = stats.paired_gap(vllm, sglang)
    d = np.log(vllm) - np.log(sglang)
    lo, hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    assert (g.ci_low, g.ci_high) == pytest.approx((math.exp(lo), math.exp(hi)))
    assert g.p == pytest.approx(sps.ttest_rel(np.log(vllm), np.log(sglang)).pvalue)
    assert g.p == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue)
    assert g.significant  # p ≈ 0.0105
    # The geometric mean of paired ratios equals the ratio of the geometric means.
    assert g.gap == pytest.approx(stats.geomean(vllm) / stats.geomean(sglang))


def test_paired_gap_drops_unusable_pairs_and_needs_two_for_inference() -> None:
    g = stats.paired_gap([2.0, float("nan"), 3.0], [1.0, 1.0, 0.0], ["rep1", "rep2", "rep3"])
    assert g.n == 1 and g.reps == ("rep1",)
    assert g.gap == pytest.approx(2.0)
    assert math.isnan(g.ci_low) and math.isnan(g.ci_high) and math.isnan(g.p)
    empty = stats.paired_gap([], [])
    assert empty.n == 0 and math.isnan(empty.gap)


def test_removed_fraction_and_its_guard() -> None:
    # The study's rate-0.28 median row: 36.4 -> 12.3 removes 30%.
    assert stats.removed_fraction(36.4, 12.3) == pytest.approx(0.301836, rel=1e-5)
    # Full removal, no change, and a gap reversed below parity.
    assert stats.removed_fraction(8.0, 1.0) == pytest.approx(1.0)
    assert stats.removed_fraction(8.0, 8.0) == pytest.approx(0.0)
    assert stats.removed_fraction(4.0, 0.5) == pytest.approx(1.5)
    # Guard: |ln R_def| must exceed ln 1.1 strictly, in either direction.
    assert math.isnan(stats.removed_fraction(1.09, 0.95))
    assert math.isnan(stats.removed_fraction(1.1, 0.95))
    assert not math.isnan(stats.removed_fraction(1.1001, 0.95))
    assert stats.removed_fraction(1 / 1.5, 1 / 1.2) == pytest.approx(
        math.log(1.2 / 1.5) / math.log(1 / 1.5)
    )
    assert math.isnan(stats.removed_fraction(1 / 1.05, 1.0))
    assert math.isnan(stats.removed_fraction(2.0, 3.0, guard=2.5))


def test_keeps_pace_boundary_is_inclusive() -> None:
    offered = 1.68
    boundary = 0.97 * offered
    assert stats.keeps_pace(boundary, offered)
    assert not stats.keeps_pace(np.nextafter(boundary, 0.0), offered)
    assert stats.keeps_pace(1.66, offered)  # the study's SGLang at matched rate 0.28
    assert not stats.keeps_pace(1.58, offered)  # and vLLM
    assert not stats.keeps_pace(float("nan"), offered)
    assert stats.keeps_pace(0.9 * offered, offered, threshold=0.9)


def test_dispersion_statistics() -> None:
    ttft = np.exp([0.0, 1.0, 2.0, 6.0])
    # Y = ln TTFT = 0, 1, 2, 6: m2 = 5.1875, m3 = 9.84375, g1 = m3 / m2^1.5
    assert stats.log_skewness(ttft) == pytest.approx(9.84375 / 5.1875**1.5)
    assert stats.log_skewness(ttft) == pytest.approx(sps.skew(np.log(ttft), bias=True))
    assert stats.log_skewness(ttft) != pytest.approx(sps.skew(np.log(ttft), bias=False))
    assert math.isnan(stats.log_skewness([1.0, 2.0]))
    # tail ratio: p95 / p50 with linear interpolation
    values = np.arange(1.0, 101.0)
    assert stats.tail_ratio(values) == pytest.approx(95.05 / 50.5)


def test_sd_log_is_sample_sd() -> None:
    # The study: vLLM medians 3.0, 3.3 and 10.1 s (rounded) spread 0.67; ddof=0 would give 0.55.
    assert stats.sd_log([3.0, 3.3, 10.1]) == pytest.approx(0.67, abs=0.01)
    assert stats.sd_log([2.0, 2.0 * math.e]) == pytest.approx(1 / math.sqrt(2))
    assert math.isnan(stats.sd_log([3.0]))


def test_log_summary_matches_ci_formula() -> None:
    s = stats.log_summary([1.0, math.e, math.e**2])
    half = sps.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert s.gmean == pytest.approx(math.e)
    assert (s.ci_low, s.ci_high) == pytest.approx((math.exp(1 - half), math.exp(1 + half)))
    assert s.sd_log == pytest.approx(1.0)


def test_counter_increase_handles_resets_and_order() -> None:
    assert stats.counter_increase([0, 5, 10, 15, 20], [5, 7, 7, 2, 4]) == pytest.approx(6.0)
    assert stats.counter_increase([10, 0, 5], [9, 3, 3]) == pytest.approx(6.0)
    assert stats.counter_increase([0], [4]) == 0.0
    assert math.isnan(stats.counter_increase([], []))


def test_fluid_queue_model_equation_8() -> None:
    # The study: a 4.4% shortfall over a 600 s window.
    assert stats.fluid_wait_p50(0.044, 600.0) == pytest.approx(300 * 0.044 / 0.956)
    assert stats.fluid_wait_p50(0.0, 600.0) == 0.0
    # Linear in T: half the run length, half the wait.
    assert stats.fluid_wait_p50(0.05, 300.0) * 2 == pytest.approx(stats.fluid_wait_p50(0.05, 600.0))
    gap = stats.fluid_predicted_gap(0.044, 600.0, 0.99)
    assert gap == pytest.approx((0.99 + 13.8075314) / 0.99)
