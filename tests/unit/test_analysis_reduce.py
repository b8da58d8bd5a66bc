"""Request and run metrics from hand-built requests tables: chunks, tokens, exclusions, X, telemetry."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.analysis.reduce import reduce_requests, reduce_telemetry, run_metrics
from servelab.analysis.synthetic import requests_table, telemetry_table
from servelab.artifacts import ArtifactError

RUN = "defaults/vllm/rate-0.12/rep1"


def _metrics(rows: list[dict], **kw: bool):
    return run_metrics(reduce_requests(requests_table(rows, RUN), "requests.parquet"), **kw)


def test_chunks_carrying_several_tokens_use_the_usage_count() -> None:
    # 3 chunks carrying 1 + 3 + 4 = 8 tokens: TPOT divides by n − 1 = 7, not by 2 chunk gaps.
    req = reduce_requests(
        requests_table(
            [
                {
                    "request_id": "r",
                    "graph_id": 1,
                    "role": "planner",
                    "sent_s": 10.0,
                    "chunk_times_s": [10.5, 10.7, 11.2],
                    "chunk_tokens": [1, 3, 4],
                    "output_tokens": 8,
                }
            ],
            RUN,
        ),
        "x",
    )
    assert req.ttft[0] == pytest.approx(0.5)
    assert req.tpot[0] == pytest.approx(0.7 / 7)
    assert req.e2e[0] == pytest.approx(1.2)


def test_usage_count_wins_over_chunk_tokens_and_fills_in_when_missing() -> None:
    rows = [
        # Usage says 11 tokens although the chunks account for 2: usage is the token count.
        {"request_id": "a", "graph_id": 1, "role": "worker", "chunk_times_s": [1.0, 2.0],
         "chunk_tokens": [1, 1], "output_tokens": 11},
        # No usage reported: fall back to the chunk-token sum (5).
        {"request_id": "b", "graph_id": 1, "role": "worker", "chunk_times_s": [1.0, 2.0],
         "chunk_tokens": [1, 4], "output_tokens": None},
    ]  # fmt: skip
    req = reduce_requests(requests_table(rows, RUN), "x")
    assert req.tpot == pytest.approx([0.1, 0.25])


def test_tpot_undefined_for_one_output_token() -> None:
    rows = [
        {"request_id": "one", "graph_id": 1, "role": "planner", "sent_s": 0.0,
         "chunk_times_s": [0.4], "output_tokens": 1},
        # Two tokens in a single chunk: n = 2, TPOT = 0 / 1.
        {"request_id": "two", "graph_id": 1, "role": "planner", "sent_s": 0.0,
         "chunk_times_s": [0.6], "chunk_tokens": [2], "output_tokens": 2},
    ]  # fmt: skip
    req = reduce_requests(requests_table(rows, RUN), "x")
    assert math.isnan(req.tpot[0])
    assert req.tpot[1] == 0.0
    m = run_metrics(req)
    # TTFT still counts both requests; TPOT p50 only the one with n ≥ 2.
    assert m.n_sample == 2
    assert m.ttft_p50 == pytest.approx(0.5)
    assert m.tpot_p50 == 0.0


def _graph(gid: int, ttft: float, sent: float = 100.0, status: str = "ok", role: str = "planner"):
    times = [] if status != "ok" else [sent + ttft, sent + ttft + 1.0]
    return {
        "request_id": f"g{gid}-{role}-{ttft}",
        "graph_id": gid,
        "role": role,
        "sent_s": sent,
        "chunk_times_s": times,
        "status": status,
        "error": None if status == "ok" else "boom",
    }


def test_warmup_and_first_graph_excluded_from_latency() -> None:
    warm = {"request_id": "w", "graph_id": -1, "role": "warmup", "warmup": True, "sent_s": 0.0,
            "chunk_times_s": [0.001, 0.002]}  # fmt: skip
    rows = [warm, _graph(0, 100.0), _graph(0, 90.0), _graph(1, 1.0), _graph(2, 2.0), _graph(3, 3.0)]
    m = _metrics(rows)
    assert m.n_sample == 3
    assert m.ttft_p50 == pytest.approx(2.0)
    assert m.ttft_p95 == pytest.approx(2.9)
    assert sorted(m.ttft) == pytest.approx([1.0, 2.0, 3.0])
    kept = _metrics(rows, exclude_first_graph=False)
    assert kept.n_sample == 5  # graph 0 kept, the warm-up still not
    assert kept.ttft_p50 == pytest.approx(3.0)


def test_failed_requests_are_not_latency_samples_but_count_in_success() -> None:
    rows = [_graph(1, 1.0), _graph(1, 9.0, status="error", role="worker"), _graph(2, 3.0)]
    m = _metrics(rows)
    assert m.n_measured == 3
    assert m.n_measured_success == 2
    assert m.n_sample == 2
    assert m.ttft_p50 == pytest.approx(2.0)
    assert m.role_counts == {"planner": 2, "worker": 1, "aggregator": 0}


def test_throughput_counts_graph_zero_and_spans_first_send_to_last_chunk() -> None:
    warm = {
        "request_id": "w",
        "graph_id": -1,
        "role": "warmup",
        "warmup": True,
        "sent_s": 0.0,
        "chunk_times_s": [500.0],
    }  # fmt: skip (a late warm-up must not stretch W)
    rows = [
        warm,
        {"request_id": "a", "graph_id": 0, "role": "planner", "sent_s": 10.0, "chunk_times_s": [11.0]},
        {"request_id": "b", "graph_id": 1, "role": "planner", "sent_s": 20.0, "chunk_times_s": [25.0]},
        {"request_id": "c", "graph_id": 1, "role": "worker", "sent_s": 30.0, "chunk_times_s": [],
         "status": "timeout", "error": "t"},
        {"request_id": "d", "graph_id": 2, "role": "planner", "sent_s": 40.0,
         "chunk_times_s": [45.0, 50.0]},
    ]  # fmt: skip
    m = _metrics(rows)
    assert m.n_ok == 3  # a (graph 0), b, d; the timeout is not ok
    assert m.window_s == pytest.approx(40.0)  # 10.0 -> 50.0
    assert m.throughput == pytest.approx(3 / 40.0)
    assert m.n_requests == 4


def test_lag_statistics() -> None:
    rows = [
        {"request_id": str(i), "graph_id": 1, "role": "worker", "scheduled_s": 10.0 * i,
         "sent_s": 10.0 * i + lag, "chunk_times_s": [10.0 * i + 1]}
        for i, lag in enumerate([0.001, 0.002, 0.012])
    ]  # fmt: skip
    m = _metrics(rows)
    assert m.lag_median == pytest.approx(0.002)
    assert m.lag_max == pytest.approx(0.012)


def test_mismatched_chunk_lists_name_the_request() -> None:
    rows = [{"request_id": "bad-one", "graph_id": 1, "role": "planner", "chunk_times_s": [1.0, 2.0],
             "chunk_tokens": [1]}]  # fmt: skip
    with pytest.raises(ArtifactError, match=r"requests.parquet: request 'bad-one'"):
        reduce_requests(requests_table(rows, RUN), "requests.parquet")


def test_telemetry_peak_and_preemptions() -> None:
    samples = [
        (0.0, "kv_cache_usage", 0.2),
        (5.0, "kv_cache_usage", 0.95),
        (10.0, "kv_cache_usage", 0.5),
        (0.0, "preemptions_total", 10.0),
        (10.0, "preemptions_total", 13.0),
        (5.0, "preemptions_total", 12.0),
        (0.0, "requests_waiting", 99.0),
    ]
    kv, pre = reduce_telemetry(telemetry_table(samples, RUN, "vllm"))
    assert kv == pytest.approx(0.95)
    assert pre == pytest.approx(3.0)
    kv, pre = reduce_telemetry(telemetry_table([(0.0, "kv_cache_usage", 0.3)], RUN, "sglang"))
    assert kv == pytest.approx(0.3)
    assert np.isnan(pre)  # SGLang exports no preemption counter
