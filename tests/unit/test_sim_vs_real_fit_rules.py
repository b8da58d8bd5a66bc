"""benchmarks/sim_vs_real_fit_rules.py: the floor shapes a fit leaves out, and the checks it
reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_modules import load_benchmark

from servelab.sim.cpu_fit import FloorRun

fit_rules = load_benchmark("sim_vs_real_fit_rules")


def _run(shape: str, rep: str) -> FloorRun:
    root = Path("results/floor")
    return FloorRun(
        run_dir=root / "dep" / "runs" / "defaults" / "llamacpp" / shape / rep,
        trace_dir=root / "traces" / shape / rep,
        engine="llamacpp",
        arm="defaults",
        flags=(),
    )


def test_a_fit_without_a_floor_shape_leaves_out_exactly_its_runs() -> None:
    runs = [
        _run(shape, rep)
        for shape in ("floor-s0.00-L512", "floor-s0.00-L512-x2")
        for rep in ("rep1", "rep2")
    ]
    kept = fit_rules.without_floors(runs, ["floor-s0.00-L512-x2"])
    assert kept == runs[:2]
    assert fit_rules.without_floors(runs, []) == runs
    # a misspelt shape would leave the fit as it was: refused, naming it and the floor's shapes
    with pytest.raises(
        SystemExit, match=r"floor-s0\.00-L512-x3: no floor run.*floor-s0\.00-L512-x2"
    ):
        fit_rules.without_floors(runs, ["floor-s0.00-L512-x3"])


def test_the_tally_keeps_every_checks_ratio_and_lists_the_misses() -> None:
    checks = [
        {"condition": "rate-0.50", "metric": "ttft_p50", "ratio": 0.9, "met": True},
        {"condition": "rate-1.00", "metric": "ttft_p50", "ratio": 0.6, "met": False},
    ]
    summary = {
        "series": [
            {
                "engine": "llamacpp",
                "arm": "defaults",
                "met": 1,
                "checked": 2,
                "saturation_met": True,
                "saturation_ratio": 1.02,
                "checks": checks,
            }
        ]
    }
    got = fit_rules.tally(summary)
    series = got["series"]["llamacpp/defaults"]
    assert series["ratios"] == {"rate-0.50 ttft_p50": 0.9, "rate-1.00 ttft_p50": 0.6}
    assert series["missed"] == ["rate-1.00 ttft_p50 0.6"]
    assert (got["met"], got["checked"]) == (2, 3)
