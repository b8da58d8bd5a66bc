"""The CPU platform's fit: each engine's `StepCost` from its unloaded floor, and nothing else
(docs/simulator.md, "Against the real engines").

Every floor run is a closed-loop chain of single requests (servelab.workload.floor); config
`floor.shapes` adds the single-request step sweep: fresh prompts of several lengths. Each floor
request is replayed alone through the engine's own simulated scheduler with a `FeatureRecorder` in
place of a cost model, which records the features of every forward pass the request takes: the
passes up to its first token (several when the arm chunks prefill, or llama.cpp splits a batch into
micro-batches) sum to its TTFT, each later pass is one inter-token gap. Both arms of an engine are
pooled: a chunked arm's TTFT holds more passes than an unchunked arm's for the same tokens, which is
what separates `step_s` from the per-request terms (with one request at a time a pass and its one
sampled sequence always come together). Each floor run's warm-ups are replayed as they were
sent, together or config `dispatch.warmup_spacing_s` apart; they price decode passes of several
(with config `floor.warmup_prompt_tokens`, long and distinct) contexts, so their gaps enter the
fit and their times to first token, a batch's queueing and prefill, do not. Non-negative least
squares (scipy.optimize.nnls) on relative error gives the coefficients; the fit report keeps the
residuals.

A floor with idle gaps (config `floor.idle_gaps`; servelab.workload.floor) also prices what a pass
costs after an idle (servelab.sim.cpu_platform, the after-idle term). The replay idles as the real
engine did, for each request's gap, and the request after a gap and the next one
(AFTER_IDLE_REQUESTS) are kept out of the linear fit. Once the linear model has settled,
`fit_after_idle` fits the term's gain, rise and decay to those requests' TTFT and gaps, on the
replay's own passes at the linear model's times (scipy.optimize.least_squares, a robust loss on
relative error). Without idle gaps there are no such rows, and no term.

`predict_run` then runs one loaded run of the grid on the fitted platform (the sim_vs_real rules).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import pyarrow.parquet as pq
from scipy.optimize import least_squares, nnls

from servelab.artifacts import write_json
from servelab.grid.config import conditions, deployment_for, offered_load
from servelab.grid.settings import PlatformSettings
from servelab.sim.cpu_platform import (
    COEFFICIENTS,
    FEATURES,
    FeatureRecorder,
    StepCost,
    after_idle_step,
)
from servelab.sim.platform import PlatformModel
from servelab.sim.run import build_engine, simulate_run_files
from servelab.workload.loader import load_trace

__all__ = [
    "AFTER_IDLE_REQUESTS",
    "WARMUP_ROWS",
    "Equation",
    "FitRow",
    "FloorPasses",
    "FloorRun",
    "WarmupRows",
    "fit_after_idle",
    "fit_step_cost",
    "floor_bracket",
    "floor_drift",
    "floor_medians",
    "floor_noise",
    "floor_passes",
    "floor_rows",
    "observed_times",
    "pooled_spread",
    "predict_run",
    "prediction_settings",
    "read_step_costs",
    "write_cpu_platform",
    "write_floor_drift",
]


# --------------------------------------------------------------------------- the floor's rows


@dataclass(frozen=True)
class FloorRun:
    """One floor run: its folder (requests.parquet, run.json), its trace and its deployment."""

    run_dir: Path
    trace_dir: Path
    engine: str
    arm: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class FitRow:
    """One observed time and the features of the iterations it spans."""

    run: str
    request_id: str
    kind: str  # "ttft" or "itl"
    observed_s: float
    features: np.ndarray
    # the replay's passes it spans, [first, last), in its FloorPasses
    passes: tuple[int, int] = (0, 0)
    # a request after an idle gap, or AFTER_IDLE_REQUESTS - 1 after it: not a row of the linear fit
    after_idle: bool = False


@dataclass(frozen=True)
class FloorPasses:
    """One floor run's replay: its rows, and every pass the replay made, in order: its features,
    when it started and how long it took on the replay's timing."""

    rows: list[FitRow]
    features: np.ndarray  # passes × FEATURES
    starts: np.ndarray  # seconds; NaN where the engine model gave no start
    durations: np.ndarray

    def idles(self) -> np.ndarray:
        """Seconds each pass waited after the one before it ended (0 for the first)."""
        ends = self.starts + self.durations
        idle = np.zeros(len(self.starts))
        idle[1:] = np.nan_to_num(self.starts[1:] - ends[:-1], nan=0.0)
        return np.maximum(idle, 0.0)


# Requests kept out of the linear fit from each idle gap on: the one after it, and the next (on
# the slowest machine measured, a llama-server pass recovered over about 0.1 s of work, a request
# or two: benchmarks/idle_wake_cost.py --after).
AFTER_IDLE_REQUESTS = 2


def observed_times(
    row: Mapping[str, Any],
) -> tuple[float, list[float]] | None:
    """(TTFT, inter-token gaps between single-token chunks) of one ok request, or None.

    A gap of zero is left out: the two chunks were read together (the client was late to read,
    or one segment carried both), so it times no pass; with its weight 1 / observed it would
    also decide the whole fit alone."""
    times = list(row["chunk_times_s"])
    tokens = list(row["chunk_tokens"])
    start = row["sent_s"]  # TTFT as the analysis measures it (servelab.analysis.reduce)
    if row["status"] != "ok" or start is None or not times:
        return None
    first = next((i for i, n in enumerate(tokens) if n > 0), None)
    if first is None:
        return None
    ttft = float(times[first]) - float(start)
    gaps = [
        float(times[i]) - float(times[i - 1])
        for i in range(first + 1, len(times))
        if tokens[i] == 1 and tokens[i - 1] >= 1 and times[i] > times[i - 1]
    ]
    return ttft, gaps


def _replay(
    model: Any,
    recorder: FeatureRecorder,
    group: Sequence[tuple[str, np.ndarray, int, float]],
    now: float,
) -> tuple[dict[str, list[tuple[np.ndarray, tuple[int, int]]]], float]:
    """Send `group` (request id, prompt ids, max_tokens, seconds after `now`) at its times and
    step the model until it is idle: per request, the summed features of the passes from its
    send up to each of its tokens (the first: its TTFT; each later one: an inter-token gap),
    with the range of the recorder's calls they span. Requests sent at one time reach the
    engine together (an HTTP pool may take only some of them: servelab.sim.llamacpp,
    `_accept`)."""
    start = now
    unsent = sorted(group, key=lambda g: g[3])
    per_token: dict[str, list[tuple[np.ndarray, tuple[int, int]]]] = {
        rid: [] for rid, _ids, _n, _t in group
    }
    pending: dict[str, np.ndarray] = {}
    since: dict[str, int] = {}  # the recorder's call from which each request's pending features run
    for _ in range(100_000):  # bounded: one group's passes
        while unsent and start + unsent[0][3] <= now:
            rid, ids, max_tokens, offset = unsent.pop(0)
            model.add_request(rid, ids, max_tokens, start + offset)
            pending[rid] = np.zeros(len(FEATURES))
            since[rid] = len(recorder.calls)
        if not model.has_work():
            if not unsent:
                break
            now = start + unsent[0][3]  # idle until the next send
            continue
        mark = len(recorder.calls)
        it = model.step(now)
        now = it.end_s
        features = sum(recorder.calls[mark:], np.zeros(len(FEATURES)))
        for rid in pending:
            pending[rid] = pending[rid] + features
        for rid in it.emitted:
            if rid in pending:
                per_token[rid].append((pending[rid], (since[rid], len(recorder.calls))))
                pending[rid] = np.zeros(len(FEATURES))
                since[rid] = len(recorder.calls)
    return per_token, now


def _warmup_prompt(k: int, prompt_tokens: int, bos: bool) -> np.ndarray:
    """A stand-in for a warm-up's prompt: its length as the engine counted it, first token
    distinct per warm-up (the live warm-ups share no prefix: servelab.workload.warmup_prompts)."""
    n = max(prompt_tokens - (1 if bos else 0), 1)
    return (1000 + 7919 * (k + 1) + np.arange(n, dtype=np.int64) % 50000).astype(np.int64)


# Which of the warm-ups' observed times are fitting rows. "gaps", the workflow's rule: their
# inter-token gaps, not their times to first token (a batch's queueing). "gaps_and_ttft": both,
# the rule before 2026-12-04. "none": the warm-ups are not replayed at all, as if the floor had
# sent none. The last two are for benchmarks/sim_vs_real_fit_rules.py's comparison.
WarmupRows = Literal["gaps", "gaps_and_ttft", "none"]
WARMUP_ROWS: tuple[str, ...] = get_args(WarmupRows)


def floor_rows(
    run: FloorRun,
    *,
    gpu_memory_mib: int,
    model_preset: str,
    timing: StepCost | None = None,
    warmup_rows: WarmupRows = "gaps",
) -> list[FitRow]:
    """`floor_passes`' rows."""
    return floor_passes(
        run,
        gpu_memory_mib=gpu_memory_mib,
        model_preset=model_preset,
        timing=timing,
        warmup_rows=warmup_rows,
    ).rows


def floor_passes(
    run: FloorRun,
    *,
    gpu_memory_mib: int,
    model_preset: str,
    timing: StepCost | None = None,
    warmup_rows: WarmupRows = "gaps",
) -> FloorPasses:
    """Every floor request of `run` replayed through the engine's simulated scheduler as it was
    sent: the run's warm-ups at their scheduled times (passes with more than one sequence: the
    decode cost against batch size), then the floor's requests one at a time, or the requests a
    shape sends together (config `floor.shapes[].together`) together, each after its idle gap
    (its trace's `tool_delay_s`: 0 but for a floor with idle gaps). One
    TTFT row and one row per inter-token gap, each with the features of the passes it spans.
    `timing`: a step cost fitted before, whose step and front-end times decide which pass admits
    each warm-up.
    `warmup_rows`: which of the warm-ups' times are rows (WarmupRows)."""
    if warmup_rows not in WARMUP_ROWS:
        raise ValueError(f"warmup_rows {warmup_rows!r}: not one of {', '.join(WARMUP_ROWS)}")
    requests = pq.read_table(run.run_dir / "requests.parquet").to_pylist()
    trace = load_trace(run.trace_dir / "trace.parquet", run.trace_dir / "manifest.json")
    recorder = FeatureRecorder(timing=timing)
    sim = build_engine(
        engine=run.engine,
        flags=list(run.flags),
        gpu_name="CPU",
        gpu_memory_mib=gpu_memory_mib,
        model_preset_name=model_preset,
        step_costs={run.engine: recorder},
    )
    model = sim.model
    sent = [r for r in requests if r["sent_s"] is not None]
    warmups = [r for r in sent if r["warmup"]]
    measured = sorted(
        (r for r in sent if not r["warmup"]), key=lambda r: (r["sent_s"], r["request_id"])
    )
    label = str(run.run_dir)
    rows: list[FitRow] = []
    now = 0.0
    groups: list[tuple[list[dict[str, Any]], bool]] = []
    if warmup_rows != "none" and warmups and all(r["prompt_tokens"] for r in warmups):
        groups.append((warmups, True))
    # Requests released together (a floor shape's `together`: every one depends on the same
    # requests) are sent together, as the real ones were; one at a time, each is its own group.
    released = {r.request_id: r.depends_on for r in trace.requests}
    together: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in measured:
        together.setdefault(released[r["request_id"]], []).append(r)
    groups += [(group, k > 0) for k, group in enumerate(together.values())]
    bos = sim.model_preset.bos_token_id is not None
    delays = {r.request_id: r.tool_delay_s for r in trace.requests}
    after_gap = AFTER_IDLE_REQUESTS  # requests (or groups sent together) since the last idle gap
    for group, fitted in groups:
        gap = delays.get(group[0]["request_id"], 0.0) if not group[0]["warmup"] else 0.0
        after_gap = 0 if gap > 0 else after_gap + 1
        now += gap  # the engine idles as the real one did
        # each at its scheduled time (warm-ups config `dispatch.warmup_spacing_s` apart), not its
        # sent time: a client's own jitter of a fraction of a millisecond is not a pause
        first = min(float(r["scheduled_s"] or 0.0) for r in group)
        prompts = [
            (
                r["request_id"],
                _warmup_prompt(k, int(r["prompt_tokens"]), bos)
                if r["warmup"]
                else trace.prompts[r["request_id"]].token_ids,
                int(r["max_tokens"]),
                float(r["scheduled_s"] or 0.0) - first,
            )
            for k, r in enumerate(group)
        ]
        per_token, now = _replay(model, recorder, prompts, now)
        # The first floor request (or group) may meet a prefix cache the real engine kept from an
        # earlier run of the deployment, which the replay cannot know: it is not a fitting row.
        if not fitted:
            continue
        after_idle = after_gap < AFTER_IDLE_REQUESTS
        for req in group:
            observed, tokens = observed_times(req), per_token[req["request_id"]]
            if observed is None or not tokens:
                continue
            ttft, gaps = observed
            rid = req["request_id"]
            if not req["warmup"] or warmup_rows == "gaps_and_ttft":
                features, passes = tokens[0]
                rows.append(FitRow(label, rid, "ttft", ttft, features, passes, after_idle))
            for itl, (features, passes) in zip(gaps, tokens[1:], strict=False):
                rows.append(FitRow(label, rid, "itl", itl, features, passes, after_idle))
    return FloorPasses(
        rows=rows,
        features=np.stack(recorder.calls) if recorder.calls else np.zeros((0, len(FEATURES))),
        starts=np.array([np.nan if t is None else t for t in recorder.starts], dtype=float),
        durations=np.array(recorder.durations, dtype=float),
    )


# Refits on the previous fit's own timing (fit_step_cost), and when they have settled.
MAX_REFITS = 4
SETTLED_REL = 1e-3


# One equation of the fit: the features of the passes an observed time spans, the time, its kind.
Equation = tuple[np.ndarray, float, str]


def fit_step_cost(
    engine: str,
    runs: Sequence[FloorRun],
    *,
    gpu_memory_mib: int,
    model_preset: str,
    extra: Sequence[Equation] = (),
    warmup_rows: WarmupRows = "gaps",
    without: Sequence[str] = (),
    fixed: Mapping[str, float] | None = None,
) -> tuple[StepCost, dict[str, Any]]:
    """The engine's StepCost from its floor runs (both arms pooled), and the fit's report.
    `extra`: equations measured beside the floor (benchmarks/cpu_fit_with_sweep.py), weighted
    as the floor's. `warmup_rows`: which of the warm-ups' times are rows (floor_rows).
    `without`: coefficients held at 0, a model without those terms; `fixed`: coefficients held
    at given values, measured elsewhere, the rest fitted to what they leave (both for a
    benchmark's comparison; the workflow fits every term).

    Each TTFT row and the median of each (run, request) ITL group enter once, weighted by
    1 / observed (least squares on relative error: a 4 ms gap and a 60 ms TTFT count alike).

    Which pass admits each of the warm-ups sent together depends on the step and front-end
    times (servelab.sim.vllm, V1's front end), which the fit is finding: the first fit replays
    without them, and each refit replays on the previous fit's timing, until the coefficients
    settle (relative change at most SETTLED_REL) or MAX_REFITS refits."""
    # In one order whatever the caller's: nnls's result moves with its rows' order (by about
    # 1e-6 of a coefficient), and the workflow and the benchmarks list the runs differently.
    mine = sorted((r for r in runs if r.engine == engine), key=lambda r: str(r.run_dir))
    if not mine:
        raise ValueError(f"fit of {engine}: no floor run of that engine")
    for given, names in (("without", list(without)), ("fixed", list(fixed or {}))):
        unknown = sorted(set(names) - set(COEFFICIENTS))
        if unknown:
            raise ValueError(f"fit of {engine}: {given} {', '.join(unknown)}: not a coefficient")
    values = {**dict.fromkeys(without, 0.0), **(fixed or {})}
    held = np.array([float(values.get(name, np.nan)) for name in COEFFICIENTS])
    cost, report, passes = _fit_once(
        engine, mine, gpu_memory_mib, model_preset, None, extra, warmup_rows, held
    )
    report["refits"] = 0
    for refit in range(1, MAX_REFITS + 1):
        again, again_report, passes = _fit_once(
            engine, mine, gpu_memory_mib, model_preset, cost, extra, warmup_rows, held
        )
        moved = _moved(again.coefficients().values(), cost.coefficients().values())
        cost, report = again, again_report
        report["refits"] = refit
        if moved <= SETTLED_REL:
            break
    cost, after_idle = fit_after_idle(cost, passes)
    # The term and the linear model in turn: the linear model refitted with the term's share
    # taken off its rows, the term refitted on that model, until the term settles.
    for round_ in range(1, AFTER_IDLE_ROUNDS + 1):
        if after_idle is None:
            break
        refits = report["refits"]
        linear, report, passes = _fit_once(
            engine, mine, gpu_memory_mib, model_preset, cost, extra, warmup_rows, held, cost
        )
        again, after_idle = fit_after_idle(linear, passes)
        moved = _moved(_term_of(again), _term_of(cost))
        cost = again
        report["refits"] = refits
        report["after_idle_rounds"] = round_
        if moved <= SETTLED_REL * 10:
            break
    if after_idle is not None:
        report["after_idle"] = after_idle
    return cost, report


def _moved(new: Iterable[float], old: Iterable[float]) -> float:
    """The largest relative change between two fits' parameters."""
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(new, old, strict=True))


def _term_of(cost: StepCost) -> tuple[float, float, float]:
    """The after-idle term's parameters, a gain of 0 included."""
    return (cost.idle_gain, cost.idle_rise_s, cost.idle_decay_s)


# Alternations of the linear model and the after-idle term (fit_step_cost), at most.
AFTER_IDLE_ROUNDS = 4


def _after_idle_times(
    linear: np.ndarray, idle: np.ndarray, gain: float, rise_s: float, decay_s: float
) -> np.ndarray:
    """Cumulative times of a run's passes with the after-idle term, from the run's first pass on,
    cold, as the simulated engine does; entry k is the time of the first k passes."""
    out = np.empty(linear.size)
    cold = 1.0  # an engine starts cold
    for i in range(linear.size):
        out[i], cold = after_idle_step(
            cold, idle[i], linear[i], gain=gain, rise_s=rise_s, decay_s=decay_s
        )
    return np.concatenate([[0.0], np.cumsum(out)])


def _term_factors(run: FloorPasses, cost: StepCost) -> np.ndarray:
    """For each of the run's rows: its passes' time with `cost`'s after-idle term over their
    time without."""
    linear = (run.features @ np.array(list(cost.coefficients().values()))) * cost.slowdown
    with_term = _after_idle_times(
        linear, run.idles(), cost.idle_gain, cost.idle_rise_s, cost.idle_decay_s
    )
    without = np.concatenate([[0.0], np.cumsum(linear)])
    factors = []
    for row in run.rows:
        lo, hi = row.passes
        base = without[hi] - without[lo]
        factors.append((with_term[hi] - with_term[lo]) / base if base > 0 else 1.0)
    return np.array(factors)


# The term fit's starting rises and decays (seconds), every pair tried.
TERM_STARTS_RISE_S = (0.3, 3.0)
TERM_STARTS_DECAY_S = (0.02, 0.2)


def fit_after_idle(
    cost: StepCost, runs: Sequence[FloorPasses]
) -> tuple[StepCost, dict[str, Any] | None]:
    """`cost` with the after-idle term fitted to the floor's after-idle rows (FitRow.after_idle),
    and the fit's report; `cost` unchanged and None when the floor has no such rows.

    Each run's passes are priced at `cost`'s linear times with the term applied from the run's
    first pass on, cold, as the simulated engine does (servelab.sim.cpu_platform,
    `after_idle_step`, each pass with the replay's idle before it). Least squares on the
    after-idle rows' relative error with a soft-L1 loss, so that a gap the client read late does
    not decide the fit; rise and decay in log space."""
    coefficients = np.array(list(cost.coefficients().values()))
    priced: list[tuple[np.ndarray, np.ndarray]] = []  # each run's (linear times, idles)
    rows: list[tuple[int, int, int, float, str]] = []  # (run, first pass, end, observed, kind)
    for run in runs:
        mine = [r for r in run.rows if r.after_idle]
        if not mine:
            continue
        end = max(r.passes[1] for r in mine)  # passes after the last row change nothing
        linear = (run.features[:end] @ coefficients) * cost.slowdown
        priced.append((linear, run.idles()[:end]))
        rows += [(len(priced) - 1, *r.passes, r.observed_s, r.kind) for r in mine]
    if not rows:
        return cost, None
    observed = np.array([r[3] for r in rows])

    def predicted(gain: float, rise_s: float, decay_s: float) -> np.ndarray:
        totals = [_after_idle_times(linear, idle, gain, rise_s, decay_s) for linear, idle in priced]
        return np.array([totals[k][hi] - totals[k][lo] for k, lo, hi, _o, _kind in rows])

    def residuals(x: np.ndarray) -> np.ndarray:
        times = predicted(float(x[0]), float(np.exp(x[1])), float(np.exp(x[2])))
        return np.asarray(times / observed - 1.0, dtype=float)

    # several starts: with few idle lengths, gain and rise trade off and the fit has more than
    # one local minimum (a small gain with a slow rise against the true pair)
    fit = min(
        (
            least_squares(
                residuals,
                x0=np.array([0.3, np.log(rise_s), np.log(decay_s)]),
                bounds=([0.0, np.log(0.05), np.log(0.002)], [5.0, np.log(120.0), np.log(10.0)]),
                loss="soft_l1",
                f_scale=0.1,
            )
            for rise_s, decay_s in itertools.product(TERM_STARTS_RISE_S, TERM_STARTS_DECAY_S)
        ),
        key=lambda f: float(f.cost),
    )
    gain, rise_s, decay_s = float(fit.x[0]), float(np.exp(fit.x[1])), float(np.exp(fit.x[2]))
    before = residuals(np.array([0.0, 0.0, 0.0]))
    after = residuals(fit.x)
    kinds = np.array([r[4] for r in rows])
    report: dict[str, Any] = {
        "idle_gain": round(gain, 6),
        "idle_rise_s": round(rise_s, 6),
        "idle_decay_s": round(decay_s, 6),
        "runs": len(priced),
    }
    for kind in ("ttft", "itl"):
        mask = kinds == kind
        if mask.any():
            report[kind] = {
                "rows": int(mask.sum()),
                "median_rel_error_without": round(float(np.median(before[mask])), 4),
                "median_rel_error_with": round(float(np.median(after[mask])), 4),
                "median_abs_rel_error_with": round(float(np.median(np.abs(after[mask]))), 4),
            }
    return cost.with_after_idle(gain, rise_s, decay_s), report


def _fit_once(
    engine: str,
    mine: Sequence[FloorRun],
    gpu_memory_mib: int,
    model_preset: str,
    timing: StepCost | None,
    extra: Sequence[Equation] = (),
    warmup_rows: WarmupRows = "gaps",
    held: np.ndarray | None = None,
    term: StepCost | None = None,
) -> tuple[StepCost, dict[str, Any], list[FloorPasses]]:
    """One fit on the replay at `timing`, and the replay's passes; `held`: each coefficient's
    held value, NaN where it is fitted. Rows after an idle gap are not the linear model's;
    with `term`, a step cost with an after-idle term fitted before, every other row's observed
    time is divided by what the term adds to it (`_term_factors`), so that the coldness of a
    run's first passes, and what is left of it after the excluded rows, is not fitted as linear
    cost."""
    passes = [
        floor_passes(
            run,
            gpu_memory_mib=gpu_memory_mib,
            model_preset=model_preset,
            timing=timing,
            warmup_rows=warmup_rows,
        )
        for run in mine
    ]
    rows = [row for run in passes for row in run.rows]
    if term is not None and term.idle_gain > 0:  # the rows as if the engine were never cold
        rows = [
            dataclasses.replace(row, observed_s=row.observed_s / factor)
            for run in passes
            for row, factor in zip(run.rows, _term_factors(run, term), strict=True)
        ]
    equations: list[Equation] = []
    itl_groups: dict[tuple[str, str], list[FitRow]] = {}
    for row in rows:
        if row.after_idle:
            continue
        if row.kind == "ttft":
            equations.append((row.features, row.observed_s, "ttft"))
        else:
            itl_groups.setdefault((row.run, row.request_id), []).append(row)
    for group in itl_groups.values():
        observed = float(np.median([g.observed_s for g in group]))
        features = np.median(np.stack([g.features for g in group]), axis=0)
        equations.append((features, observed, "itl"))
    equations.extend(extra)
    if len(equations) < len(FEATURES):
        raise ValueError(
            f"fit of {engine}: {len(equations)} equations for {len(FEATURES)} coefficients"
        )
    x = np.stack([e[0] for e in equations])
    y = np.array([e[1] for e in equations])
    is_held = np.zeros(len(COEFFICIENTS), dtype=bool) if held is None else ~np.isnan(held)
    # a held term: its column is emptied (nnls gives it 0) and its time taken off the observed
    free_x = x * ~is_held
    free_y = y - x[:, is_held] @ held[is_held] if held is not None else y
    weights = 1.0 / np.maximum(y, 1e-6)
    # Columns scaled to unit size so that nnls sees a well-conditioned problem.
    scale = np.maximum(np.abs(free_x).max(axis=0), 1e-12)
    solution, _ = nnls((free_x / scale) * weights[:, None], free_y * weights, maxiter=10_000)
    coefficients = solution / scale
    if held is not None:
        coefficients[is_held] = held[is_held]
    cost = StepCost(
        engine, **dict(zip(COEFFICIENTS, (float(c) for c in coefficients), strict=True))
    )
    predicted = x @ coefficients
    relative = predicted / y - 1.0
    report: dict[str, Any] = {"engine": engine, "coefficients": cost.coefficients()}
    for kind in dict.fromkeys(e[2] for e in equations):  # ttft, itl, then extra's kinds
        mask = np.array([e[2] == kind for e in equations])
        if mask.any():
            report[kind] = {
                "equations": int(mask.sum()),
                "median_abs_rel_error": round(float(np.median(np.abs(relative[mask]))), 4),
                "p90_abs_rel_error": round(float(np.quantile(np.abs(relative[mask]), 0.9)), 4),
            }
    report["runs"] = sorted({str(r.run_dir) for r in mine})
    if any(row.after_idle for row in rows):
        report["after_idle_rows_left_out"] = sum(row.after_idle for row in rows)
    return cost, report, passes


# --------------------------------------------------------------------------- the workflow's steps


def write_cpu_platform(
    floor_runs: Sequence[Mapping[str, Any]],
    *,
    gpu_memory_mib: int,
    model_preset: str | None,
    out_path: str | Path,
) -> dict[str, Any]:
    """Fit every engine of the floor runs and write the platform file: per engine, the
    coefficients (config `gpu.step_cost`'s form) and the fit's report."""
    if not model_preset:
        raise ValueError(
            "config key model.preset: the CPU platform's fit replays the floor through the "
            "simulated engine, which needs the model's preset (tiny-llama3-2x64-hd32 for the "
            "shared tiny model)"
        )
    runs, skipped = _ok_floor_runs(floor_runs)
    engines: dict[str, Any] = {}
    for engine in sorted({r.engine for r in runs}):
        cost, report = fit_step_cost(
            engine, runs, gpu_memory_mib=gpu_memory_mib, model_preset=model_preset
        )
        engines[engine] = {
            "step_cost": cost.coefficients() | cost.after_idle(),
            "fit": report,
            "noise": floor_noise([r for r in runs if r.engine == engine]),
        }
    record = {"model_preset": model_preset, "engines": engines, "skipped_runs": skipped}
    write_json(out_path, record)
    return record


def _ok_floor_runs(floor_runs: Sequence[Mapping[str, Any]]) -> tuple[list[FloorRun], list[str]]:
    """(the floor runs whose run.json says `ok`, the folders of the others, sorted). A floor run
    that is not `ok` (refused for its machine load, failed) is no measurement."""
    every = [
        FloorRun(
            run_dir=Path(r["run_dir"]),
            trace_dir=Path(r["trace_dir"]),
            engine=str(r["engine"]),
            arm=str(r["arm"]),
            flags=tuple(str(f) for f in r["flags"]),
        )
        for r in floor_runs
    ]
    status = {
        r.run_dir: json.loads((r.run_dir / "run.json").read_text(encoding="utf-8"))["status"]
        for r in every
    }
    runs = [r for r in every if status[r.run_dir] == "ok"]
    return runs, sorted(str(r.run_dir) for r in every if status[r.run_dir] != "ok")


def floor_medians(run: FloorRun) -> tuple[float, float] | None:
    """(median TTFT, median inter-token gap) of one floor run's measured requests (the warm-ups
    left out), or None when it has no request with both."""
    requests = pq.read_table(run.run_dir / "requests.parquet").to_pylist()
    ttft: list[float] = []
    gaps: list[float] = []
    for req in requests:
        observed = None if req["warmup"] else observed_times(req)
        if observed is not None:
            ttft.append(observed[0])
            gaps.extend(observed[1])
    if not (ttft and gaps):
        return None
    return float(np.median(ttft)), float(np.median(gaps))


def floor_drift(
    before: Sequence[FloorRun], after: Sequence[FloorRun], band: float
) -> dict[str, Any]:
    """How far the machine's speed moved between two makings of the same floors (before and
    after a deployment's loaded runs). Runs are paired by engine, arm, shape and repetition; per
    engine and arm, the median over its pairs of ln(after / before) of the median TTFT and of the
    median inter-token gap, given as ratios. A deployment agrees when both lie within
    exp(±band): a fit from either floor then prices its loaded runs within the band."""

    def key(run: FloorRun) -> tuple[str, str, str, str]:
        return (run.engine, run.arm, run.trace_dir.parent.name, run.trace_dir.name)

    first = {key(r): r for r in before}
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for run in after:
        earlier = first.get(key(run))
        if earlier is None:
            continue
        old, new = floor_medians(earlier), floor_medians(run)
        if old is None or new is None:
            continue
        moved = (math.log(new[0] / old[0]), math.log(new[1] / old[1]))
        pairs.setdefault((run.engine, run.arm), []).append(moved)
    out: dict[str, Any] = {}
    for (engine, arm), logs in sorted(pairs.items()):
        ttft, itl = np.median(np.asarray(logs), axis=0).tolist()
        out[f"{engine}/{arm}"] = {
            "pairs": len(logs),
            "ttft_ratio": round(math.exp(ttft), 4),
            "itl_ratio": round(math.exp(itl), 4),
            "agrees": abs(ttft) <= band and abs(itl) <= band,
        }
    return out


def floor_bracket(
    before: Sequence[FloorRun],
    after: Sequence[FloorRun],
    *,
    band: float,
    max_noise: float | None = None,
    deployments: Iterable[str] = (),
) -> dict[str, Any]:
    """The bracket's verdict per deployment (ENGINE/ARM): `floor_drift` of its floor made before
    its loaded runs against the same floor made after them (`band` a fraction: 0.05 is ±5%). A
    deployment of `deployments` with no pair is listed with `agrees` false: nothing shows its
    machine held still.

    With `max_noise` (the quiet-floor bar), each deployment also carries its engine's `noise`
    (`floor_noise` of the floor before, both arms: the fit pools them, so one arm's noisy floor
    moves the other's predictions) and `quiet`: both sd at most the bar. A deployment is `judged`
    when it agrees and, with a bar, is quiet."""
    if not 0 < band < 1:
        raise ValueError(f"config key floor.bracket.band: {band} is not a fraction in (0, 1)")
    drift = floor_drift(before, after, band=math.log1p(band))
    named = set(deployments) | {f"{r.engine}/{r.arm}" for r in (*before, *after)}
    for deployment in named - set(drift):
        drift[deployment] = {"pairs": 0, "ttft_ratio": None, "itl_ratio": None, "agrees": False}
    noise = {
        engine: floor_noise([r for r in before if r.engine == engine])
        for engine in {d.split("/")[0] for d in drift}
    }
    for deployment, entry in drift.items():
        quiet = None
        if max_noise is not None:
            sd = noise[deployment.split("/")[0]]
            both = (sd["ttft_ln_sd"], sd["itl_ln_sd"])
            quiet = all(x is not None and x <= max_noise for x in both)
            entry["noise"] = {"ttft_ln_sd": both[0], "itl_ln_sd": both[1]}
        entry["quiet"] = quiet
        entry["judged"] = bool(entry["agrees"]) and quiet is not False
    return {"band": band, "max_noise": max_noise, "deployments": dict(sorted(drift.items()))}


def write_floor_drift(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    *,
    band: float,
    max_noise: float | None = None,
    out_path: str | Path,
) -> dict[str, Any]:
    """The bracket's record (config `floor.bracket`; `floor_bracket`) of the workflow's floor
    runs, written with the runs left out for not being `ok`: a deployment whose runs were all
    refused is still listed, and not judged."""
    first, skipped_before = _ok_floor_runs(before)
    then, skipped_after = _ok_floor_runs(after)
    record = floor_bracket(
        first,
        then,
        band=band,
        max_noise=max_noise,
        deployments=[f"{r['engine']}/{r['arm']}" for r in (*before, *after)],
    )
    record["skipped_runs"] = sorted([*skipped_before, *skipped_after])
    write_json(out_path, record)
    return record


def floor_noise(runs: Sequence[FloorRun]) -> dict[str, Any]:
    """The platform's noise, measured as the floor is: the spread of repeated floors. Per
    (arm, shape) with two or more repetitions, the sd of ln(median TTFT) and of ln(median ITL)
    across them; pooled as the root mean square over those groups."""
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for run in runs:
        medians = floor_medians(run)
        if medians is not None:
            shape = run.trace_dir.parent.name  # the floor id (floor-s0.50-L1024)
            groups.setdefault((run.arm, shape), []).append(medians)
    spreads = {
        f"{arm}/{shape}": [float(np.std(np.log(v), ddof=1)) for v in zip(*values, strict=True)]
        for (arm, shape), values in sorted(groups.items())
        if len(values) >= 2
    }
    if not spreads:
        return {"groups": 0, "ttft_ln_sd": None, "itl_ln_sd": None}
    pooled = pooled_spread(spreads.values())
    return {
        "groups": len(spreads),
        "ttft_ln_sd": round(pooled[0], 4),
        "itl_ln_sd": round(pooled[1], 4),
        "per_group": {k: [round(x, 4) for x in v] for k, v in spreads.items()},
    }


def pooled_spread(spreads: Iterable[Sequence[float]]) -> tuple[float, float]:
    """(TTFT, ITL) spreads of several groups pooled as `floor_noise` pools them: the root mean
    square over the groups. Given one arm's groups of a platform file's `per_group`, that arm's
    noise read by the engine's rule (benchmarks/floor_noise_by_day.py)."""
    pooled = np.sqrt(np.mean(np.square([list(s) for s in spreads]), axis=0))
    return float(pooled[0]), float(pooled[1])


def read_step_costs(platform_path: str | Path) -> dict[str, StepCost]:
    """The step costs of a platform file written by `write_cpu_platform`."""
    data = json.loads(Path(platform_path).read_text(encoding="utf-8"))
    return {
        engine: StepCost.from_mapping(
            engine, entry["step_cost"], f"{platform_path}: engines.{engine}.step_cost"
        )
        for engine, entry in data["engines"].items()
    }


def prediction_settings(
    config: Mapping[str, Any], *, arm: str, engine: str, condition: str
) -> dict[str, Any]:
    """What a predicted run of the grid is made of, `predict_run`'s `settings`: the deployment's
    flags and the run protocol, from the workflow's configuration."""
    deployment = deployment_for(config, arm, engine, condition)
    return {
        "flags": list(deployment.flags),
        "deployment_id": deployment.id,
        "gpu_memory_mib": int(config["gpu"]["memory_mib"]),
        "model_preset": config["model"].get("preset"),
        "warmup_requests": int(config["dispatch"]["warmup_requests"]),
        "request_timeout_s": float(config["dispatch"]["request_timeout_s"]),
        "stream_interval": int(config["dispatch"].get("stream_interval", 1)),
        "telemetry_step_s": float(config["telemetry"]["step_s"]),
        "success_threshold": float(config["campaign"]["success_threshold"]),
        "offered_load_rps": offered_load(conditions(config)[condition], config["workload"]),
    }


def predict_run(
    settings: Mapping[str, Any],
    *,
    platform_path: str | Path,
    trace_path: str | Path,
    manifest_path: str | Path,
    arm: str,
    engine: str,
    condition: str,
    rep: str,
    requests_path: str | Path,
    scrape_path: str | Path,
    run_json_path: str | Path,
    step_costs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One run of the grid predicted on the fitted CPU platform: the simulated engine on the
    run's own trace and protocol, no drift or noise (the platform's noise is measured from the
    floor instead: docs/simulator.md). `step_costs`: what times the passes in place of the
    platform file's step costs (a benchmark's `FeatureRecorder`)."""
    if not settings.get("model_preset"):
        raise ValueError("config key model.preset: required to predict a run on the CPU platform")
    return simulate_run_files(
        trace_path=trace_path,
        manifest_path=manifest_path,
        arm=arm,
        engine=engine,
        condition=condition,
        rep=rep,
        flags=list(settings["flags"]),
        gpu_name="CPU",
        gpu_memory_mib=int(settings["gpu_memory_mib"]),
        model_preset=str(settings["model_preset"]),
        deployment_id=str(settings["deployment_id"]),
        warmup_requests=int(settings["warmup_requests"]),
        request_timeout_s=float(settings["request_timeout_s"]),
        stream_interval=int(settings["stream_interval"]),
        telemetry_step_s=float(settings["telemetry_step_s"]),
        success_threshold=float(settings["success_threshold"]),
        offered_load_rps=float(settings["offered_load_rps"]),
        attempt=1,
        faults=[],
        requests_path=requests_path,
        scrape_path=scrape_path,
        run_json_path=run_json_path,
        platform=PlatformModel(PlatformSettings(enabled=False)),
        step_costs=read_step_costs(platform_path) if step_costs is None else step_costs,
    )
