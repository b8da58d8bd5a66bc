"""results/queue_models.csv: the fluid and the closed queueing model against every measured run.

One row per parsed run (sorted by run id), from artifacts only: the run (requests.parquet,
run.json), its trace (trace.parquet, manifest.json), its deployment's resolved configuration
(resolved.json: the KV cache's size, from the engine's start-up log), the unloaded floor
(results/floor.csv) and, when given, the probes of the capacity searches (docs/capacity.md). No
loaded run of the grid enters a prediction of the closed model.

Columns (docs/analysis.md, "Closed queueing model"):

- the measurement: the trace's offered load Λ (its requests ÷ its duration), X, TTFT p50 and
  mean, and the TTFT growth (slope of TTFT on send time, `queueing.ttft_growth`);
- `saturated`: the run's median TTFT is at least `SATURATED_FLOOR_FACTOR` times its floor's
  (queueing is at least 90% of the median), a property of the measurement alone;
- the fluid model as the analysis computes it (`summary.Analysis.fluid_runs`: Eq. 8 on the
  seed-paired runs where vLLM falls behind and SGLang keeps pace), and Eq. 8 on the run alone
  (`fluid_run_*`: δ = 1 − X/Λ from its own throughput and trace, on its floor's TTFT);
- the closed model (`queueing`): the engine from the floor (P, τ₁), the KV cache (slots) and the
  per-sequence step cost c: from the saturated capacity probes of the same arm, engine and request
  shape when there are any (`closed_source` capacity: loaded runs on their own seeds, each
  reproduced through the model, `_calibrate`), else 0 (`floor`: a decode step costs τ₁ at any
  batch size, an upper bound on the throughput);
- `given_x_*`: the closed model's structure with its capacity set so that its throughput equals
  the run's measured X (saturated runs only): the same input the fluid model takes, to compare
  the two structures apart from the capacity estimate.

`results/queue_models_summary.csv` gives, per set of runs (saturated, fluid-eligible, all) and
model, the number of runs, the geometric mean of predicted ÷ measured TTFT p50 (`mean_ratio`)
and exp(mean |ln ratio|) (`typical_factor`: how far off a run typically is, either way).
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize

from servelab.analysis import queueing, stats
from servelab.analysis.reduce import latency_sample, reduce_requests, run_metrics
from servelab.analysis.runs import load_runs, read_manifests
from servelab.analysis.slo import csv_cell
from servelab.analysis.summary import Analysis, FluidRun
from servelab.artifacts import (
    REQUESTS_SCHEMA,
    ArtifactError,
    read_json,
    read_parquet,
    read_run_json,
    read_trace_manifest,
    write_json,
    write_text,
)
from servelab.engines.registry import engine_spec, product_of
from servelab.grid.settings import AnalysisSettings

__all__ = [
    "COLUMNS",
    "SATURATED_FLOOR_FACTOR",
    "SUMMARY_COLUMNS",
    "Probe",
    "discover_probe_dirs",
    "kv_capacity_tokens",
    "read_probes",
    "write_queue_models",
]

log = logging.getLogger("servelab.analysis")
NAN = float("nan")
PathLike = str | Path

# A run is saturated when its median TTFT is at least this many times its floor's.
SATURATED_FLOOR_FACTOR = 10.0
# vLLM V0's block manager keeps this fraction of its KV blocks free when it admits a prompt
# (`watermark=0.01`, vllm/core/block_manager_v2.py).
VLLM_V0_WATERMARK = 0.01
# The search for the per-sequence cost that slows the model to a measured X doubles it from one
# decode step at most this often (2^20 steps: far past any engine's).
GIVEN_X_DOUBLINGS = 20
# The capacity probes may raise the KV estimate of the slots by at most this many.
MAX_EXTRA_SLOTS = 64

COLUMNS = (
    "run_id",
    "arm",
    "engine",
    "condition",
    "rep",
    "offered_rps",
    "measured_throughput_rps",
    "measured_ttft_p50_s",
    "measured_ttft_mean_s",
    "measured_ttft_growth",
    "floor_ttft_p50_s",
    "saturated",
    "fluid_eligible",
    "fluid_ttft_p50_s",
    "fluid_ratio",
    "fluid_run_ttft_p50_s",
    "fluid_run_ratio",
    "fluid_run_ttft_growth",
    "closed_source",
    "closed_probes",
    "closed_slots",
    "closed_per_seq_s",
    "closed_capacity_rps",
    "closed_throughput_rps",
    "closed_throughput_ratio",
    "closed_ttft_p50_s",
    "closed_ratio",
    "closed_ttft_mean_s",
    "closed_ttft_growth",
    "fork_join_growth",
    "given_x_ttft_p50_s",
    "given_x_ratio",
    "given_x_ttft_growth",
)
SUMMARY_COLUMNS = (
    "runs",
    "model",
    "n",
    "mean_ratio",
    "typical_factor",
    "min_ratio",
    "max_ratio",
)
# (model, predicted column, measured column) in the summary's order: TTFT p50, throughput, and
# the TTFT growth over the run
SUMMARY_MODELS = (
    ("fluid", "fluid_ttft_p50_s", "measured_ttft_p50_s"),
    ("fluid_run", "fluid_run_ttft_p50_s", "measured_ttft_p50_s"),
    ("closed", "closed_ttft_p50_s", "measured_ttft_p50_s"),
    ("given_x", "given_x_ttft_p50_s", "measured_ttft_p50_s"),
    ("closed_throughput", "closed_throughput_rps", "measured_throughput_rps"),
    ("fluid_run_growth", "fluid_run_ttft_growth", "measured_ttft_growth"),
    ("closed_growth", "closed_ttft_growth", "measured_ttft_growth"),
    ("given_x_growth", "given_x_ttft_growth", "measured_ttft_growth"),
)
SUMMARY_SETS = ("saturated", "fluid_eligible", "all")

DEFINITIONS = {
    "offered_rps": "the trace's requests / its duration_s (Λ)",
    "measured_throughput_rps": "X of the run (docs/analysis.md)",
    "measured_ttft_p50_s": "TTFT p50 of the run's latency sample",
    "measured_ttft_mean_s": "mean TTFT of the run's latency sample",
    "measured_ttft_growth": "least-squares slope of TTFT on send time over the latency sample (s/s)",
    "floor_ttft_p50_s": "the deployment's unloaded TTFT p50 on the run's request shape (floor.csv)",
    "saturated": f"measured TTFT p50 >= {SATURATED_FLOOR_FACTOR:g} x floor TTFT p50",
    "fluid_eligible": "the fluid model applies (numbers.json fluid_model: vLLM > 1% behind, SGLang keeps pace)",
    "fluid_ttft_p50_s": "Eq. 8: SGLang's p50 in the same repetition + (T/2) delta/(1 - delta)",
    "fluid_run_ttft_p50_s": "Eq. 8 on the run alone: floor TTFT p50 + (T/2)(offered/X - 1), where X < 0.99 offered",
    "fluid_run_ttft_growth": "the open fluid model's wait growth, offered/X - 1",
    "closed_source": "where the closed model's per-sequence step cost comes from: capacity (the saturated capacity probes of the run's arm, engine and request shape) or floor (0: a decode step costs the floor's TPOT at any batch size, an upper bound on the throughput)",
    "closed_probes": "the saturated capacity probes the per-sequence cost is the median over",
    "closed_slots": "requests in service at most: floor((KV tokens - prefix blocks - room to admit one) / (its own prompt blocks + half its output + half a block)) + 1, capped by the engine's running-request limit; raised where the probes need more (queueing.engine_slots)",
    "closed_per_seq_s": "c: decode step cost per further sequence in the batch (s)",
    "closed_capacity_rps": "mu(slots): the closed model's saturated throughput for the trace's mean output",
    "closed_throughput_rps": "X of the closed model on the run's trace (same window as the measurement)",
    "closed_ttft_p50_s": "TTFT p50 of the closed model on the run's trace",
    "closed_ttft_growth": "least-squares slope of the closed model's TTFT on release time",
    "fork_join_growth": "the fork-join approximation's wait growth a: X(1+a) = lambda sum_k m_k (1+a)^-k at X = closed_capacity_rps",
    "given_x_ttft_p50_s": "the closed model with its per-sequence cost set so that its X equals the measured X (saturated runs only): the fluid model's input through the closed structure",
    "given_x_ttft_growth": "least-squares slope of that model's TTFT on release time",
    "ratio": "every *_ratio is predicted / measured",
}


# --------------------------------------------------------------------------- inputs


def kv_capacity_tokens(facts: Mapping[str, Any], block_size: Any) -> int | None:
    """The KV cache's size in tokens from a start-up log's facts (resolved.json): vLLM V1's
    and SGLang 0.5's `kv_cache_tokens`, SGLang's `max_total_num_tokens`, vLLM V0's
    `num_gpu_blocks` x its block size, llama.cpp's `n_ctx`; None when the log shows none."""
    for key in ("kv_cache_tokens", "max_total_num_tokens"):
        if facts.get(key):
            return int(facts[key])
    if facts.get("num_gpu_blocks") and block_size:
        return int(facts["num_gpu_blocks"]) * int(block_size)
    if facts.get("n_ctx"):
        return int(facts["n_ctx"])
    return None


def max_running(facts: Mapping[str, Any], resolved: Mapping[str, Any]) -> int | None:
    """The engine's own cap on requests in service (max_num_seqs, max_running_requests,
    llama.cpp's n_slots), None when none is known."""
    for value in (
        resolved.get("max_num_seqs"),
        resolved.get("max_running_requests"),
        facts.get("max_num_seqs"),
        facts.get("max_running_requests"),
        facts.get("n_slots"),
    ):
        if value:
            return int(value)
    return None


def admission_tokens(engine: str, kv_tokens: int, prompt_tokens: float) -> float | None:
    """Free KV tokens the engine needs to admit one more request, where its scheduler says so:
    vLLM V0 (0.6.3's `BlockSpaceManager.can_allocate`) wants room for the whole prompt, cached
    prefix included, plus a watermark of 1% of the cache; None (the newcomer's own tokens) for
    the others."""
    spec = engine_spec(engine)
    if product_of(engine) == "vllm" and spec.family == "V0":
        return prompt_tokens + VLLM_V0_WATERMARK * kv_tokens
    return None


@dataclass(frozen=True)
class FloorTimes:
    ttft_p50_s: float
    tpot_p50_s: float


def read_floor(path: PathLike) -> dict[tuple[str, str, int], FloorTimes]:
    """results/floor.csv by (deployment, sharing as written, prompt tokens)."""
    out: dict[tuple[str, str, int], FloorTimes] = {}
    try:
        with Path(path).open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                key = (row["deployment_id"], row["sharing"], int(row["prompt_tokens"]))
                out[key] = FloorTimes(float(row["ttft_p50_s"]), float(row["tpot_p50_s"]))
    except (OSError, KeyError, ValueError) as exc:
        raise ArtifactError(f"{path}: not a floor table ({exc})") from exc
    return out


@dataclass(frozen=True)
class Probe:
    """One repetition of a capacity probe (a loaded run on its own seed, never the grid's): its
    folder, its trace and what it measured."""

    run_dir: Path
    arm: str
    engine: str
    sharing: str  # as floor.csv writes it ("0.90")
    prompt_tokens: int
    trace: tuple[str, str]  # (trace.parquet, manifest.json)
    throughput: float
    ttft_p50: float


def discover_probe_dirs(search_dirs: Sequence[PathLike]) -> list[str]:
    """Every probe repetition's run folder under the capacity searches' folders
    (`{search}/probe-{k}/runs/{arm}/{engine}/{probe}/{rep}`), sorted."""
    found = {
        str(run_json.parent)
        for search in search_dirs
        for run_json in Path(search).glob("probe-*/runs/*/*/*/*/run.json")
    }
    return sorted(found)


def read_probes(run_dirs: Sequence[PathLike], exclude_first_graph: bool = True) -> list[Probe]:
    """Capacity probe repetitions with status ok (docs/capacity.md: each a run folder under
    results/capacity/{search}/probe-{k}/runs/, its trace under that probe's traces/)."""
    out = []
    for raw in sorted(str(p) for p in run_dirs):
        run_dir = Path(raw)
        record = read_run_json(run_dir / "run.json")
        if record["status"] != "ok":
            continue
        trace_dir = run_dir.parents[4] / "traces" / str(record["condition"]) / str(record["rep"])
        manifest = read_trace_manifest(trace_dir / "manifest.json")
        if int(manifest["seed"]) != int(record["seed"]):
            raise ArtifactError(
                f"{trace_dir / 'manifest.json'}: seed {manifest['seed']} differs from probe "
                f"{run_dir}'s {record['seed']}"
            )
        m = _measured(run_dir, exclude_first_graph)
        out.append(
            Probe(
                run_dir=run_dir,
                arm=str(record["arm"]),
                engine=str(record["engine"]),
                sharing=f"{float(manifest['sharing']):.2f}",
                prompt_tokens=int(manifest["prompt_tokens"]),
                trace=(str(trace_dir / "trace.parquet"), str(trace_dir / "manifest.json")),
                throughput=m.throughput,
                ttft_p50=m.ttft_p50,
            )
        )
    return out


# --------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class Measured:
    throughput: float
    ttft_p50: float
    ttft_mean: float
    growth: float


def _measured(run_dir: Path, exclude_first_graph: bool) -> Measured:
    table = read_parquet(run_dir / "requests.parquet", REQUESTS_SCHEMA)
    req = reduce_requests(table, str(run_dir / "requests.parquet"))
    m = run_metrics(req, exclude_first_graph=exclude_first_graph)
    sample = latency_sample(req, exclude_first_graph=exclude_first_graph)
    ttft = req.ttft[sample]
    return Measured(
        throughput=m.throughput,
        ttft_p50=m.ttft_p50,
        ttft_mean=float(np.mean(ttft)) if ttft.size else NAN,
        growth=queueing.ttft_growth(req.sent[sample], ttft),
    )


def _predicted(
    trace: queueing.GraphTrace, engine: queueing.Engine, sample: np.ndarray
) -> dict[str, float]:
    ev = queueing.evaluate(trace, engine)
    ttft = ev.ttft_s
    return {
        "throughput": ev.throughput,
        "p50": stats.percentile(ttft[sample], 50),
        "mean": float(np.mean(ttft[sample])) if sample.any() else NAN,
        "growth": queueing.ttft_growth(ev.ready_s[sample], ttft[sample]),
    }


def _given_throughput(
    trace: queueing.GraphTrace, engine: queueing.Engine, target: float
) -> queueing.Engine | None:
    """The engine whose per-sequence cost makes the closed model's X on `trace` equal `target`
    (scipy.optimize.brentq on c); c = 0 when even that serves less than `target`; None when no
    cost brings it down to `target` (requests that never share the engine: c does not matter)."""

    def excess(c: float) -> float:
        return queueing.evaluate(trace, engine.with_per_seq(c)).throughput - target

    if excess(0.0) <= 0:
        return engine.with_per_seq(0.0)
    high = max(engine.step_s, 1e-3)
    for _ in range(GIVEN_X_DOUBLINGS):
        if excess(high) < 0:
            break
        high *= 2.0
    else:
        return None
    c = optimize.brentq(excess, 0.0, high, xtol=1e-9, rtol=1e-9, maxiter=200)
    return engine.with_per_seq(float(c))


def _ratio(pred: float, meas: float) -> float:
    if math.isfinite(pred) and math.isfinite(meas) and pred > 0 and meas > 0:
        return pred / meas
    return NAN


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Calibration:
    """What the capacity probes of one deployment and shape say: the slots (raised above the KV
    estimate when even free batching could not serve the probes' median X) and the median
    per-sequence cost c over the probes; `probes` = 0 when there were none."""

    slots: int
    per_seq_s: float
    probes: int


@dataclass
class _Inputs:
    """Everything a row is computed from, read once."""

    traces: Mapping[tuple[str, str], tuple[str, str]]
    floor: Mapping[tuple[str, str, int], FloorTimes]
    resolved: Mapping[str, Mapping[str, Any]]
    probes: Sequence[Probe]
    settings: AnalysisSettings
    notes: list[str]
    graph_traces: dict[tuple[str, str], queueing.GraphTrace]
    calibrations: dict[tuple[str, str, int], Calibration]

    def trace(self, key: tuple[str, str], paths: tuple[str, str]) -> queueing.GraphTrace:
        if key not in self.graph_traces:
            self.graph_traces[key] = queueing.read_graph_trace(*paths)
        return self.graph_traces[key]


def _rows(run_dirs: Sequence[PathLike], inputs: _Inputs) -> list[dict[str, Any]]:
    settings = inputs.settings
    runset = load_runs(run_dirs, exclude_first_graph=settings.exclude_first_graph, telemetry=False)
    manifests = {key: read_trace_manifest(paths[1]) for key, paths in inputs.traces.items()}
    analysis = Analysis(
        runset,
        settings=settings,
        manifests=read_manifests([p[1] for p in inputs.traces.values()]),
    )
    fluid: dict[tuple[str, str, str], FluidRun] = {
        (f.arm, f.condition, f.rep): f for f in analysis.fluid_runs
    }
    gap_engine = analysis.engine_pair[0] if len(analysis.engines) == 2 else None
    rows = []
    for run_id in sorted(runset.runs):
        run = runset.runs[run_id]
        key = (run.condition, run.rep)
        if key not in inputs.traces:
            raise ArtifactError(f"{run_id}: no trace for {run.condition}/{run.rep}")
        manifest = manifests[key]
        if int(manifest["seed"]) != run.seed:
            raise ArtifactError(
                f"{inputs.traces[key][1]}: seed {manifest['seed']} differs from run {run_id}'s "
                f"{run.seed}"
            )
        trace = inputs.trace(key, inputs.traces[key])
        record = read_run_json(Path(run.path) / "run.json")
        shape = (f"{float(manifest['sharing']):.2f}", int(manifest["prompt_tokens"]))
        measured = _measured(Path(run.path), settings.exclude_first_graph)
        offered = trace.n / trace.duration_s
        fl = inputs.floor.get((str(record["deployment_id"]), *shape))
        f = fluid.get((run.arm, run.condition, run.rep)) if run.engine == gap_engine else None
        row: dict[str, Any] = {
            "run_id": run_id,
            "arm": run.arm,
            "engine": run.engine,
            "condition": run.condition,
            "rep": run.rep,
            "offered_rps": offered,
            "measured_throughput_rps": measured.throughput,
            "measured_ttft_p50_s": measured.ttft_p50,
            "measured_ttft_mean_s": measured.ttft_mean,
            "measured_ttft_growth": measured.growth,
            "floor_ttft_p50_s": fl.ttft_p50_s if fl else NAN,
            "saturated": _saturated(measured.ttft_p50, fl),
            "fluid_eligible": bool(f and f.eligible),
            "fluid_ttft_p50_s": f.predicted_vllm_p50 if f and f.eligible else NAN,
        }
        row["fluid_ratio"] = _ratio(row["fluid_ttft_p50_s"], measured.ttft_p50)
        row.update(_fluid_run_columns(trace, fl, measured, offered))
        row.update(_closed_columns(run_id, trace, fl, record, shape, measured, row, inputs))
        rows.append(row)
    return rows


def _saturated(ttft_p50: float, fl: FloorTimes | None) -> bool:
    return bool(fl and ttft_p50 >= SATURATED_FLOOR_FACTOR * fl.ttft_p50_s)


def _fluid_run_columns(
    trace: queueing.GraphTrace, fl: FloorTimes | None, measured: Measured, offered: float
) -> dict[str, float]:
    """Eq. 8 on the run alone: δ = 1 − X/Λ, the wait of the median request (T/2)·δ/(1 − δ) on
    top of the floor's TTFT, where the run falls more than 1% behind its trace."""
    x = measured.throughput
    delta = 1.0 - x / offered if x > 0 else NAN
    if not (math.isfinite(delta) and delta > 0.01 and fl is not None):
        return {"fluid_run_ttft_p50_s": NAN, "fluid_run_ratio": NAN, "fluid_run_ttft_growth": NAN}
    p50 = fl.ttft_p50_s + stats.fluid_wait_p50(delta, trace.duration_s)
    return {
        "fluid_run_ttft_p50_s": p50,
        "fluid_run_ratio": _ratio(p50, measured.ttft_p50),
        "fluid_run_ttft_growth": delta / (1.0 - delta),
    }


def _engine(
    trace: queueing.GraphTrace,
    fl: FloorTimes,
    record: Mapping[str, Any],
    resolved: Mapping[str, Any] | None,
) -> queueing.Engine | None:
    """The run's engine as the closed model sees it, with c = 0; None without a KV size."""
    facts = dict((resolved or {}).get("facts") or {})
    cfg = dict(record.get("resolved_config") or {})
    kv = kv_capacity_tokens(facts, cfg.get("block_size"))
    if kv is None:
        return None
    mean_output = trace.mean_output
    block = int(cfg.get("block_size") or 1)
    prompt = float(np.mean(trace.prompt_tokens)) + 1.0  # the engines prepend BOS
    slots = queueing.engine_slots(
        kv,
        prompt_tokens=prompt,
        prefix_tokens=float(np.mean(trace.prefix_tokens)) + 1.0,
        mean_output=mean_output,
        block_size=block,
        admission_tokens=admission_tokens(
            str(record["engine"]), kv, math.ceil(prompt / block) * block
        ),
        max_running=max_running(facts, cfg),
    )
    return queueing.Engine(slots, fl.ttft_p50_s, fl.tpot_p50_s, 0.0, mean_output)


def _calibrate(
    engine: queueing.Engine,
    fl: FloorTimes,
    record: Mapping[str, Any],
    shape: tuple[str, int],
    inputs: _Inputs,
) -> Calibration:
    """The capacity probes' calibration of `engine` (c = 0) for the run's arm, engine and shape:
    its saturated probes (median TTFT at least SATURATED_FLOOR_FACTOR x the floor's), each a
    loaded run on its own trace; the slots the fewest (from the KV estimate up) with which the
    closed model at c = 0 serves their median X; then, per probe, the c that makes the model's
    X on the probe's trace equal the probe's (`_given_throughput`), and their median. Cached per
    deployment and shape."""
    key = (str(record["deployment_id"]), *shape)
    if key in inputs.calibrations:
        return inputs.calibrations[key]
    same = (str(record["arm"]), str(record["engine"]), *shape)
    mine = [
        p
        for p in inputs.probes
        if (p.arm, p.engine, p.sharing, p.prompt_tokens) == same
        and _saturated(p.ttft_p50, fl)
        and math.isfinite(p.throughput)
    ]
    result = Calibration(engine.slots, NAN, 0)
    if mine:
        traces = [inputs.trace(("probe", str(p.run_dir)), p.trace) for p in mine]

        def on(trace: queueing.GraphTrace, slots: int) -> queueing.Engine:
            return queueing.Engine(slots, engine.prefill_s, engine.step_s, 0.0, trace.mean_output)

        target = float(np.median([p.throughput for p in mine]))
        slots = engine.slots
        for _ in range(MAX_EXTRA_SLOTS):
            served = np.median([queueing.evaluate(t, on(t, slots)).throughput for t in traces])
            if served >= target:
                break
            slots += 1
        if slots != engine.slots:
            inputs.notes.append(
                f"{key[0]} on sharing {key[1]}, {key[2]} tokens: the capacity probes' median "
                f"X = {target:.6g} needs {slots} slots, not the KV estimate's {engine.slots}"
            )
        values = []
        for probe, trace in zip(mine, traces, strict=True):
            fitted = _given_throughput(trace, on(trace, slots), probe.throughput)
            if fitted is None:
                inputs.notes.append(
                    f"{probe.run_dir}: no per-sequence cost slows the closed model to this "
                    f"probe's X = {probe.throughput:.6g}: not used"
                )
                continue
            values.append(fitted.per_seq_s)
        if values:
            result = Calibration(slots, float(np.median(values)), len(values))
    inputs.calibrations[key] = result
    return result


def _closed_columns(
    run_id: str,
    trace: queueing.GraphTrace,
    fl: FloorTimes | None,
    record: Mapping[str, Any],
    shape: tuple[str, int],
    measured: Measured,
    row: Mapping[str, Any],
    inputs: _Inputs,
) -> dict[str, Any]:
    out: dict[str, Any] = {c: NAN for c in COLUMNS if c.startswith(("closed_", "given_x_"))}
    out.update({"closed_source": "", "closed_slots": "", "closed_probes": 0})
    out["fork_join_growth"] = NAN
    if fl is None:
        inputs.notes.append(f"{run_id}: no floor on its deployment and shape: no closed model")
        return out
    engine = _engine(trace, fl, record, inputs.resolved.get(str(record["deployment_id"])))
    if engine is None:
        inputs.notes.append(f"{run_id}: its start-up log shows no KV cache size: no closed model")
        return out
    calibration = _calibrate(engine, fl, record, shape, inputs)
    probes = calibration.probes
    source = "floor"
    if probes:
        engine = queueing.Engine(
            calibration.slots,
            engine.prefill_s,
            engine.step_s,
            calibration.per_seq_s,
            engine.mean_output,
        )
        source = "capacity"
    sample = trace.graph_id >= (1 if inputs.settings.exclude_first_graph else 0)
    pred = _predicted(trace, engine, sample)
    out.update(
        {
            "closed_source": source,
            "closed_probes": probes,
            "closed_slots": engine.slots,
            "closed_per_seq_s": engine.per_seq_s,
            "closed_capacity_rps": engine.capacity,
            "closed_throughput_rps": pred["throughput"],
            "closed_throughput_ratio": _ratio(pred["throughput"], measured.throughput),
            "closed_ttft_p50_s": pred["p50"],
            "closed_ratio": _ratio(pred["p50"], measured.ttft_p50),
            "closed_ttft_mean_s": pred["mean"],
            "closed_ttft_growth": pred["growth"],
            "fork_join_growth": queueing.fork_join_growth(
                trace.n_graphs / trace.duration_s, engine.capacity, trace.stage_sizes()
            ),
        }
    )
    if row["saturated"] and math.isfinite(measured.throughput):
        fitted = _given_throughput(trace, engine, measured.throughput)
        if fitted is None:
            inputs.notes.append(
                f"{run_id}: no per-sequence cost slows the closed model to the measured "
                f"X = {measured.throughput:.6g}: no given_x prediction"
            )
            return out
        given = _predicted(trace, fitted, sample)
        out["given_x_ttft_p50_s"] = given["p50"]
        out["given_x_ratio"] = _ratio(given["p50"], measured.ttft_p50)
        out["given_x_ttft_growth"] = given["growth"]
    return out


def summarise(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per set of runs and model: how many runs have a positive prediction and measurement, the
    geometric mean of predicted ÷ measured, exp(mean |ln ratio|), and the range."""
    out = []
    for name in SUMMARY_SETS:
        members = [r for r in rows if name == "all" or r[name]]
        for model, predicted, measured in SUMMARY_MODELS:
            if name == "all" and measured == "measured_ttft_growth":
                continue  # below capacity TTFT does not grow: the ratio of two noises
            ratios = np.array(
                [_ratio(float(r[predicted]), float(r[measured])) for r in members],
                dtype=np.float64,
            )
            ratios = ratios[np.isfinite(ratios)]
            logs = np.log(ratios)
            out.append(
                {
                    "runs": name,
                    "model": model,
                    "n": int(ratios.size),
                    "mean_ratio": stats.geomean(ratios),
                    "typical_factor": float(np.exp(np.mean(np.abs(logs)))) if ratios.size else NAN,
                    "min_ratio": float(ratios.min()) if ratios.size else NAN,
                    "max_ratio": float(ratios.max()) if ratios.size else NAN,
                }
            )
    return out


def _csv(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return csv_cell(value)

    lines = [",".join(columns)] + [",".join(cell(r[c]) for c in columns) for r in rows]
    return "\n".join(lines) + "\n"


def write_queue_models(
    run_dirs: Sequence[PathLike],
    out_csv: PathLike,
    summary_csv: PathLike,
    *,
    traces: Sequence[tuple[PathLike, PathLike]],
    floor_csv: PathLike,
    resolved: Sequence[PathLike],
    probe_dirs: Sequence[PathLike] = (),
    settings: AnalysisSettings | None = None,
) -> list[Path]:
    """results/queue_models.csv (one row per parsed run), its summary, and `<out>.json` beside
    it (definitions, notes). `traces`: (trace.parquet, manifest.json) of every (condition, rep)
    the runs replayed; `resolved`: the deployments' resolved.json; `probe_dirs`: the run folders
    of capacity probes (optional: without them c = 0, the floor's upper bound)."""
    settings = AnalysisSettings() if settings is None else settings
    trace_paths: dict[tuple[str, str], tuple[str, str]] = {}
    for trace, manifest in traces:
        m = read_trace_manifest(manifest)
        trace_paths[(str(m["condition"]), str(m["rep"]))] = (str(trace), str(manifest))
    deployments = {}
    for path in resolved:
        doc = read_json(path, ("deployment_id", "facts"))
        deployments[str(doc["deployment_id"])] = doc
    inputs = _Inputs(
        traces=trace_paths,
        floor=read_floor(floor_csv),
        resolved=deployments,
        probes=read_probes(probe_dirs, settings.exclude_first_graph),
        settings=settings,
        notes=[],
        graph_traces={},
        calibrations={},
    )
    rows = _rows(run_dirs, inputs)
    write_text(out_csv, _csv(COLUMNS, rows))
    write_text(summary_csv, _csv(SUMMARY_COLUMNS, summarise(rows)))
    write_json(
        Path(f"{out_csv}.json"),
        {
            "format": "servelab-queue-models/1",
            "definitions": DEFINITIONS,
            "saturated_floor_factor": SATURATED_FLOOR_FACTOR,
            "exclude_first_graph": settings.exclude_first_graph,
            "capacity_probes": len(inputs.probes),
            "notes": inputs.notes,
        },
    )
    for note in inputs.notes:
        log.info(note)
    return [Path(out_csv), Path(summary_csv), Path(f"{out_csv}.json")]
