"""benchmarks/vllm_prefix_decode.py: the send order, the prompts behind a cached prefix, a
request's decode steps split on the engine's clock, and the comparison of the two kinds
(docs/simulator.md, "Does a cached prefix slow vLLM's decode?")."""

from __future__ import annotations

import pytest

from tests.benchmark_modules import load_benchmark

bench = load_benchmark("vllm_prefix_decode")
Event = bench.Event


def test_each_cycle_opens_with_its_planner_and_alternates_which_kind_goes_first() -> None:
    order = bench.plan(cycles=2, pairs=2)
    assert order == [
        (0, "planner"),
        (0, "fresh"),
        (0, "cached"),
        (0, "cached"),
        (0, "fresh"),
        (1, "planner"),
        (1, "cached"),
        (1, "fresh"),
        (1, "fresh"),
        (1, "cached"),
    ]


def test_a_cached_request_begins_with_its_cycles_planner_prefix_and_a_fresh_one_shares_none() -> (
    None
):
    order = bench.plan(cycles=2, pairs=1)
    ids = bench.prompts(order, seed=7)
    assert all(len(p) == bench.PROMPT_TOKENS for p in ids)
    by = {(cycle, kind): p for (cycle, kind), p in zip(order, ids, strict=True)}
    n = bench.PREFIX_TOKENS
    for cycle in (0, 1):
        assert by[(cycle, "cached")][:n] == by[(cycle, "planner")][:n]
        assert by[(cycle, "cached")][n:] != by[(cycle, "planner")][n:]
        assert by[(cycle, "fresh")][:16] != by[(cycle, "planner")][:16]
    assert by[(0, "planner")][:n] != by[(1, "planner")][:n]
    assert bench.prompts(order, seed=7) == ids  # deterministic in the seed


def sched(t: float, start: float, batch: str) -> Event:
    return Event(
        t, "core", "MainThread", "ec_sched", (f"{start:.6f}", "", "1", "1", "0", "1", batch)
    )


def mark(t: float, kind: str) -> Event:
    return Event(t, "core", "MainThread", kind, ())


def step(start: float, batch: str, *, schedule: float, execute: float, update: float) -> list:
    t1 = start + schedule
    t2 = t1 + execute
    return [sched(t1, start, batch), mark(t2, "ec_update_in"), mark(t2 + update, "ec_stepend")]


def test_decode_steps_split_a_back_to_back_step_and_leave_out_prefills_batches_and_last_steps() -> (
    None
):
    a, b = "cmpl-fresh1-0-0a1b2c3d", "cmpl-cached2-0-00ff00ff"
    events = [
        *step(0.000, f"{a}:1024:0:1024", schedule=0.001, execute=0.010, update=0.001),  # prefill
        *step(0.013, f"{a}:1:1024:1024", schedule=0.001, execute=0.004, update=0.001),
        *step(0.020, f"{a}:1:1025:1024", schedule=0.001, execute=0.005, update=0.001),
        *step(
            0.029, f"{a}:1:1026:1024,{b}:512:512:1024", schedule=0.001, execute=0.02, update=0.001
        ),
        *step(0.060, f"{a}:1:1027:1024", schedule=0.001, execute=0.004, update=0.001),  # last
        *step(0.500, f"{b}:1:1024:1024", schedule=0.002, execute=0.004, update=0.001),
    ]
    out = bench.decode_steps(events, {"fresh1", "cached2"})
    # the prefill, the step of two requests and each request's last step are left out
    assert set(out) == {"fresh1"}
    first, second = out["fresh1"]
    assert first == pytest.approx(
        {"cycle": 0.007, "schedule": 0.001, "execute": 0.004, "update": 0.001, "between": 0.001}
    )
    assert second["cycle"] == pytest.approx(0.009)
    assert second["between"] == pytest.approx(0.002)


def test_a_requests_row_is_its_steps_medians_and_its_client_gap_after_the_first_chunk() -> None:
    steps = [
        {"cycle": c, "schedule": 0.001, "execute": 0.004, "update": 0.001, "between": 0.0}
        for c in (0.006, 0.007, 0.020)
    ]
    # the first chunk's gap (0.1 s: the prefill) is not a decode gap
    row = bench.request_row(steps, [0.0, 0.1, 0.106, 0.113, 0.121])
    assert row["decode_steps"] == 3
    assert row["cycle"] == pytest.approx(7.0)
    assert row["client_gap"] == pytest.approx(7.0)


def rows(kind: str, cycles: list[float]) -> list[dict[str, object]]:
    return [
        {"kind": kind, "cycle": c, "schedule": 1.0, "execute": 4.0, "update": 1.0, "between": 0.5}
        | {"client_gap": c}
        for c in cycles
    ]


def test_the_comparison_is_cached_over_fresh_of_the_medians_with_a_rank_test() -> None:
    fresh = [6.0 + 0.01 * k for k in range(20)]
    cached = [6.6 + 0.01 * k for k in range(20)]
    out = bench.compare(rows("fresh", fresh) + rows("cached", cached) + rows("planner", [50.0]))
    assert out["cycle"]["ratio"] == pytest.approx(6.695 / 6.095, abs=1e-3)
    assert out["cycle"]["p"] < 1e-6
    assert out["cycle"]["requests"] == {"fresh": 20, "cached": 20}
    assert out["execute"]["ratio"] == 1.0 and out["execute"]["p"] > 0.5
    same = bench.compare(rows("fresh", fresh) + rows("cached", fresh))
    assert same["cycle"]["ratio"] == 1.0 and same["cycle"]["p"] > 0.5
