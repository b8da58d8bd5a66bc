"""benchmarks/sim_vs_real_ceiling.py: the draws of the runs' levels, the nearest slowdown of the
grid, and the tally of checks over draws (docs/simulator.md, "The floor's prices on the engine's
own steps")."""

from __future__ import annotations

import math

import numpy as np
import pytest
from benchmark_modules import load_benchmark

ceiling = load_benchmark("sim_vs_real_ceiling")

RUNS = [
    ("defaults", "vllm_v1", "rate-4.00", "rep1"),
    ("defaults", "vllm_v1", "rate-4.00", "rep2"),
    ("defaults", "vllm_v1", "rate-6.00", "rep1"),
    ("matched", "vllm_v1", "rate-4.00", "rep1"),
]


def test_the_nearest_slowdown_is_nearest_in_ln_and_clipped_to_the_grid() -> None:
    grid = ceiling.GRID
    assert grid[0] == 0.9 and grid[-1] == 1.1 and len(grid) == 11
    assert ceiling.nearest_scale(1.0, grid) == 1.0
    assert ceiling.nearest_scale(1.029, grid) == 1.02
    assert ceiling.nearest_scale(1.031, grid) == 1.04
    assert ceiling.nearest_scale(0.5, grid) == 0.9
    assert ceiling.nearest_scale(2.0, grid) == 1.1


def test_without_spread_every_level_is_one() -> None:
    levels = ceiling.draw_levels(np.random.default_rng(1), RUNS, 0.0, 0.0)
    assert levels == dict.fromkeys(RUNS, 1.0)


def test_a_deployments_runs_share_its_level() -> None:
    levels = ceiling.draw_levels(np.random.default_rng(7), RUNS, 0.0, 0.05)
    defaults = {levels[r] for r in RUNS[:3]}
    assert len(defaults) == 1  # one deployment, one level
    assert levels[RUNS[3]] != levels[RUNS[0]]
    # with a run's own spread they part, and the same seed draws the same levels again
    own = ceiling.draw_levels(np.random.default_rng(7), RUNS, 0.03, 0.05)
    assert len({own[r] for r in RUNS[:3]}) == 3
    assert own == ceiling.draw_levels(np.random.default_rng(7), RUNS, 0.03, 0.05)


def test_the_levels_spread_as_asked() -> None:
    rng = np.random.default_rng(3)
    logs = [
        math.log(v) for _ in range(400) for v in ceiling.draw_levels(rng, RUNS, 0.04, 0.0).values()
    ]
    assert np.std(logs) == pytest.approx(0.04, rel=0.1)


def test_checks_are_named_and_tallied_over_draws() -> None:
    summary = {
        "series": [
            {
                "engine": "vllm_v1",
                "arm": "defaults",
                "checks": [
                    {"condition": "rate-4.00", "metric": "throughput", "met": True},
                    {"condition": "rate-4.00", "metric": "ttft_p50", "met": False},
                ],
                "saturation_met": True,
            }
        ]
    }
    assert ceiling.check_outcomes(summary) == {
        "vllm_v1/defaults rate-4.00 throughput": True,
        "vllm_v1/defaults rate-4.00 ttft_p50": False,
        "vllm_v1/defaults saturation": True,
    }
    # three draws: all 3 of 3 met, 2 of 3, and 2 of 2 (a draw with one TTFT check fewer)
    out = ceiling.ceiling_summary(
        [3, 2, 2], [3, 3, 2], {"a": [True, True, True], "b": [True, False]}
    )
    assert out["draws"] == 3 and (out["checked_min"], out["checked_max"]) == (2, 3)
    assert out["all_met_share"] == pytest.approx(2 / 3, abs=1e-4)
    assert out["met_mean"] == pytest.approx(7 / 3, abs=0.01)
    assert out["per_check"]["b"] == {"draws": 2, "met_share": 0.5}


def test_the_grid_gives_the_ceiling_its_runs_before_they_are_made(tmp_path) -> None:
    from servelab.grid.config import load_config

    config = load_config("config/config.yaml", ["config/cpu-pair.yaml", "config/sim-vs-real.yaml"])
    # no real run under results: the loaded runs are none, the grid's are all of them
    assert ceiling.ceiling_runs(config, tmp_path, grid=False, repetitions=None) == []
    two = ceiling.ceiling_runs(config, tmp_path, grid=True, repetitions=None)
    four = ceiling.ceiling_runs(config, tmp_path, grid=True, repetitions=4)
    assert {r[3] for r in two} == {"rep1", "rep2"}
    assert {r[3] for r in four} == {"rep1", "rep2", "rep3", "rep4"}
    assert len(four) == 2 * len(two)
    assert {r[:3] for r in four} == {r[:3] for r in two}
    assert {r[1] for r in four} == {"llamacpp", "vllm_v1"}
    # in the loaded runs' order (their paths sorted), so one seed draws the same levels for both
    assert four == sorted(four)
    for arm, engine, condition, rep in two:
        run_json = tmp_path / "runs" / arm / engine / condition / rep / "run.json"
        run_json.parent.mkdir(parents=True)
        run_json.write_text("{}")
    assert ceiling.ceiling_runs(config, tmp_path, grid=False, repetitions=None) == two
