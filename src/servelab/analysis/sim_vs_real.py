"""The simulator against the real engines: `results/sim_vs_real.csv` (docs/simulator.md, "Against
the real engines").

Every run of the grid exists twice on the same seeded trace: measured on the real engine (the local
backend) and predicted by the simulated scheduler on the CPU platform fitted from the engine's floor
(servelab.sim.cpu_platform). Both are reduced by the analysis's own functions (servelab.analysis.
reduce), so a metric means the same on both sides. Per (engine, arm, condition):

- TTFT p50 and p95, TPOT p50, ITL p99 (per token, over the latency sample's requests), X (requests
  completed per second of the run's window) and the mean number of waiting requests (the engine's
  own gauge: `requests_waiting` in its metric map), each as the real value's mean over repetitions
  with its repetition interval (the smallest and largest repetition), the predicted mean, and the
  ratio predicted / real (`reps` real runs with status ok; `not_ok` counts those left out: a run
  refused for its machine load is no measurement). `sample_requests` and `sample_graphs` count
  what the real TTFT and TPOT percentiles rest on, over the kept repetitions: the latency
  sample's requests and the agent graphs they belong to (a graph's requests share its prefix and
  its queue, so a row of few graphs is a few graphs' critical paths, not a rate's percentiles);
- the saturation rate of each side (the rate at which X falls below `keeps_pace` × the traces'
  realised arrival rate, `arrivals_rps`, interpolated between the sweep's rates) in `sim_vs_real.json`, with the issue's goals checked:
  TTFT p50 within ±25% and p95 within ±35% at rates up to 90% of the real saturation, X within 5%
  at every rate, saturation within 10%;
- the iterations of every run as the client saw them (`iterations`: tokens of one iteration
  arrive together, iterations milliseconds apart), per run the median time from one iteration to
  the next by the tokens it emitted, real and predicted, in the summary: the per-iteration
  behaviour a miss is explained by;
- the waiting series of every run, real and predicted, per telemetry step, in
  `sim_vs_real_waiting.csv`.

The module reads run artifacts only (requests.parquet, scrape.parquet, run.json).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from servelab.analysis import stats
from servelab.analysis.reduce import reduce_requests, run_metrics
from servelab.artifacts import write_json, write_text
from servelab.engines.registry import engine_spec
from servelab.grid.settings import AnalysisSettings

__all__ = [
    "GOALS",
    "RunPair",
    "compare_runs",
    "goal_summary",
    "read_sim_vs_real_csv",
    "saturation_rate",
    "write_sim_vs_real",
]

METRICS = ("ttft_p50", "ttft_p95", "tpot_p50", "itl_p99", "throughput", "waiting_mean")
# The goals (docs/simulator.md): |ratio - 1| at most this, where it applies.
GOALS = {"ttft_p50": 0.25, "ttft_p95": 0.35, "throughput": 0.05, "saturation": 0.10}
# TTFT goals apply up to this fraction of the real saturation rate.
TTFT_GOAL_LOAD = 0.9


@dataclass(frozen=True)
class RunPair:
    """One run of the grid on both sides: the real run's folder and the predicted one's."""

    engine: str
    arm: str
    condition: str
    rep: str
    rate: float  # agent graphs per second (the condition's)
    duration_s: float  # the condition's arrival window
    real_dir: Path
    predicted_dir: Path


def _waiting_series(run_dir: Path, engine: str, window_s: float) -> list[tuple[float, float]]:
    """(t_s, waiting requests) samples of a run's engine gauge in its window [0, window_s],
    sorted by time (the window's closing samples, past its end, describe an idle engine:
    servelab.telemetry.canonical)."""
    name = engine_spec(engine).metric_map.get("requests_waiting")
    if name is None:
        return []
    table = pq.read_table(run_dir / "scrape.parquet")
    namespace, _, short = name.partition(":")
    accepted = {name, f"{namespace}_{short}"}  # an OpenMetrics exposition renames ns:x to ns_x
    out: dict[float, float] = {}
    for t, metric, value in zip(
        table.column("t_s").to_pylist(),
        table.column("source_metric").to_pylist(),
        table.column("value").to_pylist(),
        strict=True,
    ):
        if metric in accepted and t <= window_s + 1e-6:
            out[round(float(t), 3)] = out.get(round(float(t), 3), 0.0) + float(value)
    return sorted(out.items())


@dataclass(frozen=True)
class RunReading:
    """One run folder, read once: its status, compared values, iteration profile and waiting
    series."""

    status: str
    values: dict[str, float]
    profile: dict[str, dict[str, float]]
    waiting: list[tuple[float, float]]


def read_run(run_dir: Path, engine: str, duration_s: float) -> RunReading:
    """The compared metrics of one run folder, and the trace's realised arrival rate (its
    requests over the condition's arrival window: with arrivals of CV 1.5 a short run's count is
    far from the nominal rate's, and both sides serve the same trace)."""
    record = json.loads((run_dir / "run.json").read_text())
    table = pq.read_table(run_dir / "requests.parquet")
    req = reduce_requests(table, str(run_dir / "requests.parquet"))
    metrics = run_metrics(req)
    sample_rows = np.flatnonzero(
        ~req.warmup & req.ok & (req.n_chunks > 0) & np.isfinite(req.ttft) & (req.graph_id >= 1)
    )
    itl = req.itl_token[np.isin(req.itl_row, sample_rows)]
    itl = itl[np.isfinite(itl)]
    window_s = float(record["end_unix_s"]) - float(record["start_unix_s"])
    series = _waiting_series(run_dir, engine, window_s)
    waiting = [v for _t, v in series]
    values = {
        "ttft_p50": metrics.ttft_p50,
        "ttft_p95": metrics.ttft_p95,
        "tpot_p50": metrics.tpot_p50,
        "itl_p99": stats.percentile(itl, 99) if itl.size else math.nan,
        "throughput": metrics.throughput,
        "waiting_mean": float(np.mean(waiting)) if waiting else math.nan,
        "offered_rps": float(record["offered_load_rps"]),
        "arrivals_rps": metrics.n_requests / duration_s,
        "sample_requests": float(sample_rows.size),
        "sample_graphs": float(np.unique(req.graph_id[sample_rows]).size),
    }
    return RunReading(str(record["status"]), values, iteration_profile(table), series)


# The engine's steps as its clients saw them. A step's tokens reach the clients in one burst: a
# burst ends where a request already in it receives another token, or after STEP_GAP_S of silence.
# The server writes a burst on the engine's own core and may be interrupted in mid-burst, so two
# bursts less than STEP_MERGE_S apart with no request in common are one step. On the fourteenth
# sim-vs-real measurement this gives vLLM's own step count (1,053 against 1,053) and llama.cpp's
# own llama_decode count (1,990 against 1,971; 754 against 754), where cutting at every gap over
# 0.5 ms gave 1,107 and 3,918: llama-server writes each slot's token from its own HTTP thread
# (docs/simulator.md, "The front end's work, step by step").
STEP_GAP_S = 0.002
STEP_MERGE_S = 0.010
BATCH_BUCKETS = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 1_000_000))


@dataclass
class ClientStep:
    """One engine step as the clients saw it: the burst of its tokens."""

    first_s: float
    last_s: float
    served: set[str]  # requests that received a token in it
    firsts: int = 0  # of them, requests whose first token it carried
    tokens: int = 0  # tokens it streamed


def client_steps(
    rows: Sequence[Mapping[str, Any]], gap_s: float = STEP_GAP_S, merge_s: float = STEP_MERGE_S
) -> list[ClientStep]:
    """The steps of one run, in time order, from its requests' rows (`request_id`,
    `chunk_times_s`, `chunk_tokens`) as requests.parquet holds them (module comment above)."""
    chunks = sorted(
        (t, r["request_id"], k, n)
        for r in rows
        for k, (t, n) in enumerate(zip(r["chunk_times_s"], r["chunk_tokens"], strict=True))
    )
    bursts: list[ClientStep] = []
    for t, rid, k, n in chunks:
        last = bursts[-1] if bursts else None
        if last is None or t - last.last_s > gap_s or rid in last.served:
            last = ClientStep(t, t, set())
            bursts.append(last)
        last.served.add(rid)
        last.last_s = t
        last.firsts += k == 0
        last.tokens += n
    steps: list[ClientStep] = []
    for burst in bursts:
        before = steps[-1] if steps else None
        if (
            before is not None
            and not before.served & burst.served
            and burst.first_s - before.last_s < merge_s
        ):
            before.served |= burst.served
            before.firsts += burst.firsts
            before.tokens += burst.tokens
            before.last_s = burst.last_s
        else:
            steps.append(burst)
    return steps


def iterations(requests: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The engine's iterations as the client saw them (`client_steps`, warm-ups excluded): (start
    times, tokens emitted)."""
    measured = requests.filter(pc.invert(requests.column("warmup")))
    steps = client_steps(
        measured.select(["request_id", "chunk_times_s", "chunk_tokens"]).to_pylist()
    )
    return (
        np.array([s.first_s for s in steps], dtype=np.float64),
        np.array([s.tokens for s in steps], dtype=np.int64),
    )


def iteration_profile(requests: pa.Table) -> dict[str, dict[str, float]]:
    """Median time from one iteration to the next, by the number of tokens it emitted (the decode
    batch plus the prompts it finished): the per-iteration behaviour both sides are compared on."""
    starts, tokens = iterations(requests)
    if starts.size < 2:
        return {}
    gaps, sizes = np.diff(starts), tokens[:-1]
    out: dict[str, dict[str, float]] = {}
    for low, high in BATCH_BUCKETS:
        mask = (sizes >= low) & (sizes <= high)
        if mask.any():
            label = f"{low}" if low == high else f"{low}-{high}" if high < 1_000_000 else f"{low}+"
            out[label] = {
                "iterations": int(mask.sum()),
                "median_gap_s": round(float(np.median(gaps[mask])), 6),
            }
    return out


def saturation_rate(
    rates: Sequence[float], throughput: Sequence[float], offered: Sequence[float], keeps_pace: float
) -> float:
    """The rate at which X / offered first falls below `keeps_pace`, linearly interpolated between
    the last rate that kept pace and the first that did not; NaN when every rate kept pace (the
    sweep did not reach saturation), the first rate when none did."""
    points = sorted(zip(rates, throughput, offered, strict=True))
    previous: tuple[float, float] | None = None
    for rate, x, load in points:
        ratio = x / load if load > 0 else math.nan
        if not ratio >= keeps_pace:
            if previous is None:
                return rate
            r0, q0 = previous
            # interpolate the pace ratio between the two rates to where it crosses keeps_pace
            return r0 + (rate - r0) * (q0 - keeps_pace) / (q0 - ratio)
        previous = (rate, ratio)
    return math.nan


def _fmt(value: float) -> str:
    return "" if not math.isfinite(value) else f"{value:.6g}"


def compare_runs(
    pairs: Sequence[RunPair],
    *,
    keeps_pace: float = AnalysisSettings.keeps_pace,
    floor_drift: Mapping[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """(CSV rows, summary with saturation and goals, waiting-series rows) of the paired runs;
    with `floor_drift` (the bracket's record, results/sim_vs_real/floor_drift.json), the summary
    judges only the deployments the record judges: floors before and after their loaded runs
    that agree and, with a quiet-floor bar, a quiet floor."""
    groups: dict[tuple[str, str, str], list[RunPair]] = {}
    for pair in pairs:
        groups.setdefault((pair.engine, pair.arm, pair.condition), []).append(pair)
    rows: list[dict[str, Any]] = []
    waiting_rows: list[dict[str, Any]] = []
    for (engine, arm, condition), members in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[1][0].rate)
    ):
        members = sorted(members, key=lambda p: p.rep)
        # A real run that is not `ok` (refused for its machine load, failed, interrupted) is no
        # measurement: it and its prediction leave the comparison, counted in `not_ok`.
        readings = [read_run(p.real_dir, engine, p.duration_s) for p in members]
        kept = [k for k, r in enumerate(readings) if r.status == "ok"]
        not_ok = len(members) - len(kept)
        if not kept:
            continue
        members = [members[k] for k in kept]
        real_runs = [readings[k] for k in kept]
        predicted_runs = [read_run(p.predicted_dir, engine, p.duration_s) for p in members]
        real = [r.values for r in real_runs]
        predicted = [r.values for r in predicted_runs]
        row: dict[str, Any] = {
            "engine": engine,
            "arm": arm,
            "condition": condition,
            "rate": members[0].rate,
            "offered_rps": real[0]["offered_rps"],
            "arrivals_rps": float(np.mean([r["arrivals_rps"] for r in real])),
            "reps": len(members),
            "not_ok": not_ok,
            "sample_requests": int(sum(r["sample_requests"] for r in real)),
            "sample_graphs": int(sum(r["sample_graphs"] for r in real)),
        }
        for metric in METRICS:
            values = np.array([r[metric] for r in real], dtype=float)
            guess = np.array([p[metric] for p in predicted], dtype=float)
            mean = float(np.nanmean(values)) if np.isfinite(values).any() else math.nan
            pred = float(np.nanmean(guess)) if np.isfinite(guess).any() else math.nan
            row[f"{metric}_real"] = mean
            row[f"{metric}_real_min"] = (
                float(np.nanmin(values)) if math.isfinite(mean) else math.nan
            )
            row[f"{metric}_real_max"] = (
                float(np.nanmax(values)) if math.isfinite(mean) else math.nan
            )
            row[f"{metric}_predicted"] = pred
            row[f"{metric}_ratio"] = pred / mean if mean and math.isfinite(mean) else math.nan
        rows.append(row)
        row["_profile"] = {
            "real": [r.profile for r in real_runs],
            "predicted": [r.profile for r in predicted_runs],
        }
        for pair, real_run, predicted_run in zip(members, real_runs, predicted_runs, strict=True):
            real_series = dict(real_run.waiting)
            predicted_series = dict(predicted_run.waiting)
            for t in sorted(set(real_series) | set(predicted_series)):
                waiting_rows.append(
                    {
                        "engine": engine,
                        "arm": arm,
                        "condition": condition,
                        "rep": pair.rep,
                        "t_s": t,
                        "waiting_real": real_series.get(t, math.nan),
                        "waiting_predicted": predicted_series.get(t, math.nan),
                    }
                )
    summary = goal_summary(rows, keeps_pace)
    if floor_drift is not None:
        _judge(summary, floor_drift)
    return rows, summary, waiting_rows


def _judge(summary: dict[str, Any], floor_drift: Mapping[str, Any]) -> None:
    """The bracket's verdict on each series: a deployment whose floors before and after its
    loaded runs disagree by more than the band (or were not both made), or whose engine's floor
    was noisier than the quiet-floor bar, was not measured on a machine that held still. Its
    checks stay in the summary, and `bracket` counts the goal over the judged deployments only,
    naming the refused ones."""
    drifts = floor_drift["deployments"]
    judged: list[dict[str, Any]] = []
    refused: list[str] = []
    for series in summary["series"]:
        name = f"{series['engine']}/{series['arm']}"
        floors = drifts.get(name) or {"pairs": 0}
        series["floors"] = {
            k: floors.get(k) for k in ("pairs", "ttft_ratio", "itl_ratio", "agrees", "quiet")
        }
        series["judged"] = bool(floors.get("judged", False))
        if series["judged"]:
            judged.append(series)
        else:
            refused.append(name)
    summary["bracket"] = {
        "band": floor_drift["band"],
        "max_noise": floor_drift.get("max_noise"),
        "judged": [f"{s['engine']}/{s['arm']}" for s in judged],
        "refused": refused,
        "met": sum(s["met"] + s["saturation_met"] for s in judged),
        "checked": sum(s["checked"] + 1 for s in judged),
    }


def goal_summary(rows: Sequence[Mapping[str, Any]], keeps_pace: float) -> dict[str, Any]:
    """Saturation rates and the goals, per (engine, arm), from the CSV's rows (as `compare_runs`
    makes them, or as `read_sim_vs_real_csv` reads them back)."""
    out: dict[str, Any] = {"keeps_pace": keeps_pace, "goals": GOALS, "series": []}
    by_series: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        by_series.setdefault((row["engine"], row["arm"]), []).append(row)
    for (engine, arm), series in sorted(by_series.items()):
        rates = [r["rate"] for r in series]
        offered = [r["arrivals_rps"] for r in series]
        sat_real = saturation_rate(
            rates, [r["throughput_real"] for r in series], offered, keeps_pace
        )
        sat_pred = saturation_rate(
            rates, [r["throughput_predicted"] for r in series], offered, keeps_pace
        )
        profiles = {r["condition"]: r["_profile"] for r in series if "_profile" in r}
        checks = []
        for r in series:
            under = math.isfinite(sat_real) and r["rate"] <= TTFT_GOAL_LOAD * sat_real
            if not math.isfinite(sat_real):
                under = True  # the sweep never saturated the engine: every rate is below it
            for metric in ("ttft_p50", "ttft_p95", "throughput"):
                if metric != "throughput" and not under:
                    continue
                ratio = r[f"{metric}_ratio"]
                checks.append(
                    {
                        "condition": r["condition"],
                        "metric": metric,
                        "ratio": round(ratio, 4) if math.isfinite(ratio) else None,
                        "met": bool(math.isfinite(ratio) and abs(ratio - 1) <= GOALS[metric]),
                    }
                )
        sat_ratio = sat_pred / sat_real if math.isfinite(sat_real) and sat_real else math.nan
        out["series"].append(
            {
                "engine": engine,
                "arm": arm,
                "saturation_real": round(sat_real, 4) if math.isfinite(sat_real) else None,
                "saturation_predicted": round(sat_pred, 4) if math.isfinite(sat_pred) else None,
                "saturation_ratio": round(sat_ratio, 4) if math.isfinite(sat_ratio) else None,
                "saturation_met": bool(
                    math.isfinite(sat_ratio) and abs(sat_ratio - 1) <= GOALS["saturation"]
                ),
                "checks": checks,
                "iterations": profiles,
                "met": sum(c["met"] for c in checks),
                "checked": len(checks),
            }
        )
    return out


def _csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        row = {k: v for k, v in row.items() if not k.startswith("_")}
        writer.writerow([_fmt(row[c]) if isinstance(row[c], float) else row[c] for c in columns])
    return buffer.getvalue()


# the CSV's text columns, which name a row; every other column is a number
_KEY_COLUMNS = ("engine", "arm", "condition")


def read_sim_vs_real_csv(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a written `sim_vs_real.csv`, numbers as floats (an empty cell as NaN), so a
    measurement kept as data can be summed up again with `goal_summary`."""
    rows: list[dict[str, Any]] = []
    with Path(path).open(encoding="utf-8", newline="") as handle:
        for line, raw in enumerate(csv.DictReader(handle), start=2):
            row: dict[str, Any] = {}
            for key, text in raw.items():
                if key in _KEY_COLUMNS:
                    row[key] = text
                    continue
                try:
                    row[key] = float(text) if text else math.nan  # `_fmt` writes NaN as empty
                except ValueError as error:
                    message = f"{path}:{line}: column {key!r} is not a number: {text!r}"
                    raise ValueError(message) from error
            rows.append(row)
    return rows


def write_sim_vs_real(
    pairs: Sequence[RunPair],
    *,
    out_csv: str | Path,
    out_json: str | Path,
    out_waiting: str | Path,
    out_figure: str | Path | None = None,
    keeps_pace: float = AnalysisSettings.keeps_pace,
    floor_drift: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the files (atomically, deterministic bytes); return the summary."""
    rows, summary, waiting = compare_runs(pairs, keeps_pace=keeps_pace, floor_drift=floor_drift)
    if out_figure is not None:
        draw_sim_vs_real(rows, out_figure)
    columns = [
        *_KEY_COLUMNS,
        "rate",
        "offered_rps",
        "arrivals_rps",
        "reps",
        "not_ok",
        "sample_requests",
        "sample_graphs",
    ] + [
        f"{m}_{part}"
        for m in METRICS
        for part in ("real", "real_min", "real_max", "predicted", "ratio")
    ]
    write_text(out_csv, _csv(rows, columns))
    write_text(
        out_waiting,
        _csv(
            waiting,
            ["engine", "arm", "condition", "rep", "t_s", "waiting_real", "waiting_predicted"],
        ),
    )
    write_json(out_json, summary)
    return summary


# --------------------------------------------------------------------------- the figure

_PANELS = (
    ("ttft_p50", "TTFT p50 (s)"),
    ("ttft_p95", "TTFT p95 (s)"),
    ("throughput", "X (requests/s)"),
)


def draw_sim_vs_real(rows: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """One row of panels per (engine, arm): real (points with the repetition interval) and
    predicted (line) against the offered rate. PNG with fixed metadata (analysis.figures)."""
    import matplotlib.pyplot as plt

    from servelab.analysis.figures import STYLE, save_figure

    series: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        series.setdefault((row["engine"], row["arm"]), []).append(row)
    keys = sorted(series)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(
            max(len(keys), 1), len(_PANELS), figsize=(7.0, 1.9 * max(len(keys), 1)), squeeze=False
        )
        for i, key in enumerate(keys):
            points = sorted(series[key], key=lambda r: r["rate"])
            rates = [r["rate"] for r in points]
            for j, (metric, label) in enumerate(_PANELS):
                ax = axes[i][j]
                real = np.array([r[f"{metric}_real"] for r in points], dtype=float)
                low = np.array([r[f"{metric}_real_min"] for r in points], dtype=float)
                high = np.array([r[f"{metric}_real_max"] for r in points], dtype=float)
                ax.errorbar(
                    rates,
                    real,
                    yerr=[np.nan_to_num(real - low), np.nan_to_num(high - real)],
                    fmt="o",
                    color="#1f77b4",
                    markersize=3.5,
                    capsize=2,
                    label="real (rep. range)",
                )
                ax.plot(
                    rates,
                    [r[f"{metric}_predicted"] for r in points],
                    "-",
                    color="#d62728",
                    linewidth=1.2,
                    label="simulated",
                )
                if metric == "throughput":
                    ax.plot(rates, [r["offered_rps"] for r in points], ":", color="#7f7f7f")
                if metric.startswith("ttft"):
                    ax.set_yscale("log")
                ax.set_title(label if i == 0 else "")
                if j == 0:
                    ax.set_ylabel(f"{key[0]}\n{key[1]}")
                if i == len(keys) - 1:
                    ax.set_xlabel("agent graphs/s")
        if keys:
            axes[0][0].legend(loc="upper left")
        save_figure(fig, Path(path), "png")
        plt.close(fig)
