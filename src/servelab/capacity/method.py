"""Capacity: the largest arrival rate each engine sustains under each arm and workload shape, found by
bisection over real runs of the campaign (MLPerf Server's "honest serving test", seed 002).

A *search* is one (arm, engine, shape); a *shape* is a condition without its rate (σ, L, duration;
the arrival CV is the workload's). A *probe* measures one rate: its trace is seeded from (shape,
rate, rep) like any condition's (`probe_condition`), so every engine and arm probing that rate
replays the same traces, and each repetition goes through the campaign's own deployment, gate and
success check (`servelab.campaign.deploy.deploy` / `execute_run`). A probe **passes** when every
repetition keeps pace (X >= keeps_pace · Λ, Λ the trace's own requests ÷ its duration) and meets
every percentile limit of the criteria (`analysis.slo.run_metrics_row`).

The search (`next_rate`): probe the bracket's low end, then its high end, then bisect between the
highest passing and the lowest failing rate (geometric midpoint) until (fail - pass) / fail is below
`tolerance` or `max_probes` probes have run. Without a configured bracket a saturation probe comes
first: a short run far above capacity whose completed graphs/s (X ÷ requests per graph, as §5.2 and
inference-perf read it) sets the bracket [0.25 × that, 1.25 × that]. The state after each probe is
one JSON file (results/capacity/{search}/step-{k}.json): the Snakemake checkpoint chain reads it to
decide the next step, and a probe already measured is reused, never redone.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from servelab import artifacts
from servelab.artifacts import read_parquet, read_run_json, write_json, write_text
from servelab.grid.config import Condition, deployment_for, deployment_record
from servelab.grid.identity import deployment_identity, run_identity
from servelab.grid.settings import CapacitySettings, RequestSlo, Shape

if TYPE_CHECKING:
    import pyarrow as pa

    from servelab.analysis.energy import RunCost

__all__ = [
    "Search",
    "capacity_csv",
    "evaluate_probe",
    "next_rate",
    "probe_condition",
    "search_identity",
    "searches",
    "worst_case_cost_s",
]

# The bracket a saturation probe sets, as multiples of its completed graphs/s.
SATURATION_LOW, SATURATION_HIGH = 0.25, 1.25


@dataclass(frozen=True)
class Search:
    arm: str
    engine: str
    shape: str

    @property
    def id(self) -> str:
        return f"{self.arm}-{self.engine}-{self.shape}"


def searches(config: Mapping[str, Any]) -> list[Search]:
    """Every (arm, engine, shape) of the campaign, in config order."""
    settings = CapacitySettings.from_config(config)
    return [
        Search(arm, engine, shape.name)
        for arm in config["arms"]
        for engine in config["arms"][arm]["engines"]
        for shape in settings.shapes
    ]


def probe_condition(
    shape: Shape, rate: float, *, duration_s: float | None = None, saturation: bool = False
) -> Condition:
    """The condition a probe of `shape` at `rate` (agent graphs/s) runs; its id names the shape and
    the rate to five significant digits (`cap-<shape>-r0.27344`), so it seeds the trace."""
    return Condition(
        id=probe_id(shape, rate, saturation=saturation),
        sweep="rate",
        rate=float(f"{rate:.5g}"),
        sharing=shape.sharing,
        prompt_tokens=shape.prompt_tokens,
        duration_s=shape.duration_s if duration_s is None else duration_s,
    )


def probe_id(shape: Shape, rate: float, *, saturation: bool = False) -> str:
    kind = "sat" if saturation else "r"
    return f"cap-{shape.name}-{kind}{float(f'{rate:.5g}'):g}"


# ------------------------------------------------------------------------------ the search


def next_rate(state: Mapping[str, Any], settings: CapacitySettings) -> tuple[str, float | None]:
    """What the search does next from its state: ("saturation", rate), ("probe", rate) or
    ("done", None). `state` holds `bracket` (or None before the saturation probe) and `probes`
    (each `rate` and `passed`)."""
    probes = [p for p in state["probes"] if not p.get("saturation")]
    bracket = state.get("bracket")
    if bracket is None:
        return "saturation", settings.saturation_rate
    lo, hi = float(bracket[0]), float(bracket[1])
    rates = {float(p["rate"]): bool(p["passed"]) for p in probes}
    if lo not in rates:
        return "probe", lo
    if not rates[lo]:
        return "done", None  # below the bracket
    if hi not in rates:
        return "probe", hi
    if rates[hi]:
        return "done", None  # above the bracket
    passed = max(r for r, ok in rates.items() if ok)
    failed = min(r for r, ok in rates.items() if not ok and r > passed)
    if (failed - passed) / failed < settings.tolerance or len(probes) >= settings.max_probes:
        return "done", None
    return "probe", float(f"{math.sqrt(passed * failed):.5g}")


def bracket_of(state: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(highest passing rate, lowest failing rate above it); None where the probes say nothing."""
    rates = [
        (float(p["rate"]), bool(p["passed"])) for p in state["probes"] if not p.get("saturation")
    ]
    passing = [r for r, ok in rates if ok]
    best = max(passing) if passing else None
    failing = [r for r, ok in rates if not ok and (best is None or r > best)]
    return best, (min(failing) if failing else None)


def probe_telemetry(
    run_dir: str | Path, record: Mapping[str, Any], step_s: float | None
) -> pa.Table | None:
    """A probe repetition's canonical telemetry: its telemetry.parquet, else its scrape.parquet
    mapped as the telemetry rule maps a campaign run's (`step_s`: the sampling step), else None.
    Only the energy per token is read from it: a window it does not cover leaves that figure
    null and the probe's verdict as it is."""
    from servelab.analysis.energy import read_telemetry
    from servelab.artifacts import SCRAPE_SCHEMA
    from servelab.telemetry.canonical import TelemetryWindowError, canonicalize

    telemetry = read_telemetry(run_dir)
    scrape_path = Path(run_dir) / "scrape.parquet"
    if telemetry is not None or step_s is None or not scrape_path.is_file():
        return telemetry
    try:
        return canonicalize(
            read_parquet(scrape_path, SCRAPE_SCHEMA),
            engine=str(record["engine"]),
            run_id=str(record["run_id"]),
            duration_s=float(record["end_unix_s"]) - float(record["start_unix_s"]),
            step_s=step_s,
            what=str(scrape_path),
        )
    except TelemetryWindowError:
        return None


def evaluate_probe(
    run_dirs: Sequence[str | Path],
    settings: CapacitySettings,
    *,
    duration_s: float,
    exclude_first_graph: bool = True,
    step_s: float | None = None,
) -> dict[str, Any]:
    """Pass/fail of one probe from its repetitions' artifacts (module docstring), with each
    repetition's window, ok output tokens and GPU energy (`analysis.energy`; null without the
    GPU's series), from which results/capacity.csv reports energy and cost per token.

    Keeping pace is judged against the trace's own offered load, its requests ÷ `duration_s`, not
    the nominal 6λ: a 600 s trace at 0.05 graphs/s holds about 30 graphs, and its realised count
    varies by tens of percent from seed to seed (docs/capacity.md)."""
    # the analysis (and scipy) only where a probe is judged, not when the Snakefile is parsed
    from servelab.analysis.energy import run_cost
    from servelab.analysis.reduce import reduce_requests
    from servelab.analysis.slo import run_metrics_row

    reps = []
    for run_dir in run_dirs:
        record = read_run_json(Path(run_dir) / "run.json")
        row: dict[str, Any] = {
            "rep": record["rep"],
            "status": record["status"],
            "nominal_offered_rps": float(record["offered_load_rps"]),
        }
        if record["status"] == "ok":
            table = read_parquet(Path(run_dir) / "requests.parquet", artifacts.REQUESTS_SCHEMA)
            req = reduce_requests(table, str(run_dir))
            metrics = run_metrics_row(
                req, RequestSlo(None, None, None), exclude_first_graph=exclude_first_graph
            )
            offered = float((~req.warmup).sum()) / float(duration_s)
            row["offered_rps"] = offered
            row.update({k: metrics[k] for k in ("throughput_rps", *settings.limits)})
            row["keeps_pace"] = bool(metrics["throughput_rps"] >= settings.keeps_pace * offered)
            row["within_limits"] = all(
                math.isfinite(float(metrics[k])) and float(metrics[k]) <= limit
                for k, limit in settings.limits.items()
            )
            row["passed"] = row["keeps_pace"] and row["within_limits"]
            cost = run_cost(record, req, probe_telemetry(run_dir, record, step_s))
            row["window_s"] = cost.window_s
            row["output_tokens"] = int(cost.output_tokens)
            energy = cost.gpu_energy_j
            row["gpu_energy_j"] = energy if math.isfinite(energy) else None
        else:
            row["passed"] = False
        reps.append(row)
    return {"passed": all(r["passed"] for r in reps) and bool(reps), "reps": reps}


def saturation_bracket(run_dirs: Sequence[str | Path], requests_per_graph: float) -> list[float]:
    """[0.25, 1.25] × the completed graphs/s of a saturation probe (its repetitions' median)."""
    from servelab.analysis.reduce import reduce_requests, run_metrics

    rates = []
    for run_dir in run_dirs:
        table = read_parquet(Path(run_dir) / "requests.parquet", artifacts.REQUESTS_SCHEMA)
        x = run_metrics(reduce_requests(table, str(run_dir))).throughput
        rates.append(float(x) / requests_per_graph)
    rates.sort()
    completed = rates[len(rates) // 2]
    return [float(f"{SATURATION_LOW * completed:.5g}"), float(f"{SATURATION_HIGH * completed:.5g}")]


def worst_case_cost_s(config: Mapping[str, Any]) -> float:
    """Seconds of load a capacity target can take at most: every search's probes × repetitions ×
    (duration + pause), plus a saturation probe each and one deployment per search (its health
    timeout, the longest a start-up may take)."""
    s = CapacitySettings.from_config(config)
    pause = float(config["campaign"]["pause_between_runs_s"])
    startup = float(config["dispatch"].get("health_timeout_s", 900))
    total = 0.0
    for search in searches(config):
        shape = s.shape(search.shape)
        total += s.max_probes * s.repetitions * (shape.duration_s + pause)
        if s.bracket is None:
            total += s.repetitions * (s.saturation_duration_s + pause)
        total += startup
    return total


# ------------------------------------------------------------------------------ the output

CSV_COLUMNS = (
    "engine",
    "arm",
    "shape",
    "sharing",
    "prompt_tokens",
    "duration_s",
    "criteria",
    "capacity_low",
    "capacity_high",
    "bracket_width_pct",
    "probes",
    "load_hours",
    "stopped",
    "j_per_output_token_low",
    "usd_per_million_output_tokens_low",
    "j_per_output_token_high",
    "usd_per_million_output_tokens_high",
)


def bracket_cost(state: Mapping[str, Any], rate: float | None) -> RunCost | None:
    """The pooled window, ok output tokens and GPU energy of the probe at `rate` (a bracket end):
    its repetitions that ran ok as one (`analysis.energy.RunCost.pooled`, ratios of sums), the
    energy null unless every one of them has it. None: no such probe, or no repetition with the
    figures (a state written before they were recorded)."""
    from servelab.analysis.energy import RunCost

    if rate is None:
        return None
    probes = [p for p in state["probes"] if not p.get("saturation") and float(p["rate"]) == rate]
    reps = [r for p in probes for r in p.get("reps", []) if "output_tokens" in r]
    if not reps:
        return None
    return RunCost.pooled(
        RunCost(
            window_s=float(r["window_s"]),
            output_tokens=float(r["output_tokens"]),
            gpu_energy_j=float("nan") if r["gpu_energy_j"] is None else float(r["gpu_energy_j"]),
        )
        for r in reps
    )


def _cost_cells(
    state: Mapping[str, Any], rate: float | None, usd_per_hour: float | None, end: str
) -> dict[str, str]:
    cost = bracket_cost(state, rate)
    if cost is None:
        return {f"j_per_output_token_{end}": "", f"usd_per_million_output_tokens_{end}": ""}

    def cell(value: float) -> str:
        return f"{value:.6g}" if math.isfinite(value) else ""

    return {
        f"j_per_output_token_{end}": cell(cost.j_per_output_token),
        f"usd_per_million_output_tokens_{end}": cell(
            cost.usd_per_million_output_tokens(usd_per_hour)
        ),
    }


def capacity_csv(
    states: Sequence[Mapping[str, Any]],
    settings: CapacitySettings,
    *,
    usd_per_node_hour: float | None = None,
) -> str:
    """results/capacity.csv: one row per search (engine, arm, shape, criteria, the bracket
    [highest pass, lowest fail] in agent graphs/s, probes used, load-hours spent), and at each
    end of the bracket the energy and cost per output token of its probe (`bracket_cost`; empty
    without the GPU's energy series, or without `usd_per_node_hour`)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    criteria = ";".join(
        [
            f"X>={settings.keeps_pace:g}*offered",
            *(f"{k}<={v:g}" for k, v in settings.limits.items()),
        ]
    )
    for state in states:
        shape = settings.shape(state["shape"])
        low, high = bracket_of(state)
        width = "" if low is None or high is None else f"{100 * (high - low) / high:.2f}"
        seconds = sum(float(p["load_s"]) for p in state["probes"])
        writer.writerow(
            {
                "engine": state["engine"],
                "arm": state["arm"],
                "shape": shape.name,
                "sharing": shape.sharing,
                "prompt_tokens": shape.prompt_tokens,
                "duration_s": f"{shape.duration_s:g}",
                "criteria": criteria,
                "capacity_low": "" if low is None else f"{low:g}",
                "capacity_high": "" if high is None else f"{high:g}",
                "bracket_width_pct": width,
                "probes": sum(1 for p in state["probes"] if not p.get("saturation")),
                "load_hours": f"{seconds / 3600:.3f}",
                "stopped": state["stopped"],
                **_cost_cells(state, low, usd_per_node_hour, "low"),
                **_cost_cells(state, high, usd_per_node_hour, "high"),
            }
        )
    return out.getvalue()


def write_state(path: str | Path, state: Mapping[str, Any]) -> None:
    write_json(path, dict(state))


def read_state(path: str | Path) -> dict[str, Any]:
    return cast("dict[str, Any]", json.loads(Path(path).read_text(encoding="utf-8")))


def write_capacity(
    states: Sequence[Mapping[str, Any]],
    out_csv: str | Path,
    settings: CapacitySettings,
    *,
    usd_per_node_hour: float | None = None,
) -> None:
    write_text(out_csv, capacity_csv(states, settings, usd_per_node_hour=usd_per_node_hour))


def search_identity(config: Mapping[str, Any], search: Search) -> dict[str, Any]:
    """What defines a search's measurements (the steps' params): its deployment, the capacity
    settings, the seeds, the workload and the identity part of the run settings. Operational
    settings (timeouts, poll intervals, the cluster's whereabouts) are read when a step runs, so
    changing one re-measures nothing."""
    return {
        "search": {"arm": search.arm, "engine": search.engine, "shape": search.shape},
        "deployment": deployment_identity(config, deployment_params(config, search)),
        "run": run_identity(config, {"arm": search.arm, "engine": search.engine}),
        "capacity": dict(config["capacity"]),
        "campaign_seed": int(config["campaign_seed"]),
        "repetitions": int(config["repetitions"]),
        "keeps_pace": float(config["analysis"]["keeps_pace"]),
        "workload": dict(config["workload"]),
        "tokenizer": str(config["tokenizer"]),
    }


def deployment_params(config: Mapping[str, Any], search: Search) -> dict[str, Any]:
    """The search's deployment, as the campaign's deploy rule gets it: the arm's flags without any
    condition's own (a probe is no condition of the grid)."""
    return deployment_record(
        config, deployment_for(config, search.arm, search.engine, condition="")
    )
