"""What benchmarks/vllm_request_trace.py reads off a traced vLLM V1's events: each request's
phases on the engine's clock, the step ends it waits through, and what a step pays for
(docs/simulator.md, "The front end on the engine's own clock")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from benchmark_modules import load_benchmark

from servelab.sim.cpu_platform import StepCost

trace = load_benchmark("vllm_request_trace")
Event = trace.Event


def ev(t_ms: float, kind: str, *fields: object, process: str = "1") -> Any:
    return Event(t_ms / 1e3, process, "MainThread", kind, tuple(str(f) for f in fields))


def request(rid: str, sent_ms: float, chunks_ms: list[float], warmup: bool = False) -> dict:
    return {
        "request_id": rid,
        "warmup": warmup,
        "status": "ok",
        "sent_s": sent_ms / 1e3,
        "chunk_times_s": [t / 1e3 for t in chunks_ms],
        "chunk_tokens": [1] * len(chunks_ms),
    }


def test_client_id_strips_the_servers_prefix_choice_and_engine_suffix() -> None:
    known = {"g00003-planner", "g00003-worker-1"}
    assert trace.client_id("cmpl-g00003-planner-0", known) == "g00003-planner"
    assert trace.client_id("cmpl-g00003-planner-0-95ff1dc0", known) == "g00003-planner"
    assert trace.client_id("cmpl-g00003-worker-1-0-0a1b2c3d", known) == "g00003-worker-1"
    assert trace.client_id("cmpl-g00004-planner-0", known) is None


# The client's sent_s 0 is engine time 101 ms: the offset is the quickest request's send to
# `fe_in`, so its own HTTP phase is 0 by construction.
OFFSET_MS = 101.0


def busy_arrival_events() -> list[Any]:
    """Request a is alone on the engine; b is sent during a's second step, its front end ends in
    that step, and the busy loop puts it in the scheduler only after the step."""
    return [
        ev(101.0, "fe_in", "cmpl-a-0"),
        ev(101.5, "fe_send", "cmpl-a-0-aaaaaaaa"),
        ev(101.6, "ec_recv", "cmpl-a-0-aaaaaaaa", process="2"),
        ev(101.7, "fe_sent", "cmpl-a-0-aaaaaaaa"),
        ev(101.8, "ec_queued", "cmpl-a-0-aaaaaaaa", 0, 0, process="2"),
        ev(102.0, "ec_sched", "0.101900", "cmpl-a-0-aaaaaaaa", 600, 1, process="2"),
        ev(110.0, "ec_stepend", process="2"),
        ev(110.5, "fe_out", "0.110", "cmpl-a-0-aaaaaaaa"),
        ev(110.6, "fe_out_done", 1),
        ev(110.1, "ec_sched", "0.110050", "", 1, 1, process="2"),
        ev(122.0, "fe_in", "cmpl-b-0"),  # sent at 112 (client 11): 10 ms of HTTP on a busy core
        ev(122.5, "fe_send", "cmpl-b-0-bbbbbbbb"),
        ev(122.7, "ec_recv", "cmpl-b-0-bbbbbbbb", process="2"),
        ev(122.9, "fe_sent", "cmpl-b-0-bbbbbbbb"),
        ev(126.0, "ec_stepend", process="2"),
        ev(126.5, "fe_out", "0.126", "cmpl-a-0-aaaaaaaa"),
        ev(126.6, "fe_out_done", 1),
        ev(126.05, "ec_queued", "cmpl-b-0-bbbbbbbb", 0, 1, process="2"),
        ev(126.2, "ec_sched", "0.126100", "cmpl-b-0-bbbbbbbb", 601, 2, process="2"),
        ev(140.0, "ec_stepend", process="2"),
        ev(140.5, "fe_out", "0.140", "cmpl-a-0-aaaaaaaa,cmpl-b-0-bbbbbbbb"),
        ev(140.8, "fe_out_done", 2),
    ]


def test_a_busy_arrival_waits_for_the_running_step_to_end() -> None:
    events = sorted(busy_arrival_events(), key=lambda e: e.t)
    requests = [request("a", 0.0, [15.0, 31.0, 45.0]), request("b", 11.0, [46.0])]
    offset, marks = trace.request_marks(events, requests)
    assert offset == pytest.approx(OFFSET_MS / 1e3)
    b = marks["b"]
    assert b["send"] == pytest.approx(0.112)
    assert b["sched"] == pytest.approx(0.1261)
    assert b["first_ts"] == pytest.approx(0.140)
    steps = trace.steps_of(events)
    assert [round(1e3 * s.start, 2) for s in steps] == [101.9, 110.05, 126.1]
    assert steps[2].new == ("cmpl-b-0-bbbbbbbb",)
    summary = trace.phase_summary(marks, requests, steps)
    assert summary["busy"]["requests"] == 1 and summary["idle"]["requests"] == 1
    busy = summary["busy"]
    assert busy["http_ms"]["median"] == pytest.approx(10.0)
    assert busy["step_end_ms"]["median"] == pytest.approx(126.05 - 122.7)
    assert busy["queue_ms"]["median"] == pytest.approx(126.1 - 126.05)
    assert busy["prefill_ms"]["median"] == pytest.approx(140.0 - 126.1)
    assert busy["to_client_ms"]["median"] == pytest.approx(46.0 + OFFSET_MS - 140.5)
    # the step running at its send (ends at 126) is the one it waits through
    assert busy["step_ends_send_to_ec_queued"]["median"] == 1
    assert busy["step_ends_fe_sent_to_ec_queued"]["median"] == 1
    idle = summary["idle"]
    assert idle["http_ms"]["median"] == pytest.approx(0.0)
    assert idle["step_ends_send_to_ec_queued"]["median"] == 0


def test_the_step_line_recovers_what_each_step_pays_for() -> None:
    # durations built from known costs: 5 ms + 0.02 ms a token + 0.4 ms a request
    # + 3 ms for each front end that starts in the step, nothing for admitting
    steps, fe_in, t = [], [], 0.0
    for k in range(40):
        tokens, reqs, new, fe = 8 + 37 * (k % 5), 1 + k % 7, k % 3 == 0, k % 4 == 1
        dur = (5.0 + 0.02 * tokens + 0.4 * reqs + 3.0 * fe) / 1e3
        steps.append(trace.Step(t, t + dur, tokens, reqs, ("x",) if new else (), 0.0))
        if fe:
            fe_in.append(t + dur / 2)
        t += dur
    sends = [s.start + 1e-4 for s in steps[::6]]
    line = trace.step_line(steps, fe_in, sends)
    assert line is not None
    assert line["base"] == pytest.approx(5.0, abs=1e-3)
    assert line["per_fe_in"] == pytest.approx(3.0, abs=1e-3)
    assert line["per_new_request"] == pytest.approx(0.0, abs=1e-3)
    assert line["per_request"] == pytest.approx(0.4, abs=1e-3)
    assert trace.step_line(steps[:5], fe_in, sends) is None


def test_events_and_the_clock_come_from_every_process_log(tmp_path: Path) -> None:
    (tmp_path / "11.log").write_text(
        "5.000000\tMainThread\tclock\t1005.000000\n6.5\tMainThread\tfe_in\tcmpl-a-0\n"
    )
    (tmp_path / "12.log").write_text(
        "5.100000\tMainThread\tclock\t1005.100000\n6.0\tThread-1\tec_recv\tcmpl-a-0-aaaaaaaa\n"
    )
    events = trace.read_events(tmp_path)
    assert [e.kind for e in events] == ["clock", "clock", "ec_recv", "fe_in"]
    assert events[2].process == "12" and events[2].thread == "Thread-1"
    assert trace.unix_minus_monotonic(events) == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="clock"):
        trace.unix_minus_monotonic(events[2:])


def test_output_batches_price_each_output() -> None:
    events = []
    for k, n in enumerate([1, 4, 8, 2]):
        t = 100.0 * k
        ids = ",".join(f"cmpl-r{i}-0" for i in range(n))
        events += [ev(t, "fe_out", t / 1e3, ids), ev(t + 0.3 + 0.1 * n, "fe_out_done", n)]
    out = trace.output_batches(events)
    assert out["batches"] == 4
    assert out["ms_base"] == pytest.approx(0.3, abs=1e-6)
    assert out["ms_per_output"] == pytest.approx(0.1, abs=1e-6)


def test_a_burst_is_counted_by_place() -> None:
    # three sent 1 ms apart, then one alone; each in turn takes 8 ms more to reach the engine core
    marks = {
        "a": {"send": 0.000, "fe_sent": 0.008},
        "b": {"send": 0.001, "fe_sent": 0.017},
        "c": {"send": 0.002, "fe_sent": 0.026},
        "d": {"send": 0.500, "fe_sent": 0.508},
        "e": {"send": 0.900},  # never handed off: left out
    }
    out = trace.front_end_by_burst(marks)
    assert out == {
        "0": {"requests": 2, "median_ms": 8.0},
        "1": {"requests": 1, "median_ms": 16.0},
        "2": {"requests": 1, "median_ms": 24.0},
    }


def test_the_hooks_batch_is_read_into_each_step() -> None:
    events = [
        ev(
            1.0,
            "ec_sched",
            "0.000900",
            "cmpl-b-0-bb",
            257,
            2,
            3,
            2,
            "cmpl-a-0-aa:1:1100:1024,cmpl-b-0-bb:256:256:1024",
        ),
        ev(9.0, "ec_stepend"),
        ev(9.1, "ec_sched", "0.009050", "", 1, 1),  # a log written before the hook had batches
        ev(12.0, "ec_stepend"),
    ]
    first, second = trace.steps_of(events)
    assert (first.waiting, first.running) == (3, 2)
    assert first.batch == (
        trace.Scheduled("cmpl-a-0-aa", 1, 1100, 1024),
        trace.Scheduled("cmpl-b-0-bb", 256, 256, 1024),
    )
    assert (second.waiting, second.batch) == (-1, ())


def test_a_lone_decode_is_split_at_its_marks_and_a_step_without_them_is_left_out() -> None:
    def decode(start_ms: float, context: int, update_in: bool = True) -> list[Any]:
        batch = f"cmpl-a-0-aa:1:{context}:1024"
        marks = [ev(start_ms + 0.2, "ec_sched", f"{start_ms / 1e3:.6f}", "", 1, 1, 0, 1, batch)]
        if update_in:  # the forward pass ends 5 ms after the schedule returned
            marks.append(ev(start_ms + 5.2, "ec_update_in"))
        return [*marks, ev(start_ms + 5.5, "ec_stepend")]

    events = [*decode(0.0, 1024), *decode(6.0, 1025, update_in=False), *decode(12.0, 1026)]
    steps = trace.steps_of(events)
    assert [s.update_in for s in steps] == [pytest.approx(0.0052), None, pytest.approx(0.0172)]
    # the second has no marks, the third no step after it: only the first is split
    ((step, parts),) = trace.lone_decodes(steps)
    assert step is steps[0]
    assert parts["cycle"] == pytest.approx(0.006)
    assert parts["schedule"] == pytest.approx(0.0002)
    assert parts["execute"] == pytest.approx(0.005)
    assert parts["update"] == pytest.approx(0.0003)
    assert parts["between"] == pytest.approx(0.0005)


def test_a_step_is_featured_as_the_simulated_v1_prices_a_pass() -> None:
    # a decode at 1,100 tokens of context, a second 256-token chunk of a 1,024-token prompt,
    # and a new request's first chunk after a 512-token cached prefix
    step = trace.Step(
        0.0,
        0.01,
        513,
        3,
        ("cmpl-c-0-cc",),
        0.0,
        batch=(
            trace.Scheduled("cmpl-a-0-aa", 1, 1100, 1024),
            trace.Scheduled("cmpl-b-0-bb", 256, 256, 1024),
            trace.Scheduled("cmpl-c-0-cc", 256, 512, 1024),
        ),
    )
    f = trace.step_features(step)
    assert f["tokens"] == 513 and f["sampled"] == 3 and f["admitted"] == 1
    # the decode's attention is in its KV read, not in pairs
    assert f["attn_pairs"] == 256 * 256 + 256 * 512 + 2 * 256 * 257 / 2
    assert f["kv_tokens"] == 1101 + 512 + 768


def stepped(durations_ms: list[float], gaps_ms: list[float], waiting: int = 0) -> list[Any]:
    """Steps decoding request a, and b until step 2 (b finishes there)."""
    steps, t = [], 0.0
    for k, (dur, gap) in enumerate(zip(durations_ms, gaps_ms, strict=True)):
        batch = (trace.Scheduled("a", 1, 1000 + k, 1024),)
        if k <= 2:
            batch += (trace.Scheduled("b", 1, 1100 + k, 1024),)
        steps.append(trace.Step(t, t + dur / 1e3, 1, 1, (), 0.0, waiting, 1, batch))
        t += (dur + gap) / 1e3
    return steps


def test_only_back_to_back_steps_are_priced_on_their_cycle() -> None:
    cost = StepCost("vllm_v1", 0.004, 0.0, 0.0, 0.0, 1e-6, 0.0)  # 4 ms + 1 µs a KV entry
    # steps 0-1 back to back; step 2 is followed by 30 ms of idle; step 3 follows that idle
    steps = stepped([5.0, 6.0, 5.0, 7.0, 5.0], [0.1, 0.1, 30.0, 0.1, 0.1])
    # a request's front end: 2 ms of its 4 in step 1's cycle
    rows = trace.priced_steps(steps, cost, [(0.0092, 0.0132)])
    assert len(rows) == 3  # step 2 ends in an idle, step 4 has no step after it
    assert [round(1e3 * r["cycle_s"], 6) for r in rows] == [5.1, 6.1, 7.1]
    kv = [1001 + 1101, 1002 + 1102, 1004]
    assert [r["price_s"] for r in rows] == pytest.approx([0.004 + 1e-6 * n for n in kv])
    assert [r["after_idle"] for r in rows] == [True, False, True]
    assert [round(r["front_end_share"], 6) for r in rows] == [0.0, 0.5, 0.0]
    # b left the batch after step 2: step 3 follows a finish
    assert [r["finished_before"] for r in rows] == [0, 0, 1]


def test_the_summary_finds_what_the_price_leaves_out() -> None:
    # cycles built from the price less its admission charge, plus 4 ms a request's front end on
    # the core, 1.2 ms a request finished in the step before and 0.05 ms a waiting request
    cost = StepCost("vllm_v1", 0.004, 0.0, 0.0, 1e-8, 1e-6, 0.005)
    rows = []
    for k in range(60):
        prefill = k % 2 == 1
        waiting = (k * 7) % 23 if prefill else 0
        share, admitted = 0.5 * (k % 3 == 0), float(prefill and k % 4 == 1)
        finished = int(not prefill and k % 5 == 2)
        features = {
            "tokens": 256.0 if prefill else 1.0 + k % 4,
            "seqs": 1.0 + k % 4,
            "sampled": 1.0 + k % 4,
            "attn_pairs": 256.0 * 600 if prefill else 0.0,
            "kv_tokens": 900.0 + 40 * k,
            "admitted": admitted,
        }
        price = cost.iteration_time(
            **{
                k: int(v) if k in ("tokens", "seqs", "sampled", "admitted") else v
                for k, v in features.items()
            },
            cuda_graph=False,
        )
        admission = 0.005 * admitted
        cycle = price - admission + 1e-3 * (4.0 * share + 1.2 * finished + 0.05 * waiting)
        rows.append(
            {
                "cycle_s": cycle,
                "price_s": price,
                "admission_s": admission,
                "after_idle": k == 0,
                "prefill": prefill,
                "front_end_share": share,
                "finished_before": finished,
                "waiting": waiting,
                **features,
            }
        )
    out = trace.step_cost_summary(rows)
    residual = out["residual_ms"]
    assert residual["per_front_end"] == pytest.approx(4.0, abs=1e-6)
    assert residual["per_admitted"] == pytest.approx(-5.0, abs=1e-6)
    assert residual["per_finished"] == pytest.approx(1.2, abs=1e-6)
    assert residual["per_waiting"] == pytest.approx(0.05, abs=1e-6)
    assert residual["per_kkv"] == pytest.approx(0.0, abs=1e-6)
    assert out["after_idle"]["steps"] == 1
    # decode steps without a front end on the core cost their price
    assert out["decode"]["steps"] == 16 and out["decode"]["median"] == pytest.approx(1.0)
    assert out["decode_after_finish"]["steps"] == 4
    assert out["decode_after_finish"]["median"] > 1.1
    # prefill steps are priced without the admission charge, so only the queue is left
    by_waiting = out["prefill_by_waiting"]
    assert by_waiting["0"]["median"] == pytest.approx(1.0)
    assert by_waiting["10+"]["median"] > by_waiting["1-9"]["median"] > 1.0


def test_a_windows_totals_price_every_step_in_it() -> None:
    cost = StepCost("vllm_v1", 0.004, 0.0, 0.0, 0.0, 1e-6, 0.002)  # 4 ms, 1 µs a KV entry
    steps = stepped([5.0, 6.0, 5.0], [0.1, 30.0, 0.1])  # an idle or not: every step counts
    steps[0] = trace.Step(0.0, 0.005, 1, 2, ("a",), 0.0, 0, 2, steps[0].batch)  # admits a
    steps.append(trace.Step(0.05, 0.0517, 0, 0, (), 0.0, 0, 0, ()))  # scheduled nothing
    totals = trace.window_totals(steps, cost)
    assert totals["steps"] == 3
    assert totals["empty_steps"] == 1 and totals["empty_step_seconds"] == pytest.approx(0.0017)
    assert totals["step_seconds"] == pytest.approx(0.016)
    kv = (1001 + 1101) + (1002 + 1102) + (1003 + 1103)
    assert totals["price_seconds"] == pytest.approx(round(3 * 0.004 + 1e-6 * kv + 0.002, 4))


def test_runs_and_floors_are_found_where_the_workflow_writes_them() -> None:
    folders = trace.run_folders(
        ["matched/vllm_v1/rate-4.00"],
        ["defaults-vllm-v1-5a7c1333/defaults/vllm_v1/floor-s0.00-L128"],
    )
    assert folders == [
        ("matched/vllm_v1/rate-4.00", "runs/matched/vllm_v1/rate-4.00", "vllm_v1"),
        (
            "floor/defaults-vllm-v1-5a7c1333/defaults/vllm_v1/floor-s0.00-L128",
            "floor/defaults-vllm-v1-5a7c1333/runs/defaults/vllm_v1/floor-s0.00-L128",
            "vllm_v1",
        ),
    ]
    with pytest.raises(ValueError, match=re.escape("--run rate-4.00")):
        trace.run_folders(["rate-4.00"], [])
    with pytest.raises(ValueError, match=re.escape("--floor defaults/vllm_v1/floor-s0.00-L128")):
        trace.run_folders([], ["defaults/vllm_v1/floor-s0.00-L128"])
