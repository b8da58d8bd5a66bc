"""benchmarks/vllm_passes_by_run.py: a traced deployment's single-request decode steps, split
into those made alone and those during another request's arrival, with the API server's output
work in each (docs/simulator.md, "Why vLLM's passes run slower in the loaded runs")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_modules import load_benchmark

bench = load_benchmark("vllm_passes_by_run")
trace = load_benchmark("vllm_request_trace")
Event = trace.Event

A, B = "cmpl-a-0-0a1b2c3d", "cmpl-b-0-00ff00ff"


def ev(t: float, kind: str, *fields: object) -> Event:
    return Event(t, "p", "MainThread", kind, tuple(map(str, fields)))


def step(start: float, batch: str, execute: float = 0.005) -> list[Event]:
    return [
        ev(start + 0.0001, "ec_sched", f"{start:.6f}", "", "1", "1", "0", "1", batch),
        ev(start + 0.0001 + execute, "ec_update_in"),
        ev(start + 0.0002 + execute, "ec_stepend"),
    ]


def events() -> list[Event]:
    out = [
        *step(1.000, f"{A}:1:1024:1024"),
        *step(1.006, f"{A}:1:1025:1024"),
        *step(1.013, f"{A}:1:1026:1024"),
        *step(1.020, f"{A}:1:1027:1024"),
        # A's own output, and B's front end in A's third cycle
        ev(1.0053, "fe_out", "0", A),
        ev(1.0060, "fe_out_done", "1"),
        # a call across the second cycle's end (1.013): 1 ms in it, 1 ms in the third
        ev(1.0120, "fe_out", "0", A),
        ev(1.0140, "fe_out_done", "1"),
        ev(1.0150, "fe_in", "cmpl-b-0"),
        ev(1.0160, "fe_send", B),
        ev(1.0000, "clock", "1000.0"),
    ]
    return sorted(out, key=lambda e: e.t)


def test_a_step_is_during_an_arrival_only_when_another_requests_front_end_runs_in_its_cycle() -> (
    None
):
    evs = events()
    rows = bench.classify(trace.lone_decodes(trace.steps_of(evs)), evs)
    # the last step is A's last: no cycle
    assert [r["arrival"] for r in rows] == [False, False, True]
    assert rows[0]["cycle"] == pytest.approx(0.006)
    assert rows[0]["execute"] == pytest.approx(0.005)
    assert rows[0]["outputs"] == pytest.approx(0.0007)  # process_outputs inside the cycle
    assert rows[1]["outputs"] == pytest.approx(0.001)
    assert rows[2]["outputs"] == pytest.approx(0.001)
    own = [ev(1.0150, "fe_in", "cmpl-a-0"), ev(1.0160, "fe_send", A)]
    evs2 = sorted([e for e in evs if e.kind not in ("fe_in", "fe_send")] + own, key=lambda e: e.t)
    rows2 = bench.classify(trace.lone_decodes(trace.steps_of(evs2)), evs2)
    assert [r["arrival"] for r in rows2] == [False, False, False]


def test_the_summary_is_the_parts_medians_in_ms() -> None:
    rows = [
        {"cycle": c, "schedule": 0.0001, "execute": c - 0.001, "update": 0.0001}
        | {"between": 0.0005, "outputs": 0.0}
        for c in (0.006, 0.007, 0.010)
    ]
    out = bench.summarise(rows)
    assert out["steps"] == 3
    assert out["cycle"] == 7.0 and out["execute"] == 6.0
    assert bench.summarise([]) == {"steps": 0}


def test_runs_are_found_by_kind_for_vllm_only(tmp_path: Path) -> None:
    for rel in (
        "floor/d/runs/defaults/vllm_v1/floor-s0.00-L128/rep1",
        "floor-after/d/runs/defaults/vllm_v1/floor-s0.00-L128/rep1",
        "runs/defaults/vllm_v1/rate-0.50/rep2",
        "runs/defaults/llamacpp/rate-0.50/rep1",
    ):
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "run.json").write_text(json.dumps({}))
    kinds = [(k, str(p.relative_to(tmp_path))) for k, p in bench.run_dirs(tmp_path)]
    assert kinds == [
        ("floor", "floor/d/runs/defaults/vllm_v1/floor-s0.00-L128/rep1"),
        ("floor-after", "floor-after/d/runs/defaults/vllm_v1/floor-s0.00-L128/rep1"),
        ("loaded", "runs/defaults/vllm_v1/rate-0.50/rep2"),
    ]
