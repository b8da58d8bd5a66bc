"""What benchmarks/vllm_request_phases.py reads: a run's means of vLLM V1's own queue and
prefill histograms over its window, and the same split recorded from the simulated engine
(docs/simulator.md, "The front end on the engine's own clock")."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servelab.sim import vllm as sim_vllm
from servelab.sim.testing import drive, small_vllm

REPO = Path(__file__).resolve().parents[2]


def _load(name: str) -> Any:
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


phases = _load("vllm_request_phases")


def test_a_windows_means_are_the_increase_of_sum_over_count() -> None:
    # counters before the window and at its closing scrape
    values = {
        ("vllm:request_queue_time_seconds_sum", 99.5): 1.0,
        ("vllm:request_queue_time_seconds_sum", 113.0): 1.6,
        ("vllm:request_queue_time_seconds_count", 99.5): 10.0,
        ("vllm:request_queue_time_seconds_count", 113.0): 40.0,
        ("vllm:request_prefill_time_seconds_sum", 99.5): 0.5,
        ("vllm:request_prefill_time_seconds_sum", 113.0): 0.5 + 30 * 0.015,
        ("vllm:request_prefill_time_seconds_count", 99.5): 10.0,
        ("vllm:request_prefill_time_seconds_count", 113.0): 40.0,
        ("vllm:time_to_first_token_seconds_sum", 99.5): 2.0,
        ("vllm:time_to_first_token_seconds_sum", 113.0): 2.0,
        ("vllm:time_to_first_token_seconds_count", 99.5): 10.0,
        ("vllm:time_to_first_token_seconds_count", 113.0): 10.0,
    }
    means = phases.histogram_means(lambda expr, t: values[(expr, t)], 100.0, 110.0)
    assert means["queue"] == pytest.approx(0.6 / 30)
    assert means["prefill"] == pytest.approx(0.015)
    assert means["queue_requests"] == 30
    assert means["ttft_engine"] is None  # nothing completed the phase in the window


def test_recording_admissions_sees_a_busy_arrival_admitted_at_the_next_step() -> None:
    original = (sim_vllm.VllmModel.step, sim_vllm.VllmModel._allocate)
    prompt = np.arange(1, 600, dtype=np.int64)
    with phases.recording_admissions() as (marks, starts):
        model = small_vllm()
        its = drive(model, [(0.0, "a", prompt, 4), (1e-4, "b", prompt + 1000, 4)])
    assert (sim_vllm.VllmModel.step, sim_vllm.VllmModel._allocate) == original
    assert starts == [it.start_s for it in its]
    assert marks["a"]["admit"] == 0.0
    # b arrived during the first step: the next step admits it
    assert marks["b"]["admit"] == pytest.approx(its[1].start_s)
    assert marks["b"]["ready"] == pytest.approx(1e-4)
    first_b = next(it for it in its if "b" in it.emitted)
    assert marks["b"]["first_ts"] == pytest.approx(first_b.end_s)


def test_predicted_means_use_the_engines_definitions(tmp_path: Path) -> None:
    rows = [
        {
            "request_id": "a",
            "warmup": False,
            "status": "ok",
            "sent_s": 0.0,
            "chunk_times_s": [0.030],
            "chunk_tokens": [1],
        },
        {
            "request_id": "b",
            "warmup": False,
            "status": "ok",
            "sent_s": 0.005,
            "chunk_times_s": [0.080],
            "chunk_tokens": [1],
        },
        {
            "request_id": "w",
            "warmup": True,
            "status": "ok",
            "sent_s": 0.0,
            "chunk_times_s": [0.010],
            "chunk_tokens": [1],
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "requests.parquet")
    starts = [0.0, 0.020, 0.040, 0.060]
    marks = {
        "a": {"ready": 0.0, "admit": 0.0, "first_ts": 0.020},
        # ready at 15 ms: held from the step at 20 ms, admitted at 40 ms
        "b": {"ready": 0.015, "admit": 0.040, "first_ts": 0.060},
    }
    out = phases.predicted_means(marks, starts, tmp_path / "requests.parquet")
    assert out["requests"] == 2
    assert out["queue"] == pytest.approx((0.0 + 0.020) / 2)
    assert out["prefill"] == pytest.approx((0.020 + 0.020) / 2)
    assert out["ttft_client"] == pytest.approx((0.030 + 0.075) / 2)
    rest = phases.with_rest(out)["rest"]
    assert rest == pytest.approx(1e3 * ((0.030 + 0.075) / 2 - 0.010 - 0.020), abs=1e-3)


def test_rest_is_in_ms_and_counts_stay_counts() -> None:
    real = {"queue": 0.002, "queue_requests": 30.0, "prefill": 0.015, "ttft_client": 0.030}
    out = phases.with_rest(real)
    assert out["queue"] == pytest.approx(2.0) and out["prefill"] == pytest.approx(15.0)
    assert out["queue_requests"] == 30.0
    assert out["rest"] == pytest.approx(13.0)
    assert "rest" not in phases.with_rest({"queue": None, "prefill": 0.01, "ttft_client": 0.02})
