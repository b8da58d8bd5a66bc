"""benchmarks/gate_by_day.py: the bracketing gate of each kept measurement, from its
floor_drift JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_modules import load_benchmark

bench = load_benchmark("gate_by_day")


def deployment(agrees: bool, quiet: bool, ttft: float, itl: float) -> dict:
    return {
        "agrees": agrees,
        "quiet": quiet,
        "judged": agrees and quiet,
        "noise": {"ttft_ln_sd": ttft, "itl_ln_sd": itl},
    }


DRIFT = {
    "band": 0.05,
    "max_noise": 0.045,
    "deployments": {
        "llamacpp/defaults": deployment(True, False, 0.07, 0.09),
        "llamacpp/matched": deployment(False, False, 0.07, 0.09),
        "vllm_v1/defaults": deployment(True, True, 0.03, 0.041),
        "vllm_v1/matched": deployment(False, True, 0.03, 0.041),
    },
}


def test_a_deployment_is_judged_only_where_its_bracket_agrees_and_its_engine_is_quiet() -> None:
    row = bench.gate_row("day", DRIFT)
    assert row["agree"] == ["llamacpp/defaults", "vllm_v1/defaults"]
    assert row["quiet_engines"] == ["vllm_v1"]
    assert row["judged"] == ["vllm_v1/defaults"]
    assert row["noise"] == {"llamacpp": 0.09, "vllm_v1": 0.041}  # the larger of the two


def test_the_table_has_a_row_a_measurement(tmp_path: Path, monkeypatch) -> None:
    none_judged = json.loads(json.dumps(DRIFT))
    for d in none_judged["deployments"].values():
        d["judged"] = False
    (tmp_path / "floor_drift-a.json").write_text(json.dumps(DRIFT), "utf-8")
    (tmp_path / "floor_drift-b.json").write_text(json.dumps(none_judged), "utf-8")
    monkeypatch.setattr(bench, "DATA", tmp_path)
    out = tmp_path / "gate.json"
    monkeypatch.setattr("sys.argv", ["gate_by_day.py", "a", "b", "--json", str(out)])
    assert bench.main() == 0
    record = json.loads(out.read_text("utf-8"))
    t = record["totals"]
    assert (t["measurements"], t["judged_any"], t["judged_all"]) == (2, 1, 0)
    assert (t["brackets_agreeing"], t["deployments"]) == (4, 8)
    assert (t["engine_days_quiet"], t["engine_days"]) == (2, 4)
    assert t["median_noise"] == {"llamacpp": 0.09, "vllm_v1": 0.041}
    lines = bench.markdown(record["measurements"])
    assert lines[2] == "| a | 2 of 4 | 1 of 2 | vllm_v1/defaults | 0.090 | 0.041 |"
    assert lines[3].startswith("| b | 2 of 4 | 1 of 2 | none |")


def test_a_measurement_without_its_file_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "DATA", tmp_path)
    monkeypatch.setattr("sys.argv", ["gate_by_day.py", "missing"])
    with pytest.raises(SystemExit, match=r"measurement missing: no .*floor_drift-missing\.json"):
        bench.main()
