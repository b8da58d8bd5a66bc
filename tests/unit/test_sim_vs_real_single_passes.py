"""benchmarks/sim_vs_real_single_passes.py: a run's single-request passes, alone or while
another request is on its way in, and their real ÷ predicted gap by block."""

from __future__ import annotations

import pytest

from tests.benchmark_modules import load_benchmark

single_passes = load_benchmark("sim_vs_real_single_passes")


def request(sent: float, chunks: list[float], warmup: bool = False) -> dict:
    return {"sent_s": sent, "chunk_times_s": chunks, "warmup": warmup}


def test_a_gap_is_alone_arriving_or_not_single_by_the_other_requests_around_it() -> None:
    rows = [
        # decodes 1.00-1.05 alone, then while the second is on its way in (sent 1.06, first
        # chunk 1.12), then beside it
        request(0.9, [1.00, 1.02, 1.05, 1.08, 1.11, 1.14, 1.17]),
        request(1.06, [1.12, 1.30, 1.33]),
        # a warm-up decoding throughout is not the trace's, and does not make a pass shared
        request(0.0, [0.5, 2.0], warmup=True),
        request(3.0, []),
    ]
    gaps = single_passes.single_pass_gaps(rows)
    # the first request: 1.00-1.02 and 1.02-1.05 alone; 1.05-1.08, 1.08-1.11 and 1.11-1.14
    # while the second is sent and has no chunk yet; 1.14-1.17 while the second decodes through
    # it (first chunk 1.12, last 1.33): not a single pass. The second request: 1.12-1.30 and
    # 1.30-1.33 alone, since the first, ending at 1.17, decodes through neither.
    assert gaps["alone"] == pytest.approx([0.02, 0.03, 0.18, 0.03])
    assert gaps["arriving"] == pytest.approx([0.03, 0.03, 0.03])


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
