# Configuration validation, the experiment grid, wildcard constraints and named helper functions.
# Nothing here talks to a cluster: parse-time code runs again for every job.

import re
from pathlib import Path

from snakemake.io import report as for_report

import servelab.config as grid
from servelab.config import ConfigError

try:
    grid.validate_config(config)
except ConfigError as error:
    raise WorkflowError(str(error)) from None


CONDITIONS = grid.conditions(config)
RUNS = grid.runs(config)
RUN_IDS = {run.id for run in RUNS}
REPS = grid.reps(config)
DEPLOYMENTS = {
    deployment.id: deployment
    for deployment in (
        grid.deployment_for(config, run.arm, run.engine, run.condition) for run in RUNS
    )
}
# Runs are taken one at a time in deployment order, so each deployment comes up once.
DEPLOYMENT_RANK = {deployment: rank for rank, deployment in enumerate(DEPLOYMENTS)}


def alternation(values):
    return "|".join(sorted(re.escape(value) for value in values))


wildcard_constraints:
    condition=alternation(CONDITIONS),
    rep=alternation(REPS),
    arm=alternation(config["arms"]),
    engine=alternation(config["engines"]),
    deployment=alternation(DEPLOYMENTS),
    restart=r"restart\d+",


# ----------------------------------------------------------------------------- traces


def trace_condition(wildcards):
    condition = CONDITIONS[wildcards.condition]
    return {
        "condition": condition.id,
        "rate": condition.rate,
        "sharing": condition.sharing,
        "prompt_tokens": condition.prompt_tokens,
        "duration_s": condition.duration_s,
    }


def trace_seed(wildcards):
    return grid.trace_seed(config["campaign_seed"], wildcards.condition, wildcards.rep)


# ----------------------------------------------------------------------------- deployments


def deployment_of(wildcards):
    return grid.deployment_for(config, wildcards.arm, wildcards.engine, wildcards.condition)


def deployment_params(deployment):
    return {
        "deployment_id": deployment.id,
        "arm": deployment.arm,
        "engine": deployment.engine,
        "flags": list(deployment.flags),
        "image": config["engines"][deployment.engine]["image"],
        "port": config["engines"][deployment.engine]["port"],
        "expect_chunked_prefill": deployment.expect_chunked_prefill,
        "expect_chunk_size": deployment.expect_chunk_size,
    }


def deployment_spec(wildcards):
    return deployment_params(DEPLOYMENTS[wildcards.deployment])


def run_deployment_spec(wildcards):
    return deployment_params(deployment_of(wildcards))


def run_resolved_config(wildcards):
    run_id = f"{wildcards.arm}/{wildcards.engine}/{wildcards.condition}/{wildcards.rep}"
    if run_id not in RUN_IDS:
        raise ValueError(f"{run_id} is not a run of the configured grid")
    return rules.deploy.output.resolved.format(deployment=deployment_of(wildcards).id)


def run_priority(wildcards):
    """Earlier deployments first; traces (priority 1000) before any run."""
    return 100 - DEPLOYMENT_RANK[deployment_of(wildcards).id]


# ----------------------------------------------------------------------------- runs


def is_run(arm, engine, condition, rep):
    return f"{arm}/{engine}/{condition}/{rep}" in RUN_IDS


def run_settings(wildcards):
    condition = CONDITIONS[wildcards.condition]
    return {
        "backend": config["backend"],
        "arm": wildcards.arm,
        "engine": wildcards.engine,
        "condition": wildcards.condition,
        "rep": wildcards.rep,
        "offered_load_rps": grid.offered_load(condition, config["workload"]["workers_per_graph"]),
        "gpu": config["gpu"],
        "model": config["model"],
        "dispatch": config["dispatch"],
        "campaign": config["campaign"],
        "telemetry": config["telemetry"],
        "faults": [
            fault
            for fault in config["campaign"].get("faults", [])
            if fault["run"]
            == f"{wildcards.arm}/{wildcards.engine}/{wildcards.condition}/{wildcards.rep}"
        ],
        "kubernetes": config.get("kubernetes", {}),
    }


def results_root(wildcards, output):
    """The results folder a run's outputs live under (results/runs/{arm}/{engine}/{condition}/{rep})."""
    return str(Path(output.run_json).parents[5])


def run_files(name, runs):
    """The file `name` of each listed run: wired through the rules that write it."""
    source = {
        "requests": rules.run.output.requests,
        "run_json": rules.run.output.run_json,
        "telemetry": rules.telemetry.output.telemetry,
    }[name]
    return [
        source.format(arm=run.arm, engine=run.engine, condition=run.condition, rep=run.rep)
        for run in runs
    ]


def runs_where(conditions=None, arms=None, engines=None):
    return [
        run
        for run in RUNS
        if (conditions is None or run.condition in conditions)
        and (arms is None or run.arm in arms)
        and (engines is None or run.engine in engines)
    ]


def run_dirs(runs):
    return sorted({str(Path(path).parent) for path in run_files("run_json", runs)})


# ----------------------------------------------------------------------------- analysis


def paired_conditions():
    """Conditions measured by both engines in both arms: the rows of Tables 4-6."""
    arms = list(config["arms"])
    return [
        condition
        for condition in CONDITIONS
        if all(
            is_run(arm, engine, condition, REPS[0]) for arm in arms for engine in config["engines"]
        )
    ]


def table5_runs():
    return runs_where(conditions=paired_conditions())


def table4_runs():
    return runs_where(conditions=paired_conditions(), engines=["sglang"])


def trace_manifests():
    """The trace manifest of every (condition, rep) the grid runs."""
    pairs = sorted({(run.condition, run.rep) for run in RUNS})
    return [
        rules.compile_trace.output.manifest.format(condition=condition, rep=rep)
        for condition, rep in pairs
    ]


RESTART_REPS = [
    f"restart{k}" for k in range(1, config.get("restart", {}).get("repetitions", 0) + 1)
]


def restart_records():
    """Restart-experiment records (Fig. 14): only the kubernetes backend restarts real pods."""
    if config["backend"] != "kubernetes" or not RESTART_REPS:
        return []
    return expand(
        "results/restarts/{engine}/{restart}/restart.json",
        engine=list(config["engines"]),
        restart=RESTART_REPS,
    )


def restart_deployment(wildcards):
    """The engine's deployment in the restart arm (its first condition's flags)."""
    arm = config.get("restart", {}).get("arm", "defaults")
    condition = grid.arm_conditions(config, arm, wildcards.engine)[0]
    return grid.deployment_for(config, arm, wildcards.engine, condition)


def restart_deployment_spec(wildcards):
    return deployment_params(restart_deployment(wildcards))


def restart_manifest(wildcards):
    return rules.render_manifests.output.manifest.format(
        deployment=restart_deployment(wildcards).id
    )


def restart_resolved(wildcards):
    return rules.deploy.output.resolved.format(deployment=restart_deployment(wildcards).id)


FIGURE_DIR = "results/figures"
FIGURES = ["figure1", *(f"figure{n}" for n in range(6, 15))]


def figure_outputs():
    return [
        for_report(
            f"{FIGURE_DIR}/{name}.{ext}",
            caption=f"../report/{name}.rst",
            category="Figures",
            labels={"figure": name, "format": ext},
        )
        for name in FIGURES
        for ext in ("png", "pdf")
    ]


def figure_dir(wildcards, output):
    return str(Path(output.figures[0]).parent)


def results_dir_of_checksums(wildcards, output):
    return str(Path(output.checksums).parent)


def analysis_settings():
    return {
        "keeps_pace": config["analysis"]["keeps_pace"],
        "phi_guard": config["analysis"]["phi_guard"],
        "exclude_first_graph": config["analysis"]["exclude_first_graph"],
    }


def analysis_code():
    """The analysis package's sources: an edit to them re-runs the reductions (never a run)."""
    import servelab.analysis

    return sorted(str(p) for p in Path(servelab.analysis.__file__).parent.glob("*.py"))


def all_tables():
    return [
        rules.table3.output.csv,
        rules.table4.output.csv,
        rules.table5.output.csv,
        rules.table6.output.csv,
    ]


# ----------------------------------------------------------------------------- handlers


def stop_local_backend():
    """The local backend's sim servers and Prometheus outlive their jobs; stop them at the end."""
    if config["backend"] == "local":
        from servelab.deploy.local import stop_all

        for stopped in stop_all("results"):
            print(f"stopped {stopped}")
