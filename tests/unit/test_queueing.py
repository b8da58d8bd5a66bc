"""The closed queueing model (servelab.analysis.queueing) against textbook queues and its limits.

Each textbook case is one the evaluator could get wrong: the Pollaczek-Khinchine wait of M/D/1
(first come first served, one server), the insensitive sojourn S/(1 − ρ) of a processor-sharing
server, Erlang C for M/M/c (several servers), a hand-computed dependency chain (the release rule of
servelab.workload.release), and the fork-join growth rate against an independent polynomial root
and against the sample path itself.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from servelab.analysis.queueing import (
    Engine,
    GraphTrace,
    engine_slots,
    evaluate,
    fork_join_growth,
    per_seq_for_throughput,
    run_network,
    ttft_growth,
)
from servelab.analysis.synthetic import graph_trace_table


def poisson_arrivals(rate: float, n: int, seed: int) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


def open_network(
    arrivals: np.ndarray, work: np.ndarray, slots: int, step: Callable[[int], float]
) -> tuple[np.ndarray, ...]:
    """Independent requests (no predecessors, no tool delay, no prefill)."""
    n = arrivals.size
    zeros = np.zeros(n)
    return run_network(
        arrivals, [()] * n, zeros, prefill_s=zeros, steps=work, slots=slots, step_s=step
    )


# --------------------------------------------------------------------------- the sample path


def test_deterministic_single_server_by_hand() -> None:
    """D/D/1: arrivals at 0, 1, 2, service 1.5 s each: starts 0, 1.5, 3; done 1.5, 3, 4.5."""
    ready, start, done, in_service = open_network(
        np.array([0.0, 1.0, 2.0]), np.full(3, 3.0), 1, lambda n: 0.5
    )
    assert ready.tolist() == [0.0, 1.0, 2.0]
    assert start.tolist() == [0.0, 1.5, 3.0]
    assert done.tolist() == [1.5, 3.0, 4.5]
    assert in_service.tolist() == [1, 1, 1]


def test_md1_wait_is_pollaczek_khinchine() -> None:
    """M/D/1 at ρ = 0.5: mean wait ρS / (2(1 − ρ)) = 0.5 s for S = 1 s."""
    arrivals = poisson_arrivals(0.5, 60_000, seed=1)
    ready, start, _, _ = open_network(arrivals, np.ones(arrivals.size), 1, lambda n: 1.0)
    wait = (start - ready)[6_000:]  # past the warm-up
    assert wait.mean() == pytest.approx(0.5, rel=0.04)


def test_processor_sharing_sojourn_is_insensitive() -> None:
    """A load-dependent server whose step takes n·s with n in service is processor sharing:
    M/D/1-PS has mean sojourn S / (1 − ρ) = 2 s at ρ = 0.5."""
    arrivals = poisson_arrivals(0.5, 60_000, seed=2)
    ready, _, done, _ = open_network(arrivals, np.ones(arrivals.size), 10**9, lambda n: n * 1.0)
    sojourn = (done - ready)[6_000:]
    assert sojourn.mean() == pytest.approx(2.0, rel=0.04)


def erlang_c_wait(arrival_rate: float, service_rate: float, servers: int) -> float:
    """Mean wait of M/M/c: Erlang B by its recursion, then C = B / (1 − ρ(1 − B))."""
    a = arrival_rate / service_rate
    b = 1.0
    for k in range(1, servers + 1):
        b = a * b / (k + a * b)
    rho = a / servers
    c = b / (1.0 - rho * (1.0 - b))
    return c / (servers * service_rate - arrival_rate)


def test_mmc_wait_is_erlang_c() -> None:
    """Three servers, exponential service of mean 1 s, ρ = 0.7: Erlang C's mean wait."""
    arrivals = poisson_arrivals(2.1, 80_000, seed=3)
    work = np.random.default_rng(4).exponential(1.0, arrivals.size)
    ready, start, _, in_service = open_network(arrivals, work, 3, lambda n: 1.0)
    assert in_service.max() == 3
    wait = (start - ready)[8_000:]
    assert wait.mean() == pytest.approx(erlang_c_wait(2.1, 1.0, 3), rel=0.06)


def test_dependencies_release_as_the_workload_does() -> None:
    """planner -> two workers (tool delays 0.5 and 2 s) -> aggregator, unlimited servers, 1 s
    each: the aggregator waits for the slower worker; a worker's release is never before its
    graph's arrival."""
    release = np.array([3.0, 3.0, 3.0, 3.0])
    parents = [(), (0,), (0,), (1, 2)]
    tool = np.array([0.0, 0.5, 2.0, 0.0])
    zeros = np.zeros(4)
    ready, start, done, _ = run_network(
        release, parents, tool, prefill_s=zeros, steps=np.ones(4), slots=99, step_s=lambda n: 1.0
    )
    assert ready.tolist() == [3.0, 4.5, 6.0, 7.0]
    assert done.tolist() == [4.0, 5.5, 7.0, 8.0]
    assert (start == ready).all()


def test_unserved_predecessor_is_an_error() -> None:
    with pytest.raises(ValueError, match="unserved"):
        run_network(
            np.zeros(2),
            [(1,), (0,)],  # a cycle: neither is ever ready
            np.zeros(2),
            prefill_s=np.zeros(2),
            steps=np.ones(2),
            slots=1,
            step_s=lambda n: 1.0,
        )


# --------------------------------------------------------------------------- the engine


def test_service_rate_from_the_floor() -> None:
    """μ(1) is the floor's own rate 1 / (P + (Ō − 1)τ₁); μ grows with n to μ(slots)."""
    engine = Engine(slots=8, prefill_s=0.2, step_s=0.05, per_seq_s=0.004, mean_output=101.0)
    assert engine.rate(1) == pytest.approx(1.0 / (0.2 + 100 * 0.05))
    rates = [engine.rate(n) for n in range(1, 12)]
    assert all(b > a for a, b in itertools.pairwise(rates[:8]))
    assert rates[8:] == [engine.capacity] * 3  # capped at the slots
    # R̄(n) = n·P + (Ō − 1)·τ(n)
    assert engine.capacity == pytest.approx(8 / (8 * 0.2 + 100 * (0.05 + 7 * 0.004)))


def test_per_seq_for_throughput_inverts_capacity() -> None:
    engine = Engine(slots=20, prefill_s=0.16, step_s=0.066, per_seq_s=0.0, mean_output=149.3)
    c = per_seq_for_throughput(engine, 1.4, mean_output=149.3)
    assert c > 0
    assert engine.with_per_seq(c).capacity == pytest.approx(1.4)
    # a capacity above the c = 0 bound cannot be reached: c stays 0
    assert per_seq_for_throughput(engine, 10 * engine.capacity, mean_output=149.3) == 0.0
    assert math.isnan(per_seq_for_throughput(engine, float("nan"), mean_output=149.3))


def test_engine_slots_by_hand() -> None:
    """A 30,000-token cache, 1,000-token prompts, 200-token outputs (Ō/2 = 100 held on
    average; admitting one more needs its prompt and whole output)."""
    # token-level cache: D = 1,000, Ō/2 = 100: (30,000 - 0 - 1,000 - 200) / 1,100 = 26.18 -> 27
    assert engine_slots(30_000, prompt_tokens=1_000, prefix_tokens=0, mean_output=200) == 27
    # a shared prefix of 600 tokens in 16-token blocks: F_b = 592, D_b = 1,008 - 592 = 416,
    # held 416 + 100 + 8 = 524, admission 416 + 200: (30,000 - 592 - 616) / 524 = 54.9 -> 55
    assert (
        engine_slots(30_000, prompt_tokens=1_000, prefix_tokens=600, mean_output=200, block_size=16)
        == 55
    )
    assert (
        engine_slots(30_000, prompt_tokens=1_000, prefix_tokens=600, mean_output=200, max_running=8)
        == 8
    )
    assert engine_slots(100, prompt_tokens=1_000, prefix_tokens=0, mean_output=200) == 1


# --------------------------------------------------------------------------- on a trace


def graph_table(
    n_graphs: int, gap_s: float, *, workers: int = 4, tool_delay_s: float = 0.0
) -> pa.Table:
    """Graphs every `gap_s`: planner -> workers -> aggregator, 16-token prompts with an 8-token
    shared prefix, 9 output tokens (aggregator 17)."""
    return graph_trace_table(
        [g * gap_s for g in range(n_graphs)], workers=workers, tool_delay_s=tool_delay_s
    )


def test_trace_structure() -> None:
    trace = GraphTrace.from_table(graph_table(3, 10.0), duration_s=30.0)
    assert trace.n == 18 and trace.n_graphs == 3
    assert trace.stage_sizes() == (1.0, 4.0, 1.0)
    assert trace.prompt_tokens.tolist() == [16] * 18
    assert trace.mean_output == pytest.approx((5 * 9 + 17) / 6)


def test_light_load_is_the_floor() -> None:
    """Graphs far apart, one worker: no request ever shares the engine, so every TTFT is the
    floor's P and every request's time in service the floor's E2E, P + (O − 1)τ₁."""
    trace = GraphTrace.from_table(graph_table(5, 100.0, workers=1), duration_s=500.0)
    engine = Engine(slots=4, prefill_s=0.2, step_s=0.05, per_seq_s=0.01, mean_output=11.67)
    ev = evaluate(trace, engine)
    assert ev.ttft_s == pytest.approx(np.full(trace.n, 0.2))
    out = trace.max_tokens.astype(float)
    assert ev.done_s - ev.start_s == pytest.approx(0.2 + (out - 1) * 0.05)
    assert (ev.in_service == 1).all()


def test_throughput_never_above_capacity() -> None:
    """Twice the load the engine can serve: X stays at or below μ(slots), and the backlog makes
    TTFT grow over the run."""
    engine = Engine(slots=6, prefill_s=0.05, step_s=0.02, per_seq_s=0.002, mean_output=62 / 6)
    graph_rate = 2.0 * engine.capacity / 6.0
    trace = GraphTrace.from_table(graph_table(300, 1.0 / graph_rate), duration_s=300 / graph_rate)
    assert trace.mean_output == pytest.approx(engine.mean_output)
    ev = evaluate(trace, engine)
    assert ev.throughput <= engine.capacity * (1 + 1e-9)
    assert ev.throughput > 0.9 * engine.capacity  # busy nearly throughout
    assert ttft_growth(ev.ready_s, ev.ttft_s) > 0.1


# --------------------------------------------------------------------------- fork-join


def test_one_stage_fork_join_is_the_open_fluid_model() -> None:
    """Every request of a graph at once (one stage of six): a = Λ/X − 1 = δ/(1 − δ) (Eq. 8)."""
    assert fork_join_growth(0.3, 1.5, (6.0,)) == pytest.approx(1.8 / 1.5 - 1.0)
    assert fork_join_growth(0.2, 1.5, (1.0, 4.0, 1.0)) == 0.0  # keeps up: no growth


def test_fork_join_root_by_polynomial() -> None:
    """λ = 1, X = 5, m = (1, 4, 1): with u = 1 + a, 5u³ − u² − 4u − 1 = 0 (numpy.roots)."""
    roots = np.roots([5.0, -1.0, -4.0, -1.0])
    u = max(r.real for r in roots if abs(r.imag) < 1e-12)
    assert fork_join_growth(1.0, 5.0, (1.0, 4.0, 1.0)) == pytest.approx(u - 1.0, rel=1e-9)
    assert fork_join_growth(1.0, 5.0, (1.0, 4.0, 1.0)) < 6.0 / 5.0 - 1.0  # below the open one


@pytest.mark.parametrize("rho", [1.1, 1.3, 2.0])
def test_fork_join_matches_the_sample_path(rho: float) -> None:
    """Deterministic arrivals and service, no tool delay: the sample path's TTFT grows at the
    fork-join rate (within 2%), about half the open fluid model's ρ − 1 near the knee."""
    slots, service = 20, 10.0
    capacity = slots / service
    graph_rate = rho * capacity / 6.0
    trace = GraphTrace.from_table(graph_table(600, 1.0 / graph_rate), duration_s=600 / graph_rate)
    zeros = np.zeros(trace.n)
    ready, start, _, _ = run_network(
        trace.arrival_s,
        trace.parents,
        trace.tool_delay_s,
        prefill_s=zeros,
        steps=np.full(trace.n, service),
        slots=slots,
        step_s=lambda n: 1.0,
    )
    window = ready < trace.duration_s
    slope = ttft_growth(ready[window], (start - ready)[window])
    expected = fork_join_growth(graph_rate, capacity, trace.stage_sizes())
    assert slope == pytest.approx(expected, rel=0.02)
    assert expected < 0.6 * (rho - 1.0)
