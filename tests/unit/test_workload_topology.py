"""L2: graph topology, request ids and the truncated log-normal tool delays."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from servelab.grid.config import ConfigError
from servelab.workload.release import ReleaseTracker, TraceRequest
from servelab.workload.topology import ToolDelay, graph_rows, request_id, tool_delays

DEFAULT = {"distribution": "lognormal", "median_s": 0.5, "sigma": 1.0, "min_s": 0.0, "max_s": 10.0}
CAPS = {"planner": 128, "worker": 128, "aggregator": 256}


def test_truncated_lognormal_matches_the_truncated_distribution() -> None:
    spec = ToolDelay.from_config({**DEFAULT, "min_s": 0.1, "max_s": 2.0})
    d = tool_delays(3, 50_000, spec)
    assert d.min() >= 0.1 and d.max() <= 2.0
    base = stats.lognorm(s=1.0, scale=0.5)
    lo, hi = base.cdf(0.1), base.cdf(2.0)

    def truncated_cdf(x: np.ndarray) -> np.ndarray:
        return (base.cdf(np.clip(x, 0.1, 2.0)) - lo) / (hi - lo)

    assert stats.kstest(d, truncated_cdf).pvalue > 0.01
    # truncation by inverse CDF, not clipping: no probability mass piled on the bounds
    assert np.count_nonzero(d == 2.0) == 0 and np.count_nonzero(d == 0.1) == 0
    # clipping would put F(0.1) + 1 - F(2) ≈ 17% of the draws on the bounds
    assert lo + (1 - hi) > 0.1


def test_tool_delays_do_not_move_with_the_last_bit_of_exp(monkeypatch: pytest.MonkeyPatch) -> None:
    """NumPy's exp differs in the last bit between CPUs with and without AVX-512 (the study's traces did,
    between two machines); a trace must not. The delays are drawn on a microsecond grid, so an exp one ulp
    off gives the same delays."""
    from servelab.workload import topology

    spec = ToolDelay.from_config(DEFAULT)
    exact = tool_delays(5, 20_000, spec)
    assert np.array_equal(np.round(exact * 1e6) / 1e6, exact)
    real_exp = np.exp
    for direction in (np.inf, -np.inf):
        monkeypatch.setattr(
            topology.np, "exp", lambda x, d=direction: np.nextafter(real_exp(x), d), raising=True
        )
        assert np.array_equal(tool_delays(5, 20_000, spec), exact)
        monkeypatch.setattr(topology.np, "exp", real_exp)


def test_default_tool_delays_are_subsecond_with_a_bounded_tail() -> None:
    d = tool_delays(11, 100_000, ToolDelay.from_config(DEFAULT))
    assert abs(np.median(d) - 0.5) < 0.02
    assert d.min() >= 0 and d.max() <= 10.0
    assert (
        np.quantile(d, 0.99) > 4.0
    )  # heavy tail: p99 of the untruncated law is 0.5·e^2.33 ≈ 5.1 s


def test_constant_and_zero_sigma_delays() -> None:
    assert np.all(
        tool_delays(1, 10, ToolDelay.from_config({**DEFAULT, "distribution": "constant"})) == 0.5
    )
    assert np.all(tool_delays(1, 10, ToolDelay.from_config({**DEFAULT, "sigma": 0.0})) == 0.5)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"distribution": "weibull"}, "workload.tool_delay.distribution"),
        ({"median_s": -1}, "workload.tool_delay.median_s"),
        ({"median_s": 0.0}, "workload.tool_delay.median_s"),
        ({"sigma": math.nan}, "workload.tool_delay.sigma"),
        ({"min_s": 5.0, "max_s": 5.0}, "workload.tool_delay.min_s"),
        ({"distribution": "constant", "median_s": 20.0}, "workload.tool_delay.median_s"),
        ({"median_s": 1e6, "sigma": 0.01}, "workload.tool_delay"),
        ({"max_s": "10"}, "workload.tool_delay.max_s"),
    ],
)
def test_bad_tool_delay_settings_name_the_key(change: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        ToolDelay.from_config({**DEFAULT, **change})


def test_graph_rows_build_planner_workers_aggregator() -> None:
    arrivals = np.array([1.0, 2.5, 2.5])
    delays = np.arange(12, dtype=float) / 10
    rows = graph_rows(arrivals, delays, 4, CAPS)
    assert len(rows) == 18
    assert rows.request_id[:6] == [
        "g00000-planner",
        "g00000-w1",
        "g00000-w2",
        "g00000-w3",
        "g00000-w4",
        "g00000-aggregator",
    ]
    assert rows.depends_on[1] == ["g00000-planner"]
    assert rows.depends_on[11] == ["g00001-w1", "g00001-w2", "g00001-w3", "g00001-w4"]
    assert rows.role[6:12] == ["planner", "worker", "worker", "worker", "worker", "aggregator"]
    assert list(rows.tool_delay_s[6:12]) == [0.0, 0.4, 0.5, 0.6, 0.7, 0.0]
    assert list(rows.max_tokens[:6]) == [128, 128, 128, 128, 128, 256]
    assert list(rows.graph_id) == [g for g in range(3) for _ in range(6)]
    assert list(rows.arrival_s[12:]) == [2.5] * 6
    assert sorted(rows.request_id[:6]) != rows.request_id[:6]  # roles are ordered, not alphabetical
    # ids sort by graph: zero padding keeps graph 10 after graph 9
    assert request_id(9, "planner") < request_id(10, "planner")


def test_many_workers_get_padded_sortable_ids() -> None:
    rows = graph_rows(np.array([0.0]), np.zeros(12), 12, CAPS)
    workers = [r for r, role in zip(rows.request_id, rows.role, strict=True) if role == "worker"]
    assert workers[0] == "g00000-w01" and workers == sorted(workers)


def trace_requests(rows: Any) -> list[TraceRequest]:
    """The release-relevant part of each of `graph_rows`' rows."""
    return [
        TraceRequest(
            rows.request_id[i],
            int(rows.graph_id[i]),
            rows.role[i],
            float(rows.arrival_s[i]),
            tuple(rows.depends_on[i]),
            float(rows.tool_delay_s[i]),
            int(rows.max_tokens[i]),
        )
        for i in range(len(rows))
    ]


def test_graph_rows_drive_the_shared_release_logic() -> None:
    rows = graph_rows(np.array([3.0]), np.array([0.1, 0.2, 0.3, 0.4]), 4, CAPS)
    tracker = ReleaseTracker(trace_requests(rows))
    assert tracker.initial() == [(3.0, "g00000-planner")]
    released = tracker.finish("g00000-planner", 5.0)
    assert sorted(released) == [
        (5.1, "g00000-w1"),
        (5.2, "g00000-w2"),
        (5.3, "g00000-w3"),
        (5.4, "g00000-w4"),
    ]
    for w in ("g00000-w1", "g00000-w2", "g00000-w3"):
        assert tracker.finish(w, 6.0) == []
    assert tracker.finish("g00000-w4", 7.0) == [(7.0, "g00000-aggregator")]


def test_a_dependant_is_due_at_its_latest_predecessor_not_the_last_reported() -> None:
    # the paced client reads its streams in batches, so it may learn that w2 ended (kernel stamp
    # 7.0) before it learns that w1 ended earlier (6.9): the aggregator is due at 7.0, not 6.9
    rows = graph_rows(np.array([0.0]), np.zeros(2), 2, CAPS)
    tracker = ReleaseTracker(trace_requests(rows))
    tracker.finish("g00000-planner", 1.0)
    assert tracker.finish("g00000-w2", 7.0) == []
    assert tracker.finish("g00000-w1", 6.9) == [(7.0, "g00000-aggregator")]
