"""benchmarks/sim_vs_real_single_passes.py: a run's single-request passes, alone or while
another request is on its way in, and their real ÷ predicted gap by block."""

from __future__ import annotations

import pytest

from tests.benchmark_modules import load_benchmark

single_passes = load_benchmark("sim_vs_real_single_passes")


def request(name: str, sent: float, chunks: list[float], warmup: bool = False) -> dict:
    return {
        "request_id": name,
        "sent_s": sent,
        "chunk_times_s": chunks,
        "chunk_tokens": [1] * len(chunks),
        "warmup": warmup,
    }


def test_a_step_is_a_single_pass_alone_or_arriving_by_the_requests_around_it() -> None:
    rows = [
        # steps 30 ms apart, each its own burst (client_steps)
        request("a", 0.9, [1.00, 1.03, 1.06, 1.09, 1.12]),
        # sent at 1.065, first chunk at 1.15: on its way in during a's steps ending 1.09 and 1.12
        request("b", 1.065, [1.15, 1.18]),
        # two requests served in the same steps: not single passes
        request("c", 1.2, [1.30, 1.33]),
        request("d", 1.2, [1.30, 1.33]),
        # a warm-up is not the trace's: neither a step nor an arrival
        request("w", 1.04, [1.045], warmup=True),
    ]
    gaps = single_passes.single_pass_gaps(rows)
    # a's steps ending 1.03 and 1.06, and b's ending 1.18 (b's first chunk is no arrival then)
    assert gaps["alone"] == pytest.approx([0.03, 0.03, 0.03])
    assert gaps["arriving"] == pytest.approx([0.03, 0.03])


def test_a_blocks_ratio_is_the_median_over_repetitions_with_enough_gaps() -> None:
    real = [
        {"alone": [0.010] * 30, "arriving": [0.020] * 30},
        {"alone": [0.012] * 30, "arriving": [0.020] * 5},
        {"alone": [0.030] * 30, "arriving": [0.030] * 30},
    ]
    predicted = [{"alone": [0.010] * 30, "arriving": [0.010] * 30}] * 3
    block = single_passes.block_ratio(real, predicted, min_gaps=20)
    # alone: 1.0, 1.2, 3.0, the median not the mean
    assert block["alone"]["ratio"] == pytest.approx(1.2)
    assert block["alone"]["repetitions"] == 3
    # arriving: the second repetition has 5 gaps, left out; 2.0 and 3.0
    assert block["arriving"]["ratio"] == pytest.approx(2.5)
    assert block["arriving"]["repetitions"] == 2
    assert block["arriving"]["first_ms"] == (20.0, 10.0)
    none = single_passes.block_ratio(real, predicted, min_gaps=40)
    assert none["alone"] == {"repetitions": 0, "ratio": None, "first_ms": None}
