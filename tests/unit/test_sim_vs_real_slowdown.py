"""benchmarks/sim_vs_real_slowdown.py's reading of a prediction at several slowdowns: the slowdown
that gives a real run's value (its X, TTFT p50 or the engine's own step count)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark

slowdown = load_benchmark("sim_vs_real_slowdown")
# near saturation a slower platform takes fewer, fuller steps and gives a longer TTFT
ROWS = [
    {"scale": 0.9, "steps": 1219, "ttft_p50_s": 0.048, "x_rps": 33.4},
    {"scale": 1.0, "steps": 961, "ttft_p50_s": 0.058, "x_rps": 33.1},
    {"scale": 1.1, "steps": 716, "ttft_p50_s": 0.074, "x_rps": 32.9},
]


def test_the_slowdown_that_gives_a_real_value_is_interpolated() -> None:
    assert slowdown.matching_slowdown(1056, ROWS, "steps") == pytest.approx(0.963, abs=1e-3)
    assert slowdown.matching_slowdown(0.0544, ROWS, "ttft_p50_s") == pytest.approx(0.964, abs=1e-3)
    assert slowdown.x_matching_slowdown(33.0, ROWS) == pytest.approx(1.05, abs=1e-3)


def test_a_real_value_outside_the_predictions_has_no_slowdown() -> None:
    assert slowdown.matching_slowdown(1300, ROWS, "steps") is None
    assert slowdown.matching_slowdown(0.03, ROWS, "ttft_p50_s") is None


def test_a_slowed_platform_scales_its_passes_not_its_after_idle_term() -> None:
    from servelab.sim.cpu_platform import StepCost

    cost = StepCost.from_mapping(
        "vllm_v1",
        {
            "step_s": 0.004,
            "per_admitted_s": 0.005,
            "per_sampled_s": 0.0002,
            "per_token_s": 1e-5,
            "per_attn_pair_s": 1e-9,
            "per_kv_token_s": 1e-7,
            "idle_gain": 0.2,
            "idle_rise_s": 0.15,
            "idle_decay_s": 0.009,
        },
        "test",
    )
    slowed = slowdown.slowed_by(cost, 1.1)
    assert slowed.step_s == pytest.approx(0.0044)
    assert slowed.front_end_s == pytest.approx(0.0055)
    assert slowed.after_idle() == cost.after_idle()
    features = dict(tokens=10, seqs=2, sampled=2, attn_pairs=0.0, kv_tokens=100.0, cuda_graph=False)
    assert slowed.iteration_time(**features) == pytest.approx(1.1 * cost.iteration_time(**features))


def test_the_platform_file_is_the_given_one_or_the_results_own(tmp_path: Path) -> None:
    own = tmp_path / "sim_vs_real" / "platform.json"
    with pytest.raises(SystemExit, match=re.escape(str(own))):
        slowdown.platform_file(tmp_path)
    own.parent.mkdir()
    own.write_text("{}")
    assert slowdown.platform_file(tmp_path) == own
    other = tmp_path / "other.json"
    with pytest.raises(SystemExit, match=re.escape(str(other))):
        slowdown.platform_file(tmp_path, other)
    other.write_text("{}")
    assert slowdown.platform_file(tmp_path, other) == other
