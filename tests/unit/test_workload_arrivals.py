"""L1 arrivals and the named random streams."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.grid.config import trace_seed
from servelab.workload.arrivals import arrival_times, gamma_gaps
from servelab.workload.streams import substream
from servelab.workload.topology import ToolDelay, tool_delays

CV = 1.5


@pytest.mark.parametrize(("rate", "rep"), [(0.05, "rep1"), (0.28, "rep2"), (1.0, "rep3")])
def test_arrival_gaps_have_cv_and_mean_of_the_study(rate: float, rep: str) -> None:
    seed = trace_seed(20261104, f"rate-{rate:.2f}", rep)
    n_target = 200_000  # >= 10,000 gaps; enough that the sampling error of the CV is ~0.007
    times = arrival_times(seed, rate, CV, duration_s=n_target / rate)
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert gaps.size >= 190_000
    assert np.all(gaps >= 0)  # shape 0.44 gives some gaps that round to 0: arrivals may tie
    cv = gaps.std(ddof=1) / gaps.mean()
    assert abs(cv - CV) <= 0.05, cv
    assert abs(gaps.mean() * rate - 1.0) <= 0.02, gaps.mean()


def test_gamma_gaps_follow_shape_and_scale() -> None:
    gaps = gamma_gaps(np.random.default_rng(7), 100_000, rate=0.4, cv=0.5)
    # CV 0.5 -> shape 4: a different CV must give a different distribution, not always 1.5
    assert abs(gaps.std(ddof=1) / gaps.mean() - 0.5) < 0.02
    assert abs(gaps.mean() - 2.5) < 0.05


def test_arrivals_lie_in_the_window_and_are_increasing() -> None:
    times = arrival_times(99, rate=0.28, cv=CV, duration_s=600.0)
    assert times.size > 50
    assert np.all(np.diff(times) >= 0)
    assert times[0] > 0 and times[-1] < 600.0
    # the count follows the rate: about λ·T graphs (a loose bound: CV 1.5 counts are noisy)
    assert 0.28 * 600 * 0.5 < times.size < 0.28 * 600 * 1.5


def test_arrivals_are_deterministic_and_seed_dependent() -> None:
    a = arrival_times(1, 0.2, CV, 600.0)
    assert np.array_equal(a, arrival_times(1, 0.2, CV, 600.0))
    assert not np.array_equal(a[:10], arrival_times(2, 0.2, CV, 600.0)[:10])


def test_longer_duration_extends_the_same_arrivals() -> None:
    short = arrival_times(5, 0.2, CV, 300.0)
    long = arrival_times(5, 0.2, CV, 3000.0)
    assert np.array_equal(long[: short.size], short)


def test_streams_are_independent_by_name() -> None:
    seed = 424242
    first = substream(seed, "tool_delay").random(5)
    # drawing any amount from another stream does not shift this one
    substream(seed, "arrivals").random(10_000)
    assert np.array_equal(first, substream(seed, "tool_delay").random(5))
    assert not np.array_equal(first, substream(seed, "prefix").random(5))
    assert not np.array_equal(first, substream(seed + 1, "tool_delay").random(5))


def test_tool_delays_do_not_depend_on_the_arrival_rate() -> None:
    spec = ToolDelay("lognormal", 0.5, 1.0, 0.0, 10.0)
    seed = 77
    n_low = arrival_times(seed, 0.05, CV, 600.0).size
    n_high = arrival_times(seed, 0.40, CV, 600.0).size
    assert n_low != n_high
    low = tool_delays(seed, n_low * 4, spec)
    high = tool_delays(seed, n_high * 4, spec)
    k = min(low.size, high.size)
    assert np.array_equal(low[:k], high[:k])


@pytest.mark.parametrize(
    ("rate", "cv", "duration", "match"),
    [(0.0, 1.5, 10.0, "rate"), (0.1, -1.0, 10.0, "arrival_cv"), (0.1, 1.5, 0.0, "duration_s")],
)
def test_bad_arrival_parameters_are_named(
    rate: float, cv: float, duration: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        arrival_times(1, rate, cv, duration)
