"""benchmarks/measurement_days.py: every bracketed measurement it names has the kept files its
readers (gate_by_day.py, run_speed_witness.py) open by default, so a day misspelt or added before
its files are kept fails here, not in a documented command."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_modules import load_benchmark

days = load_benchmark("measurement_days")
gate = load_benchmark("gate_by_day")


def test_the_days_are_distinct_and_in_the_order_they_were_made() -> None:
    assert len(set(days.BRACKETED_DAYS)) == len(days.BRACKETED_DAYS)
    dates = [day[:10] for day in days.BRACKETED_DAYS]
    assert dates == sorted(dates)


@pytest.mark.parametrize("day", days.BRACKETED_DAYS)
def test_each_day_has_its_comparison_and_its_gate(day: str) -> None:
    assert (gate.DATA / f"sim_vs_real-{day}.csv").is_file()
    summary = json.loads((gate.DATA / f"sim_vs_real-{day}.json").read_text("utf-8"))
    # run_speed_witness.py reads every deployment's per-pass buckets
    assert summary["series"] and all("iterations" in series for series in summary["series"]), day
    drift_tag = gate.FLOOR_DRIFT_TAG.get(day, day)
    drift = json.loads((gate.DATA / f"floor_drift-{drift_tag}.json").read_text("utf-8"))
    assert len(drift["deployments"]) == 4, drift_tag
