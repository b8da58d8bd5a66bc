"""benchmarks/sim_vs_real_slowdown.py's reading of a prediction at several slowdowns: the slowdown
that gives a real run's value (its X, TTFT p50 or the engine's own step count)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> Any:
    sys.path.insert(0, str(REPO / "benchmarks"))
    path = REPO / "benchmarks" / "sim_vs_real_slowdown.py"
    spec = importlib.util.spec_from_file_location("sim_vs_real_slowdown", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sim_vs_real_slowdown"] = module
    spec.loader.exec_module(module)
    return module


slowdown = _load()
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
