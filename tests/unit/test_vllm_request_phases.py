"""What benchmarks/vllm_request_phases.py reads: a run's means of vLLM V1's own queue and
prefill histograms over its window, and the same split recorded from the simulated engine
(docs/simulator.md, "The front end on the engine's own clock")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from benchmark_modules import load_benchmark

from servelab.artifacts import REQUESTS_SCHEMA, write_parquet
from servelab.sim import vllm as sim_vllm
from servelab.sim.testing import drive, small_vllm

phases = load_benchmark("vllm_request_phases")


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
    def row(rid: str, sent_s: float, first_s: float, warmup: bool = False) -> dict[str, Any]:
        return {
            "run_id": "r",
            "request_id": rid,
            "graph_id": -1 if warmup else 1,
            "role": "warmup" if warmup else "worker",
            "warmup": warmup,
            "scheduled_s": sent_s,
            "sent_s": sent_s,
            "written_s": sent_s,
            "chunk_times_s": [first_s, first_s + 0.01],
            "chunk_tokens": [1, 1],
            "prompt_tokens": 10,
            "output_tokens": 2,
            "max_tokens": 2,
            "status": "ok",
            "error": None,
        }

    rows = [row("a", 0.0, 0.030), row("b", 0.005, 0.080), row("w", 0.0, 0.010, warmup=True)]
    write_parquet(
        tmp_path / "requests.parquet", pa.Table.from_pylist(rows, REQUESTS_SCHEMA), REQUESTS_SCHEMA
    )
    starts = [0.0, 0.020, 0.040, 0.060]
    marks = {
        "a": {"ready": 0.0, "admit": 0.0, "first_ts": 0.020},
        # ready at 15 ms: held from the step at 20 ms, admitted at 40 ms
        "b": {"ready": 0.015, "admit": 0.040, "first_ts": 0.060},
        "w": {"ready": 0.0, "admit": 0.0, "first_ts": 0.005},  # a warm-up: not in the means
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
