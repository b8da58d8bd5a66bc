"""benchmarks/sim_vs_real_replay.py: a loaded run predicted again with every request sent at the
real run's own time, so that the two sides' requests meet alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from benchmark_modules import load_benchmark

from servelab.sim.runner import RunOutcome, run_trace
from servelab.sim.testing import small_vllm
from servelab.workload.loader import LoadedTrace, Prompt
from servelab.workload.release import TraceRequest

replay = load_benchmark("sim_vs_real_replay")

# one graph: a planner, two workers after it (0.2 s of tool call), an aggregator after both
GRAPH = (
    TraceRequest("g0-planner", 0, "planner", 0.0, (), 0.0, 8),
    TraceRequest("g0-w1", 0, "worker", 0.0, ("g0-planner",), 0.2, 8),
    TraceRequest("g0-w2", 0, "worker", 0.0, ("g0-planner",), 0.2, 8),
    TraceRequest("g0-aggregator", 0, "aggregator", 0.0, ("g0-w1", "g0-w2"), 0.0, 8),
)


def _trace() -> LoadedTrace:
    ids = np.arange(1, 65, dtype=np.int32)
    prompts = {r.request_id: Prompt(text=r.request_id, token_ids=ids) for r in GRAPH}
    return LoadedTrace(manifest={"seed": 1}, requests=GRAPH, prompts=prompts, trace_sha256="x")


def _run(trace: LoadedTrace) -> RunOutcome:
    return run_trace(
        small_vllm(),
        trace.requests,
        {rid: p.token_ids for rid, p in trace.prompts.items()},
        warmups=[],
        request_timeout_s=60.0,
        stream_interval=1,
        telemetry_step_s=1.0,
    )


def _sent_after_start(trace: LoadedTrace) -> dict[str, float]:
    outcome = _run(trace)
    return {
        r.request_id: r.sent_s - outcome.trace_start_s
        for r in outcome.records
        if r.sent_s is not None
    }


def test_the_simulator_sends_each_replayed_request_at_its_real_time() -> None:
    # the workers sent before the planner could have finished, the aggregator before the workers
    arrivals = {"g0-planner": 0.0, "g0-w1": 0.001, "g0-w2": 0.5, "g0-aggregator": 0.002}
    as_traced = _sent_after_start(_trace())
    assert as_traced["g0-w1"] > 0.2  # released by the planner's end and its tool call
    sent = _sent_after_start(replay.replayed(_trace(), arrivals))
    assert sent == pytest.approx(arrivals, abs=1e-9)


def test_replaying_a_runs_own_send_times_gives_its_own_times_to_first_token() -> None:
    # the replay changes when requests are sent, and nothing else
    def first_tokens(trace: LoadedTrace) -> dict[str, float]:
        outcome = _run(trace)
        return {
            r.request_id: float(r.chunk_times_s[0]) - r.sent_s
            for r in outcome.records
            if r.sent_s is not None
        }

    own = first_tokens(replay.replayed(_trace(), _sent_after_start(_trace())))
    assert own == pytest.approx(first_tokens(_trace()), abs=1e-12)


def test_a_request_the_real_run_never_sent_is_left_out() -> None:
    replayed = replay.replayed(_trace(), {"g0-w2": 0.3, "g0-planner": 0.1})
    assert [
        (r.request_id, r.arrival_s, r.depends_on, r.tool_delay_s) for r in replayed.requests
    ] == [
        ("g0-planner", 0.1, (), 0.0),
        ("g0-w2", 0.3, (), 0.0),
    ]


def _write_run(folder: Path, rows: list[tuple[str, bool, float | None, list[float]]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"trace_start_s": 0.25}))
    table = pa.table(
        {
            "request_id": [r[0] for r in rows],
            "warmup": [r[1] for r in rows],
            "sent_s": pa.array([r[2] for r in rows], pa.float64()),
            "chunk_times_s": pa.array([r[3] for r in rows], pa.list_(pa.float64())),
        }
    )
    pq.write_table(table, folder / "requests.parquet")
    return folder


def test_the_real_arrivals_are_after_the_trace_start_without_warm_ups_or_unsent(
    tmp_path: Path,
) -> None:
    run = _write_run(
        tmp_path / "real",
        [
            ("warmup-00", True, 0.01, [0.02]),
            ("a", False, 0.30, [0.32, 0.33]),
            ("b", False, 1.25, [1.3]),
            ("c", False, None, []),
        ],
    )
    assert replay.real_arrivals(run) == pytest.approx({"a": 0.05, "b": 1.0})


def test_requests_are_split_by_whether_they_met_another_on_the_real_run(tmp_path: Path) -> None:
    # a and d alone; c is sent before b's first token, so b and c both met another; e is sent
    # while f is in flight, and met it, while f had its first token before e came, so is lone
    # for its TTFT; the warm-up is never counted
    real = _write_run(
        tmp_path / "real",
        [
            ("warmup-00", True, -1.0, [-0.9]),
            ("a", False, 0.0, [0.02, 0.10]),
            ("b", False, 1.0, [1.05, 1.20]),
            ("c", False, 1.03, [1.07, 1.30]),
            ("d", False, 2.0, [2.02, 2.10]),
            ("f", False, 3.0, [3.01, 3.50]),
            ("e", False, 3.2, [3.22, 3.30]),
        ],
    )
    # the prediction: half the real TTFT for b, c and e, the same for the rest
    halved = {"b", "c", "e"}
    predicted = _write_run(
        tmp_path / "predicted",
        [
            (rid, warmup, sent, [sent + (0.5 if rid in halved else 1.0) * (first - sent)])
            for rid, warmup, sent, (first, *_rest) in [
                ("warmup-00", True, -1.0, [-0.9]),
                ("a", False, 0.0, [0.02]),
                ("b", False, 1.0, [1.05]),
                ("c", False, 1.03, [1.07]),
                ("d", False, 2.0, [2.02]),
                ("f", False, 3.0, [3.01]),
                ("e", False, 3.2, [3.22]),
            ]
        ],
    )
    split = replay.per_request_ratios(real, predicted)
    assert sorted(split["lone"]) == pytest.approx([1.0, 1.0, 1.0])  # a, d, f
    assert sorted(split["met"]) == pytest.approx([0.5, 0.5, 0.5])  # b, c, e
