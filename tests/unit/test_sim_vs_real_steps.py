"""An engine's steps rebuilt from the token bursts its clients received
(`servelab.analysis.sim_vs_real.client_steps`), and what benchmarks/sim_vs_real_steps.py reads
off them (docs/simulator.md, "The front end's work, step by step")."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from benchmark_modules import load_benchmark

from servelab.analysis.sim_vs_real import ClientStep, client_steps

steps_mod = load_benchmark("sim_vs_real_steps")
GAP_S, MERGE_S = 0.002, 0.010


def request(rid: str, sent_s: float, times: list[float]) -> dict[str, Any]:
    return {
        "request_id": rid,
        "status": "ok",
        "warmup": False,
        "sent_s": sent_s,
        "chunk_times_s": times,
        "chunk_tokens": [1] * len(times),
    }


def test_bursts_become_steps() -> None:
    """A request seen again starts a step; a silence longer than the gap does too; a burst cut
    in two by the writer's pause (no request in common, closer than the merge window) is one
    step; a first token is counted where it came."""
    # steps at 10, 20 and 30 ms; the second's burst is written in two halves 4 ms apart;
    # c's first token comes with the third
    runs = [
        request("a", 0.0, [0.0100, 0.0200, 0.0300]),
        request("b", 0.0, [0.0101, 0.0240, 0.0301]),
        request("c", 0.012, [0.0302]),
    ]
    steps = client_steps(runs, GAP_S, MERGE_S)
    assert [sorted(s.served) for s in steps] == [["a", "b"], ["a", "b"], ["a", "b", "c"]]
    assert [s.firsts for s in steps] == [2, 0, 1]
    assert [s.tokens for s in steps] == [2, 2, 3]
    assert steps[1].first_s == 0.0200 and steps[1].last_s == 0.0240
    # a tighter merge window keeps the halves apart
    assert len(client_steps(runs, GAP_S, 0.003)) == 4


def test_decode_line_charges_a_send_to_the_step_it_ran_during() -> None:
    """Synthetic decode steps of base 4 ms + 0.4 ms a request served + 4 ms a request sent
    during the step: the line gives those back, and a send is counted in the step whose window
    (from the burst before it to its own) holds it."""
    rng = np.random.default_rng(7)
    steps, sent, t = [ClientStep(0.0, 0.0, {"x"})], [], 0.0
    for k in range(200):
        served = int(rng.integers(1, 12))
        sends = int(rng.integers(0, 3)) if k % 3 == 0 else 0
        duration = 0.004 + 0.0004 * served + 0.004 * sends
        sent += [t + duration * (j + 1) / (sends + 1) for j in range(sends)]
        t += duration
        steps.append(ClientStep(t, t, {f"r{i}" for i in range(served)}))
    line = steps_mod.decode_line(steps, np.array(sent))
    c = line["coefficients_s"]
    assert c["base"] == pytest.approx(0.004, abs=1e-9)
    assert c["per_seq"] == pytest.approx(0.0004, abs=1e-9)
    assert c["per_sent"] == pytest.approx(0.004, abs=1e-9)
    # the same sends counted one step late would not give the line back
    late = steps_mod.decode_line(steps, np.array(sent) + 0.02)
    assert late["coefficients_s"]["per_sent"] < 0.002


def test_steps_before_a_busy_arrivals_first_token() -> None:
    """For a request sent while another was in flight: the steps that ended between its send
    and its first token, its own first step not counted; a request sent to an idle engine is
    not one of them."""
    runs = [
        request("a", 0.0, [0.010, 0.015, 0.020, 0.025, 0.030]),
        request("b", 0.012, [0.025, 0.030]),  # a's steps at 15 and 20 ms come between
        request("c", 0.040, [0.050]),  # nothing in flight
    ]
    steps = client_steps(runs, GAP_S, MERGE_S)
    waits = steps_mod.busy_waits(runs, steps)
    assert waits["requests"] == 1
    assert waits["median_steps_before_first_token"] == 2
    assert waits["median_ttft_s"] == pytest.approx(0.013)
