"""Where a live vLLM V1 request spends its time to first token, and what each engine step pays
for: the phases of every request and a line through the steps, from the events
benchmarks/vllm_trace/sitecustomize.py logs (docs/simulator.md, "The front end on the engine's
own clock").

Make the events with a scratch clone of the workflow (never the measurement's results: a traced
engine is a diagnostic, not a measurement):

    SERVELAB_VLLM_TRACE_DIR=/tmp/trace PYTHONPATH=$PWD/benchmarks/vllm_trace \\
      snakemake --cores 1 results/runs/defaults/vllm_v1/rate-4.00/block.json \\
      --configfile config/cpu-pair.yaml config/sim-vs-real.yaml
    python benchmarks/vllm_request_trace.py --trace /tmp/trace --results results \\
      --run defaults/vllm_v1/rate-4.00

Per request, on the machine's CLOCK_MONOTONIC (the client's times placed on it by one constant,
the smallest send-to-`fe_in` of the run, so `http` is measured from the quickest request's):

    http          the client's send to the API server's InputProcessor.process_inputs
    input         process_inputs to the request handed to the engine core (fe_sent)
    to_core       the hand-off's start to the engine core's input thread holding it
    step_end      the input thread holding it to the scheduler holding it: the busy loop puts
                  requests in the scheduler only between steps
    queue         in the scheduler to its first schedule (the engine's own queue time)
    prefill       its first schedule to the end of the step that gave its first token (the
                  engine's own prefill time)
    to_front_end  that step's end to the API server processing its outputs
    to_client     the API server processing them to the client receiving the first chunk

split into requests sent while another of the run's was in flight ("busy") and the rest, with
the number of step ends between the send and the scheduler holding the request. Per step: its
duration on a least-squares line of the tokens it computed, the requests in it, the requests it
scheduled for the first time, the requests whose `fe_in` fell in it and the requests sent during
it. A front end's work on the engine's core shows in the step it overlaps, not in the step that
admits the request.

And the send to the hand-off by a request's place in its burst (requests sent less than 5 ms
after the one before): a front end that takes them in turn grows by a step a place.

With `--platform` (a CPU platform file, `results/sim_vs_real/platform.json`) and a log whose
steps carry their batch (the hook logs each request's tokens and context), every step that ran
back to back is priced at the floor's fitted step cost on its own features, as the simulated V1
prices a pass: the cost model alone, on the engine's real steps, apart from the scheduling. The
cycle (a step's start to the next one's) over that price: for all steps; for decode steps by
their batch and prefill steps by the waiting queue (neither after an idle nor with a request's
front end on the core); for decode steps after one that finished a request; for the steps with
front-end work and those after an idle; and the cycle less the price on a least-squares line of
what the price has no term for (`step_cost_summary`). `--floor` reads a floor's runs as it reads a
loaded run's: the floor's own steps against the price fitted from it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from servelab.sim.cpu_fit import read_step_costs
from servelab.sim.cpu_platform import StepCost

PHASES = (
    ("http", "send", "fe_in"),
    ("input", "fe_in", "fe_sent"),
    ("to_core", "fe_send", "ec_recv"),
    ("step_end", "ec_recv", "ec_queued"),
    ("queue", "ec_queued", "sched"),
    ("prefill", "sched", "first_ts"),
    ("to_front_end", "first_ts", "fe_out"),
    ("to_client", "fe_out", "client_first"),
)
STEP_TERMS = ("base", "per_token", "per_request", "per_new_request", "per_fe_in", "per_sent")


@dataclass(frozen=True)
class Event:
    t: float  # CLOCK_MONOTONIC seconds
    process: str
    thread: str
    kind: str
    fields: tuple[str, ...]


@dataclass(frozen=True)
class Scheduled:
    """One request's part of a step: `tokens` scheduled after `context` computed ones."""

    rid: str
    tokens: int
    context: int
    prompt: int


@dataclass(frozen=True)
class Step:
    start: float  # Scheduler.schedule entered
    end: float  # Scheduler.update_from_output returned
    tokens: int
    requests: int
    new: tuple[str, ...]  # requests scheduled for the first time (engine ids)
    schedule_s: float  # Scheduler.schedule's own time
    # the scheduler's queues after scheduling, and the batch (-1 and (): a log without them)
    waiting: int = -1
    running: int = -1
    batch: tuple[Scheduled, ...] = ()
    # Scheduler.update_from_output entered (None: a log without `ec_update_in`); between the
    # schedule's return and this, the forward pass and sampling
    update_in: float | None = None


def read_events(trace_dir: Path) -> list[Event]:
    """Every event of every process's log in `trace_dir`, in time order."""
    events: list[Event] = []
    for path in sorted(trace_dir.glob("*.log")):
        for line in path.read_text("utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) < 3:
                continue
            events.append(Event(float(parts[0]), path.stem, parts[1], parts[2], tuple(parts[3:])))
    events.sort(key=lambda e: e.t)
    return events


def unix_minus_monotonic(events: Sequence[Event]) -> float:
    """time.time() − time.monotonic(), from the processes' `clock` lines (their median)."""
    deltas = [float(e.fields[0]) - e.t for e in events if e.kind == "clock"]
    if not deltas:
        raise ValueError("no `clock` line: the logs were not written by vllm_trace/sitecustomize")
    return float(np.median(deltas))


def client_id(engine_id: str, known: set[str] | dict[str, Any]) -> str | None:
    """The client's request id inside an engine id: vLLM's OpenAI server names a completion
    `cmpl-<X-Request-Id>-<choice>`, and the engine core adds `-<8 hex>` to it."""
    rid = engine_id.removeprefix("cmpl-")
    rid = re.sub(r"-[0-9a-f]{8}$", "", rid)
    rid = re.sub(r"-\d+$", "", rid)
    return rid if rid in known else None


def steps_of(events: Sequence[Event]) -> list[Step]:
    """The engine core's steps: each `ec_sched` closed by the next `ec_stepend`."""
    steps: list[Step] = []
    open_step: dict[str, Any] | None = None
    for e in events:
        if e.kind == "ec_sched":
            start = float(e.fields[0])
            open_step = {
                "start": start,
                "tokens": int(e.fields[2]),
                "requests": int(e.fields[3]),
                "new": tuple(x for x in e.fields[1].split(",") if x),
                "schedule_s": e.t - start,
            }
            if len(e.fields) >= 7:  # the hook's queues and batch
                open_step["waiting"], open_step["running"] = int(e.fields[4]), int(e.fields[5])
                open_step["batch"] = tuple(_scheduled(x) for x in e.fields[6].split(",") if x)
        elif e.kind == "ec_update_in" and open_step is not None:
            open_step["update_in"] = e.t
        elif e.kind == "ec_stepend" and open_step is not None:
            steps.append(Step(end=e.t, **open_step))
            open_step = None
    return steps


def lone_decodes(steps: Sequence[Step]) -> list[tuple[Step, dict[str, float]]]:
    """Each step whose batch is one request and one token and whose next step carries the same
    request (back to back: not its request's last), with its parts in seconds: `cycle` (its
    start to the next step's), `schedule`, `execute`, `update` and `between` (its end to the
    next step's start). A step without `update_in` (a log from a hook without it) has no parts
    and is left out."""
    out = []
    for step, after in itertools.pairwise(steps):
        if step.update_in is None or len(step.batch) != 1 or step.batch[0].tokens != 1:
            continue
        if step.batch[0].rid not in {x.rid for x in after.batch}:
            continue
        parts = {
            "cycle": after.start - step.start,
            "schedule": step.schedule_s,
            "execute": step.update_in - (step.start + step.schedule_s),
            "update": step.end - step.update_in,
            "between": after.start - step.end,
        }
        out.append((step, parts))
    return out


def _scheduled(entry: str) -> Scheduled:
    rid, tokens, context, prompt = entry.rsplit(":", 3)
    return Scheduled(rid, int(tokens), int(context), int(prompt))


def request_marks(
    events: Sequence[Event], requests: Sequence[dict[str, Any]]
) -> tuple[float, dict[str, dict[str, float]]]:
    """(the client's clock offset, per client request the first time of each mark) for the ok
    requests of one run; the offset places the client's `sent_s` on CLOCK_MONOTONIC."""
    by_id = {r["request_id"]: r for r in requests}
    marks: dict[str, dict[str, float]] = {}

    def mark(engine_id: str, name: str, t: float) -> None:
        cid = client_id(engine_id, by_id)
        if cid is not None:
            marks.setdefault(cid, {}).setdefault(name, t)

    current_sched: float | None = None
    for e in events:
        if e.kind in ("fe_in", "fe_send", "fe_sent", "ec_recv", "ec_queued"):
            mark(e.fields[0], e.kind, e.t)
        elif e.kind == "ec_sched":
            current_sched = float(e.fields[0])
            for rid in filter(None, e.fields[1].split(",")):
                mark(rid, "sched", current_sched)
        elif e.kind == "fe_out":
            for rid in filter(None, e.fields[1].split(",")):
                mark(rid, "first_ts", float(e.fields[0]))
                mark(rid, "fe_out", e.t)
    offsets = [
        marks[r["request_id"]]["fe_in"] - float(r["sent_s"])
        for r in requests
        if r["request_id"] in marks and "fe_in" in marks[r["request_id"]]
    ]
    if not offsets:
        raise ValueError("no request of the run reached the API server's process_inputs")
    offset = min(offsets)
    for r in requests:
        m = marks.get(r["request_id"])
        if m is not None:
            m["send"] = float(r["sent_s"]) + offset
            m["client_first"] = float(r["chunk_times_s"][0]) + offset
    return offset, marks


def _stats(values: Sequence[float], scale: float) -> dict[str, float]:
    a = scale * np.asarray(values, dtype=float)
    return {
        "median": round(float(np.median(a)), 3),
        "mean": round(float(np.mean(a)), 3),
        "p90": round(float(np.percentile(a, 90)), 3),
    }


def phase_summary(
    marks: dict[str, dict[str, float]], requests: Sequence[dict[str, Any]], steps: Sequence[Step]
) -> dict[str, Any]:
    """Per group ("busy": sent while another of the run's requests was in flight; "idle"), the
    phases in ms and the step ends between marks, as medians, means and p90s."""
    measured = [r for r in requests if not r["warmup"] and r["request_id"] in marks]
    # a request is in flight from its send to its last chunk (both on the engine's clock)
    spans = [
        (m["send"], m["send"] - float(r["sent_s"]) + float(r["chunk_times_s"][-1]))
        for r in measured
        for m in (marks[r["request_id"]],)
    ]
    ends = np.array(sorted(s.end for s in steps))
    groups: dict[str, dict[str, list[float]]] = {"busy": {}, "idle": {}}
    needed = {"send", "fe_in", "ec_queued", "sched", "first_ts", "fe_out", "client_first"}
    for r in measured:
        m = marks[r["request_id"]]
        if not needed <= m.keys():
            continue
        busy = any(a < m["send"] < b for a, b in spans)
        g = groups["busy" if busy else "idle"]
        for name, a, b in PHASES:
            if a in m and b in m:
                g.setdefault(name, []).append(m[b] - m[a])
        g.setdefault("ttft", []).append(m["client_first"] - m["send"])
        for a, b in (("send", "ec_queued"), ("fe_sent", "ec_queued"), ("send", "first_ts")):
            if a in m:
                count = np.count_nonzero((ends > m[a]) & (ends < m[b] - 1e-6))
                g.setdefault(f"step_ends_{a}_to_{b}", []).append(float(count))
    out: dict[str, Any] = {}
    for group, values in groups.items():
        n = len(values.get("ttft", []))
        out[group] = {"requests": n}
        for name, v in values.items():
            out[group][name if name.startswith("step_ends") else f"{name}_ms"] = _stats(
                v, 1.0 if name.startswith("step_ends") else 1e3
            )
    return out


def step_line(
    steps: Sequence[Step], fe_in_times: Sequence[float], send_times: Sequence[float]
) -> dict[str, float] | None:
    """Least squares of each step's duration (ms) on STEP_TERMS; None with too few steps."""
    if len(steps) < 2 * len(STEP_TERMS):
        return None
    fe = np.sort(np.asarray(fe_in_times, dtype=float))
    sent = np.sort(np.asarray(send_times, dtype=float))
    rows, y = [], []
    for s in steps:
        n_fe = np.searchsorted(fe, s.end) - np.searchsorted(fe, s.start)
        n_sent = np.searchsorted(sent, s.end) - np.searchsorted(sent, s.start)
        rows.append([1.0, s.tokens, s.requests, len(s.new), n_fe, n_sent])
        y.append(1e3 * (s.end - s.start))
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(y), rcond=None)
    return {k: round(float(c), 4) for k, c in zip(STEP_TERMS, coef, strict=True)}


def output_batches(events: Sequence[Event]) -> dict[str, Any]:
    """The API server's `process_outputs` per step's outputs: count, median outputs, and its ms
    on a line of the outputs."""
    batches, opened = [], None
    for e in events:
        if e.kind == "fe_out":
            opened = (e.t, len([x for x in e.fields[1].split(",") if x]))
        elif e.kind == "fe_out_done" and opened is not None:
            batches.append((opened[1], 1e3 * (e.t - opened[0])))
            opened = None
    if len(batches) < 3:
        return {"batches": len(batches)}
    a = np.array(batches, dtype=float)
    slope, intercept = np.polyfit(a[:, 0], a[:, 1], 1)
    return {
        "batches": len(batches),
        "median_outputs": float(np.median(a[:, 0])),
        "ms_base": round(float(intercept), 4),
        "ms_per_output": round(float(slope), 4),
    }


# A step whose next one starts within this of its end ran back to back: its cycle (its start to
# the next one's) is the engine's time for it, loop overhead included, as the floor's fit has it.
# Otherwise the engine idled or waited for input after it (the gaps between busy steps are about
# 0.1 ms).
BACK_TO_BACK_S = 0.0005
# A step overlapping at least this share of a request's front end (its send to the hand-off to
# the engine core) has front-end work on its core; below, it is a clean step.
FRONT_END_SHARE = 0.05
RESIDUAL_TERMS = (
    "base",
    "per_front_end",
    "per_admitted",
    "per_finished",
    "per_waiting",
    "per_request",
    "per_kkv",
)


def step_features(step: Step) -> dict[str, float]:
    """A traced step's features as servelab.sim.vllm prices a pass (`_run_mixed`): every
    scheduled token computed, every request sampled (V1 samples a partial prefill too),
    attention pairs for the prefill chunks (a query token per pair with the context before it and
    the chunk's own earlier tokens), KV entries read or written (the context and the step's
    tokens), and the requests scheduled for the first time."""
    pairs = 0.0
    for r in step.batch:
        if r.context < r.prompt:  # a prefill chunk; a decode's attention is in its KV read
            pairs += r.tokens * r.context + r.tokens * (r.tokens + 1) / 2
    return {
        "tokens": float(sum(r.tokens for r in step.batch)),
        "seqs": float(len(step.batch)),
        "sampled": float(len(step.batch)),
        "attn_pairs": pairs,
        "kv_tokens": float(sum(r.context + r.tokens for r in step.batch)),
        "admitted": float(len(step.new)),
    }


def price_of(features: Mapping[str, float], cost: StepCost) -> float:
    """A step's price: `cost`'s linear model on `step_features` (no after-idle term)."""
    return cost.iteration_time(
        tokens=int(features["tokens"]),
        seqs=int(features["seqs"]),
        sampled=int(features["sampled"]),
        attn_pairs=features["attn_pairs"],
        kv_tokens=features["kv_tokens"],
        cuda_graph=False,
        admitted=int(features["admitted"]),
    )


def priced_steps(
    steps: Sequence[Step], cost: StepCost, front_ends: Sequence[tuple[float, float]]
) -> list[dict[str, Any]]:
    """Each back-to-back step of a traced run beside the price `cost` (a StepCost: the floor's
    fit) gives its features: the cycle and the price in seconds, whether it follows an idle or
    input wait, and what the price has no term for: the share of requests' front ends (`front_ends`,
    each (send, hand-off)) on the core during it, and the scheduler's waiting queue."""
    rows = []
    for i, step in enumerate(steps[:-1]):
        after = steps[i + 1]
        if not step.batch or after.start - step.end > BACK_TO_BACK_S:
            continue
        features = step_features(step)
        price = price_of(features, cost)
        share = sum(
            max(0.0, min(b, after.start) - max(a, step.start)) / (b - a)
            for a, b in front_ends
            if b > a and a < after.start and b > step.start
        )
        # requests of the step before that this one no longer has: finished (V1 preempts only
        # when the KV cache is full); their ending is work on the same core outside the steps
        finished = (
            len({r.rid for r in steps[i - 1].batch} - {r.rid for r in step.batch}) if i else 0
        )
        rows.append(
            {
                "cycle_s": after.start - step.start,
                "price_s": price,
                # the price's charge for the requests it admits: the simulated V1 charges a
                # request's front end to the step that admits it (servelab.sim.vllm)
                "admission_s": cost.front_end_s * features["admitted"],
                "after_idle": i == 0 or step.start - steps[i - 1].end > BACK_TO_BACK_S,
                "prefill": features["attn_pairs"] > 0,
                "front_end_share": share,
                "finished_before": finished,
                "waiting": step.waiting,
                **features,
            }
        )
    return rows


def window_totals(steps: Sequence[Step], cost: StepCost) -> dict[str, Any]:
    """The steps of a run's window that scheduled work: their count, the sum of their durations
    and of their prices (the linear model, no after-idle term); and apart, the steps that
    scheduled nothing. Σ price over the simulated run's own passes priced the
    same way (benchmarks/sim_vs_real_repeats.py's predicted engine seconds) sets the engine's
    batching against the simulated scheduler's, free of the machine's speed."""
    working = [s for s in steps if s.batch]
    empty = [s for s in steps if not s.batch]  # a schedule of nothing: no pass to price
    return {
        "steps": len(working),
        "step_seconds": round(sum(s.end - s.start for s in working), 4),
        "price_seconds": round(sum(price_of(step_features(s), cost) for s in working), 4),
        "empty_steps": len(empty),
        "empty_step_seconds": round(sum(s.end - s.start for s in empty), 4),
    }


def _ratio(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {"steps": 0}
    cycle = np.array([r["cycle_s"] for r in rows])
    price = np.array([r["price_s"] for r in rows])
    return {
        "steps": len(rows),
        "median": round(float(np.median(cycle / price)), 4),
        "total": round(float(cycle.sum() / price.sum()), 4),
        "median_cycle_ms": round(1e3 * float(np.median(cycle)), 3),
    }


def _bins(
    rows: Sequence[Mapping[str, Any]], key: Any, edges: Sequence[tuple[str, float, float]]
) -> dict[str, Any]:
    return {name: _ratio([r for r in rows if lo <= key(r) < hi]) for name, lo, hi in edges}


def step_cost_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The cycles over the floor's prices, by kind of step. Steps after an idle, and steps with a
    request's front end on the core, are apart; of the rest:
    - `decode`: decode only, nothing admitted, no request finished in the step before; also by
      the requests in the step; and `decode_after_finish`, the same steps after one that
      finished a request (its ending is work on the same core outside the steps);
    - `prefill`: with a prefill chunk, priced without the admission charge (the model charges a
      request's front end to the step that admits it, which the engine does not pay there); also
      by the scheduler's waiting queue after scheduling (V1 leaves a request waiting only while
      the step's token budget is full, so a decode-only step never has one).
    And the least squares of cycle − price (ms) on RESIDUAL_TERMS over the steps not after an
    idle (`per_kkv`: per thousand KV entries)."""
    warm = [r for r in rows if not r["after_idle"]]
    quiet = [r for r in warm if r["front_end_share"] < FRONT_END_SHARE]
    decode_all = [r for r in quiet if not r["prefill"] and not r["admitted"]]
    decode = [r for r in decode_all if not r["finished_before"]]
    prefill = [{**r, "price_s": r["price_s"] - r["admission_s"]} for r in quiet if r["prefill"]]
    out: dict[str, Any] = {
        "all": _ratio(rows),
        "after_idle": _ratio([r for r in rows if r["after_idle"]]),
        "front_end": _ratio([r for r in warm if r["front_end_share"] >= FRONT_END_SHARE]),
        "decode": _ratio(decode),
        "decode_after_finish": _ratio([r for r in decode_all if r["finished_before"]]),
        "decode_by_requests": _bins(
            decode, lambda r: r["seqs"], [("1-2", 1, 3), ("3-5", 3, 6), ("6+", 6, math.inf)]
        ),
        "prefill": _ratio(prefill),
        "prefill_by_waiting": _bins(
            prefill, lambda r: r["waiting"], [("0", 0, 1), ("1-9", 1, 10), ("10+", 10, math.inf)]
        ),
    }
    if len(warm) >= 4 * len(RESIDUAL_TERMS):
        x = np.array(
            [
                [
                    1.0,
                    r["front_end_share"],
                    r["admitted"],
                    r["finished_before"],
                    max(r["waiting"], 0),
                    r["seqs"],
                    r["kv_tokens"] / 1e3,
                ]
                for r in warm
            ]
        )
        y = np.array([1e3 * (r["cycle_s"] - r["price_s"]) for r in warm])
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        out["residual_ms"] = {
            k: round(float(c), 4) for k, c in zip(RESIDUAL_TERMS, coef, strict=True)
        }
    return out


BURST_S = 0.005  # a request sent within this of the one before it is in the same burst


def front_end_by_burst(marks: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The send to the hand-off to the engine core (`fe_sent`), in ms, by a request's place in
    its burst (0: alone or first; k: the k-th sent within BURST_S after another; 3 and more
    pooled): count and median. A front end that takes requests in turn at a share of the core
    grows by about the same step per place."""
    sends = sorted((m["send"], cid) for cid, m in marks.items() if {"send", "fe_sent"} <= m.keys())
    places: dict[int, list[float]] = {}
    place = 0
    for i, (t, cid) in enumerate(sends):
        place = place + 1 if i and t - sends[i - 1][0] < BURST_S else 0
        places.setdefault(min(place, 3), []).append(1e3 * (marks[cid]["fe_sent"] - t))
    return {
        str(k): {"requests": len(v), "median_ms": round(float(np.median(v)), 3)}
        for k, v in sorted(places.items())
    }


def one_run(
    events: Sequence[Event], run_dir: Path, unix_offset: float, cost: StepCost | None = None
) -> dict[str, Any]:
    """The phases, step line and output batches of the run in `run_dir` (its window's events);
    with `cost` (a StepCost) and a log with the steps' batches, its steps against their prices."""
    record = json.loads((run_dir / "run.json").read_text("utf-8"))
    start = float(record["start_unix_s"]) - unix_offset
    end = float(record["end_unix_s"]) - unix_offset
    lo, hi = start - 1.0, end + 2.0  # margins for the first send's and the last token's events
    window = [e for e in events if lo <= e.t <= hi]
    requests = [
        r
        for r in pq.read_table(run_dir / "requests.parquet").to_pylist()
        if r["status"] == "ok" and r["chunk_times_s"]
    ]
    offset, marks = request_marks(window, requests)
    steps = steps_of(window)
    fe_in = [e.t for e in window if e.kind == "fe_in"]
    sends = [m["send"] for m in marks.values() if "send" in m]
    ends = np.array([s.end for s in steps])
    priced = None
    if cost is not None and any(s.batch for s in steps):
        front_ends = [
            (m["send"], m["fe_sent"]) for m in marks.values() if {"send", "fe_sent"} <= m.keys()
        ]
        priced = step_cost_summary(priced_steps(steps, cost, front_ends))
        priced["run_window"] = window_totals([s for s in steps if start <= s.start <= end], cost)
    return {
        "run": str(run_dir),
        "steps": len(steps),
        "median_step_ms": round(1e3 * float(np.median(np.diff(ends))), 3)
        if len(steps) > 1
        else None,
        "client_offset_s": round(offset, 6),
        "phases": phase_summary(marks, requests, steps),
        "step_line_ms": step_line(steps, fe_in, sends),
        "schedule_ms": _stats([s.schedule_s for s in steps], 1e3) if steps else None,
        "output_batches": output_batches(window),
        "front_end_by_burst": front_end_by_burst(marks),
        "step_cost": priced,
    }


def run_folders(runs: Sequence[str], floors: Sequence[str]) -> list[tuple[str, str, str]]:
    """(the name, the folder under the results folder, the engine) of every `--run` and `--floor`
    value: a loaded run's ARM/ENGINE/CONDITION, or a floor's DEPLOYMENT/ARM/ENGINE/FLOOR (the
    `floor_run` rule's results/floor/DEPLOYMENT/runs/ARM/ENGINE/FLOOR)."""
    folders = []
    for run in runs:
        parts = run.split("/")
        if len(parts) != 3:
            raise ValueError(f"--run {run}: not ARM/ENGINE/CONDITION")
        folders.append((run, f"runs/{run}", parts[1]))
    for floor in floors:
        parts = floor.split("/")
        if len(parts) != 4:
            raise ValueError(f"--floor {floor}: not DEPLOYMENT/ARM/ENGINE/FLOOR")
        folders.append((f"floor/{floor}", f"floor/{parts[0]}/runs/{'/'.join(parts[1:])}", parts[2]))
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trace", type=Path, required=True, help="SERVELAB_VLLM_TRACE_DIR's folder"
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument(
        "--run", action="append", default=[], help="ARM/ENGINE/CONDITION, every repetition"
    )
    parser.add_argument(
        "--floor",
        action="append",
        default=[],
        help="DEPLOYMENT/ARM/ENGINE/FLOOR, a floor's every repetition (its steps, as a run's)",
    )
    parser.add_argument(
        "--platform",
        type=Path,
        help="a CPU platform (sim_vs_real/platform.json): price each step at its fitted step cost",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.run and not args.floor:
        parser.error("name a --run or a --floor")
    costs = read_step_costs(args.platform) if args.platform else {}
    events = read_events(args.trace)
    unix_offset = unix_minus_monotonic(events)
    out: dict[str, Any] = {"trace": str(args.trace), "results": str(args.results), "runs": {}}
    try:
        folders = run_folders(args.run, args.floor)
    except ValueError as err:
        parser.error(str(err))
    for given, folder, engine in folders:
        reps = sorted(p for p in (args.results / folder).glob("rep*") if p.is_dir())
        if not reps:
            raise SystemExit(f"{given}: no repetition under {args.results / folder}")
        if costs and engine not in costs:
            raise SystemExit(f"--platform {args.platform}: no step cost of {engine} ({given})")
        for rep in reps:
            name = f"{given}/{rep.name}"
            result = one_run(events, rep, unix_offset, costs.get(engine))
            out["runs"][name] = result
            report(name, result)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", "utf-8")


def report(name: str, r: dict[str, Any]) -> None:
    print(f"{name}: {r['steps']} steps, median {r['median_step_ms']} ms")
    for group in ("busy", "idle"):
        g = r["phases"][group]
        if not g["requests"]:
            continue
        cells = [
            f"{k.removesuffix('_ms')} {v['median']:g}" for k, v in g.items() if k != "requests"
        ]
        print(f"  {group} ({g['requests']} requests), medians: " + ", ".join(cells))
    if r["step_line_ms"]:
        print("  step (ms): " + ", ".join(f"{k} {v:g}" for k, v in r["step_line_ms"].items()))
    print("  process_outputs: " + json.dumps(r["output_batches"]))
    print("  send to fe_sent by place in a burst: " + json.dumps(r["front_end_by_burst"]))
    priced = r.get("step_cost")
    if priced:
        for key in ("all", "decode", "decode_after_finish", "prefill", "front_end", "after_idle"):
            print(f"  cycle / price, {key}: " + json.dumps(priced[key]))
        for key in ("decode_by_requests", "prefill_by_waiting"):
            cells = [f"{k} {v.get('median', '-')} ({v['steps']})" for k, v in priced[key].items()]
            print(f"  {key}: " + ", ".join(cells))
        if "residual_ms" in priced:
            print("  cycle - price (ms): " + json.dumps(priced["residual_ms"]))


if __name__ == "__main__":
    main()
