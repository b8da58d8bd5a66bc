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
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

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
class Step:
    start: float  # Scheduler.schedule entered
    end: float  # Scheduler.update_from_output returned
    tokens: int
    requests: int
    new: tuple[str, ...]  # requests scheduled for the first time (engine ids)
    schedule_s: float  # Scheduler.schedule's own time


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
    open_step: tuple[float, int, int, tuple[str, ...], float] | None = None
    for e in events:
        if e.kind == "ec_sched":
            new = tuple(x for x in e.fields[1].split(",") if x)
            start = float(e.fields[0])
            open_step = (start, int(e.fields[2]), int(e.fields[3]), new, e.t - start)
        elif e.kind == "ec_stepend" and open_step is not None:
            start, tokens, requests, new, schedule_s = open_step
            steps.append(Step(start, e.t, tokens, requests, new, schedule_s))
            open_step = None
    return steps


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


def one_run(events: Sequence[Event], run_dir: Path, unix_offset: float) -> dict[str, Any]:
    """The phases, step line and output batches of the run in `run_dir` (its window's events)."""
    record = json.loads((run_dir / "run.json").read_text("utf-8"))
    lo = float(record["start_unix_s"]) - unix_offset - 1.0
    hi = float(record["end_unix_s"]) - unix_offset + 2.0
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
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trace", type=Path, required=True, help="SERVELAB_VLLM_TRACE_DIR's folder"
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument(
        "--run", action="append", required=True, help="ARM/ENGINE/CONDITION, every repetition"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    events = read_events(args.trace)
    unix_offset = unix_minus_monotonic(events)
    out: dict[str, Any] = {"trace": str(args.trace), "results": str(args.results), "runs": {}}
    for run in args.run:
        reps = sorted(p for p in (args.results / "runs" / run).glob("rep*") if p.is_dir())
        if not reps:
            raise SystemExit(f"--run {run}: no repetition under {args.results / 'runs' / run}")
        for rep in reps:
            name = f"{run}/{rep.name}"
            result = one_run(events, rep, unix_offset)
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


if __name__ == "__main__":
    main()
