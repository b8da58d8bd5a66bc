"""A campaign's plan, before it runs: the runs a target would measure (`target_runs`), grouped by
deployment, with their load, warm-up, pauses and deployment start-ups summed into GPU-hours
(`servelab campaign plan`). A pure function of the configuration. See docs/campaigns.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.campaign.status import run_status
from servelab.grid.config import (
    Run,
    analysis_settings,
    conditions,
    deployment_for,
    floor_blocks,
    floor_settings,
    reps,
    runs,
)
from servelab.grid.settings import CampaignSettings, DispatchSettings, KubernetesSettings

__all__ = [
    "TARGETS",
    "CampaignPlan",
    "DeploymentPlan",
    "format_plan",
    "paired_conditions",
    "plan_campaign",
    "target_runs",
]


# ----------------------------------------------------------------------------- targets


def paired_conditions(config: Mapping[str, Any]) -> list[str]:
    """Conditions that every engine runs in every arm: the rows of Tables 4-6."""
    run_ids = {run.id for run in runs(config)}
    first_rep = reps(config)[0]
    return [
        condition
        for condition in conditions(config)
        if all(
            f"{arm}/{engine}/{condition}/{first_rep}" in run_ids
            for arm in config["arms"]
            for engine in config["engines"]
        )
    ]


# What each target needs measured, as the rules of workflow/rules/analysis.smk read it.
TARGETS: dict[str, str] = {
    "table3": "every run of the grid",
    "table4": "SGLang's runs of the paired conditions",
    "table5": "every run of the paired conditions",
    "table6": "every run of the paired conditions",
    "figures": "every run of the grid",
    "numbers": "every run of the grid",
    "all": "every run of the grid",
}


def target_runs(config: Mapping[str, Any], target: str) -> list[Run]:
    """The runs of the grid that `target` reads, in campaign (deployment) order."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: one of {', '.join(TARGETS)}")
    grid = runs(config)
    if target in ("table4", "table5", "table6"):
        paired = set(paired_conditions(config))
        grid = [run for run in grid if run.condition in paired]
    if target == "table4":  # Table 4: the control engine's two deployments (the study's SGLang)
        engines = analysis_settings(config)["engines"]
        grid = [run for run in grid if len(engines) == 2 and run.engine == engines[1]]
    return grid


# ----------------------------------------------------------------------------- plan

# Deployment start-up, seconds, per backend. kubernetes: model load plus CUDA-graph capture of an
# 8B model on an L4 takes 3-5 minutes (docs/kubernetes.md's Fig. 14 restart: 157 s from delete to
# Ready with the image already on the node); the upper end, since a first start also pulls the
# image. `kubernetes.timeouts.ready_s` is the worst case the plan also prints. local: a sim server
# process (Python start-up and imports, then /health). sim: nothing starts (virtual time).
KUBERNETES_STARTUP_S = 300.0
LOCAL_STARTUP_S = 10.0
STARTUP_ESTIMATE_S = {"sim": 0.0, "local": LOCAL_STARTUP_S, "kubernetes": KUBERNETES_STARTUP_S}
# The warm-up requests of a run are sent at once (128-token prompts, 16 output tokens) and finish
# as one batch; seconds on a GPU. Generous: a run's warm-up is small next to its load.
WARMUP_ESTIMATE_S = 10.0


@dataclass(frozen=True)
class DeploymentPlan:
    """The runs of one deployment a target would measure, and the GPU time they take."""

    deployment_id: str
    runs: tuple[str, ...]
    load_s: float  # the conditions' arrival windows (duration_s), summed
    warmup_s: float
    pauses_s: float
    startup_s: float

    @property
    def total_s(self) -> float:
        return self.load_s + self.warmup_s + self.pauses_s + self.startup_s


@dataclass(frozen=True)
class CampaignPlan:
    target: str
    backend: str
    runs_in_target: int
    deployments: tuple[DeploymentPlan, ...]
    startup_each_s: float
    worst_startup_each_s: float | None  # kubernetes: timeouts.ready_s
    floor_runs: int = 0  # `all` also measures the unloaded floors (not in the hours)

    def total(self, part: str) -> float:
        return float(sum(getattr(d, part) for d in self.deployments))

    @property
    def runs_to_measure(self) -> int:
        return sum(len(d.runs) for d in self.deployments)

    @property
    def gpu_hours(self) -> float:
        return self.total("total_s") / 3600.0

    @property
    def worst_case_gpu_hours(self) -> float | None:
        if self.worst_startup_each_s is None:
            return None
        extra = len(self.deployments) * (self.worst_startup_each_s - self.startup_each_s)
        return (self.total("total_s") + extra) / 3600.0


def plan_campaign(
    config: Mapping[str, Any], target: str, results: str | Path = "results"
) -> CampaignPlan:
    """What `target` would measure from the state of `results`: each run whose run.json is
    missing or not final, grouped by deployment, one start-up per deployment with such a run."""
    backend = str(config["backend"])
    condition_of = conditions(config)
    warmups = DispatchSettings.from_section(config["dispatch"]).warmup_requests
    pause = CampaignSettings.from_section(config["campaign"]).pause_between_runs_s
    startup = STARTUP_ESTIMATE_S[backend]
    worst = (
        KubernetesSettings.from_section(config.get("kubernetes")).timeouts.ready_s
        if backend == "kubernetes"
        else None
    )
    selected = target_runs(config, target)
    grouped: dict[str, list[Run]] = {}
    for run in selected:
        if run_status(results, run).needs_measuring:
            deployment = deployment_for(config, run.arm, run.engine, run.condition).id
            grouped.setdefault(deployment, []).append(run)
    plans = tuple(
        DeploymentPlan(
            deployment_id=deployment,
            runs=tuple(run.id for run in group),
            load_s=sum(condition_of[run.condition].duration_s for run in group),
            warmup_s=len(group) * (WARMUP_ESTIMATE_S if warmups > 0 else 0.0),
            pauses_s=len(group) * pause,
            startup_s=startup,
        )
        for deployment, group in grouped.items()
    )
    return CampaignPlan(
        target=target,
        backend=backend,
        runs_in_target=len(selected),
        deployments=plans,
        startup_each_s=startup,
        worst_startup_each_s=worst,
        floor_runs=(
            len(floor_blocks(config)) * floor_settings(config)["repetitions"]
            if target == "all"
            else 0
        ),
    )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600.0:.2f}"


def format_plan(plan: CampaignPlan) -> str:
    """The plan as a table (hours per deployment) and a total."""
    header = ("deployment", "runs", "load_h", "warmup_h", "pauses_h", "startup_h", "gpu_h")
    rows = [
        (
            d.deployment_id,
            str(len(d.runs)),
            _hours(d.load_s),
            _hours(d.warmup_s),
            _hours(d.pauses_s),
            _hours(d.startup_s),
            _hours(d.total_s),
        )
        for d in plan.deployments
    ]
    parts = ("load_s", "warmup_s", "pauses_s", "startup_s", "total_s")
    total = ("total", str(plan.runs_to_measure), *(_hours(plan.total(p)) for p in parts))
    table = [header, *rows, total]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [
        f"target {plan.target} ({TARGETS[plan.target]}), backend {plan.backend}: "
        f"{plan.runs_to_measure} of its {plan.runs_in_target} runs to measure, "
        f"{len(plan.deployments)} deployment(s)",
        *(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
            for row in table
        ),
        f"GPU-hours: {plan.gpu_hours:.2f} (load {_hours(plan.total('load_s'))} h: the conditions' "
        f"duration_s; warm-ups {WARMUP_ESTIMATE_S:.0f} s per run; pauses "
        f"campaign.pause_between_runs_s per run; start-ups {plan.startup_each_s:.0f} s per "
        "deployment, an estimate)",
    ]
    if plan.worst_case_gpu_hours is not None:
        lines.append(
            f"worst case, every start-up taking kubernetes.timeouts.ready_s "
            f"({plan.worst_startup_each_s:.0f} s): {plan.worst_case_gpu_hours:.2f} GPU-hours"
        )
    if plan.floor_runs:
        lines.append(
            f"not in these hours: {plan.floor_runs} unloaded-floor run(s) of results/floor.csv "
            "(closed loop, floor.requests requests one at a time: a floor's length is not known "
            "before it runs; docs/capacity.md gives the study grid's on the sim)"
        )
    if plan.backend == "sim":
        lines.append("backend sim: the simulator runs these in virtual time, on no GPU")
    return "\n".join(line.rstrip() for line in lines) + "\n"
