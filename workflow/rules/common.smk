# Configuration validation, the experiment grid, wildcard constraints and named helper functions.
# Nothing here talks to a cluster: parse-time code runs again for every job.

import re
from pathlib import Path

from snakemake.io import report as for_report

import servelab.grid.config as grid
import servelab.deploy.manifests as manifests
import servelab.campaign.plan as plan
import servelab.capacity.method as capacity
import servelab.grid.identity as identity
from servelab.grid.config import ConfigError

try:
    grid.prepare_config(config)  # what every servelab command does to the config it merged
except ConfigError as error:
    raise WorkflowError(str(error)) from None


CONDITIONS = grid.conditions(config)
RUNS = grid.runs(config)
RUN_IDS = {run.id for run in RUNS}
REPS = grid.reps(config)
# The campaign's engines in registry order (a gap's numerator first).
ENGINES = grid.analysis_settings(config)["engines"]
DEPLOYMENTS = {
    deployment.id: deployment
    for deployment in (
        grid.deployment_for(config, run.arm, run.engine, run.condition) for run in RUNS
    )
}
# Runs are taken one at a time in deployment order, so each deployment comes up once.
DEPLOYMENT_RANK = {deployment: rank for rank, deployment in enumerate(DEPLOYMENTS)}


# ----------------------------------------------------------------------------- GPU nodes
# campaign.gpu_nodes: each deployment is pinned to one node slot (servelab.grid.config.node_slots),
# and every job that drives an engine holds that slot's resource node_slot_K (1 each) and one of
# gpu_slots (N unless --resources or the profile caps it lower): blocks of different nodes run in
# parallel (given --cores N or more), a node's own blocks one at a time, in deployment order.
GPU_NODES = grid.gpu_nodes(config)
NODE_SLOTS = grid.node_slots(config)
for _slot in range(GPU_NODES):
    if f"node_slot_{_slot}" not in workflow.global_resources:
        workflow.register_resource(f"node_slot_{_slot}", 1)
if "gpu_slots" not in workflow.global_resources:
    workflow.register_resource("gpu_slots", GPU_NODES)


def node_slot_of(deployment_id):
    if deployment_id in NODE_SLOTS:
        return NODE_SLOTS[deployment_id]
    return grid.node_slot(config, deployment_id)


def node_resources(job_deployment):
    """The resources of a job that drives an engine: one of gpu_slots, and node_slot_K of its
    deployment's slot K (`job_deployment`: wildcards -> deployment id), 0 of the others."""

    def holds(slot):
        return lambda wildcards: int(node_slot_of(job_deployment(wildcards)) == slot)

    return {"gpu_slots": 1, **{f"node_slot_{k}": holds(k) for k in range(GPU_NODES)}}


def deployment_wildcard(wildcards):
    return wildcards.deployment


def block_deployment(kind):
    return lambda wildcards: block_of(kind, wildcards)[0].id


def alternation(values):
    return "|".join(sorted(re.escape(value) for value in values))


# The capacity searches (servelab.capacity.method), when the config has a `capacity:` section.
SEARCHES = (
    {search.id: search for search in capacity.searches(config)} if config.get("capacity") else {}
)


# The unloaded floor (servelab.grid.config.floor_blocks): per deployment, each request shape it serves,
# one request at a time.
FLOOR_BLOCKS = {block.id: block for block in grid.floor_blocks(config)}
FLOOR_SHAPES = {block.shape.id: block.shape for block in FLOOR_BLOCKS.values()}
FLOOR = grid.floor_settings(config)
FLOOR_REPS = [f"rep{k}" for k in range(1, FLOOR["repetitions"] + 1)]
FLOOR_DIR = "results/floor/{deployment}/runs/{arm}/{engine}/{floor}"
# With config `floor.bracket`, each deployment's floor is made again just after its loaded runs,
# on the same traces, under a root of its own (its sealed measurements apart from the first's).
FLOOR_BRACKET_BAND = grid.floor_bracket_band(config)
FLOOR_AFTER_DIR = "results/floor-after/{deployment}/runs/{arm}/{engine}/{floor}"


wildcard_constraints:
    condition=alternation(CONDITIONS),
    floor=alternation(FLOOR_SHAPES),
    floor_rep=alternation(FLOOR_REPS),
    rep=alternation(REPS),
    arm=alternation(config["arms"]),
    engine=alternation(config["engines"]),
    deployment=alternation(DEPLOYMENTS),
    restart=r"restart\d+",
    search=alternation(SEARCHES) if SEARCHES else r"(?!)",
    step=r"\d+",


# ----------------------------------------------------------------------------- traces


def trace_condition(wildcards):
    condition = CONDITIONS[wildcards.condition]
    values = {
        "condition": condition.id,
        "rate": condition.rate,
        "sharing": condition.sharing,
        "prompt_tokens": condition.prompt_tokens,
        "duration_s": condition.duration_s,
    }
    if condition.trace is not None:  # an imported trace (docs/workload.md, "Imported traces")
        values["trace"] = condition.trace.as_dict()
    return values


def trace_source(wildcards):
    """The file a condition's imported trace is read from (none for a compiled trace)."""
    condition = CONDITIONS[wildcards.condition]
    return [] if condition.trace is None else [condition.trace.path]


def trace_seed(wildcards):
    return grid.trace_seed(config["campaign_seed"], wildcards.condition, wildcards.rep)


# ----------------------------------------------------------------------------- deployments


def deployment_of(wildcards):
    return grid.deployment_for(config, wildcards.arm, wildcards.engine, wildcards.condition)


def deployment_params(deployment):
    return grid.deployment_record(config, deployment)


def deployment_spec(wildcards):
    return deployment_params(DEPLOYMENTS[wildcards.deployment])


def deployment_identity(wildcards):
    return identity.deployment_identity(config, deployment_spec(wildcards))


def manifest_templates(wildcards):
    """The package's template files the deployment is rendered from (render_manifests' inputs):
    editing one re-renders, and so redeploys, exactly the deployments that use it."""
    engine = DEPLOYMENTS[wildcards.deployment].engine
    return [str(path) for path in manifests.template_files(engine)]


# ----------------------------------------------------------------------------- runs


def is_run(arm, engine, condition, rep):
    return f"{arm}/{engine}/{condition}/{rep}" in RUN_IDS


# A block is every repetition of one unit of work, measured by one job (servelab.campaign.blocks):
# the campaign's (arm, engine, condition) under results/runs/, or a deployment's unloaded floor on
# one request shape under results/floor/{deployment}/runs/ (FLOOR_DIR), or with config
# `floor.bracket` the same floor made again after the deployment's loaded runs (FLOOR_AFTER_DIR).
# One family of helpers, parametrised by the kind ("run", "floor" or "floor_after"), serves the
# run, floor_run and floor_after_run rules.
BLOCK_DIRS = {
    "run": "results/runs/{arm}/{engine}/{condition}",
    "floor": FLOOR_DIR,
    "floor_after": FLOOR_AFTER_DIR,
}
# A run's files: written by its block's run job (requests, scrape, run.json) or its telemetry job.
RUN_DIR = f"{BLOCK_DIRS['run']}/{{rep}}"


def run_file(name):
    return f"{RUN_DIR}/{name}"


# Each kind's trace rule, its condition wildcard and its repetition wildcard.
BLOCK_TRACES = {
    "run": ("compile_trace", "condition", "rep"),
    "floor": ("floor_trace", "floor", "floor_rep"),
    "floor_after": ("floor_trace", "floor", "floor_rep"),
}


def block_reps(kind):
    return {"run": REPS, "floor": FLOOR_REPS, "floor_after": FLOOR_REPS}[kind]


def block_outputs(kind, name):
    """The file `name` of every repetition of the block being matched (its wildcards stay)."""
    return [f"{BLOCK_DIRS[kind]}/{rep}/{name}" for rep in block_reps(kind)]


def block_inputs(kind, name):
    """The trace file `name` of each repetition, in repetition order."""
    trace_rule, condition, rep_wildcard = BLOCK_TRACES[kind]

    def inputs(wildcards):
        output = getattr(rules, trace_rule).output[name]
        return [
            output.format(**{condition: getattr(wildcards, condition), rep_wildcard: rep})
            for rep in block_reps(kind)
        ]

    return inputs


def block_of(kind, wildcards):
    """(deployment, run, the config its run identity is read from) of the block being matched; a
    block the configured grid does not have is refused."""
    if kind == "floor_after" and FLOOR_BRACKET_BAND is None:
        raise ValueError(
            f"{BLOCK_DIRS[kind]}: the floor after the loaded runs is made only with config "
            "floor.bracket"
        )
    if kind in ("floor", "floor_after"):
        # No offered load: the floor is a closed loop; its size is in its trace, whose SHA-256 is
        # in the sealed measurement's key.
        run = {
            "arm": wildcards.arm,
            "engine": wildcards.engine,
            "condition": wildcards.floor,
            "offered_load_rps": 0.0,
        }
        return (
            floor_block(wildcards).deployment,
            run,
            grid.floor_run_config(config, wildcards.engine),
        )
    if not is_run(wildcards.arm, wildcards.engine, wildcards.condition, REPS[0]):
        raise ValueError(
            f"{wildcards.arm}/{wildcards.engine}/{wildcards.condition} "
            "is not a block of the configured grid"
        )
    condition = CONDITIONS[wildcards.condition]
    run = {
        "arm": wildcards.arm,
        "engine": wildcards.engine,
        "condition": wildcards.condition,
        "offered_load_rps": grid.offered_load(condition, config["workload"]),
    }
    return deployment_of(wildcards), run, config


def block_identity(kind):
    """What defines the block's measurements (servelab.grid.identity): the deployment, the run
    settings that are identity, and its repetitions. Operational settings are not params."""

    def identity_of(wildcards):
        deployment, run, run_config = block_of(kind, wildcards)
        return {
            "deployment": identity.deployment_identity(config, deployment_params(deployment)),
            "run": identity.run_identity(run_config, run),
            "reps": list(block_reps(kind)),
        }

    return identity_of


def block_resolved_config(kind):
    """The resolved.json of the block's deployment (the gate passed)."""

    def resolved(wildcards):
        return rules.deploy.output.resolved.format(deployment=block_of(kind, wildcards)[0].id)

    return resolved


def block_priority(kind):
    """Earlier deployments first (a floor with its deployment's own runs, so it is measured while
    that deployment is up; with config `floor.bracket`, its floor after them too, ahead of the
    next deployment's floor); traces (priority 1000) before any block."""

    def priority(wildcards):
        return 100 - DEPLOYMENT_RANK[block_of(kind, wildcards)[0].id]

    return priority


def results_root(wildcards, output):
    """The results folder a block's runs/ folder lives in (results/, or a deployment's floor
    folder: its runs live under runs/ as a campaign's do)."""
    return str(Path(output.block).parents[4])


RUN_FILE_NAMES = {
    "requests": "requests.parquet",
    "run_json": "run.json",
    "telemetry": "telemetry.parquet",
}


def run_files(name, runs):
    """The file `name` (requests, run_json or telemetry) of each listed run."""
    pattern = run_file(RUN_FILE_NAMES[name])
    return [
        pattern.format(arm=run.arm, engine=run.engine, condition=run.condition, rep=run.rep)
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


def run_dirs_of_input(wildcards, input):
    """The run folders of a rule's run.json inputs, sorted: run_dirs of the runs it reads, under
    the folder its paths were given (results/, or results/ablations/ID/ in an ablation)."""
    return sorted({str(Path(path).parent) for path in input.run_json})


def run_dirs_in_order(wildcards, input):
    """The run folders of a rule's run.json inputs, in input order."""
    return [str(Path(path).parent) for path in input.run_json]


# ----------------------------------------------------------------------------- analysis


def paired_conditions():
    """Conditions measured by both engines in both arms: the rows of Tables 4-6."""
    return plan.paired_conditions(config)


def table5_runs():
    return plan.target_runs(config, "table5")


def table4_runs():
    return plan.target_runs(config, "table4")


def trace_manifests():
    """The trace manifest of every (condition, rep) the grid runs."""
    pairs = sorted({(run.condition, run.rep) for run in RUNS})
    return [
        rules.compile_trace.output.manifest.format(condition=condition, rep=rep)
        for condition, rep in pairs
    ]


def trace_files():
    """The trace of every (condition, rep) the grid runs, in trace_manifests order."""
    pairs = sorted({(run.condition, run.rep) for run in RUNS})
    return [
        rules.compile_trace.output.trace.format(condition=condition, rep=rep)
        for condition, rep in pairs
    ]


def deployment_resolved_files():
    """The resolved.json of every deployment the grid's runs use (the KV cache's size)."""
    return [rules.deploy.output.resolved.format(deployment=d) for d in sorted(DEPLOYMENTS)]


def queue_models_capacity():
    """The capacity table when the config has a `capacity:` section: the capacity searches'
    probes are the closed queueing model's saturated throughput."""
    return ["results/capacity.csv"] if SEARCHES else []


def capacity_search_dirs():
    return [f"results/capacity/{search}" for search in SEARCHES]


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
    return grid.analysis_settings(config)


def analysis_code():
    """The analysis package's sources: an edit to them re-runs the reductions (never a run)."""
    import servelab.analysis

    return sorted(str(p) for p in Path(servelab.analysis.__file__).parent.glob("*.py"))


def model_max_position_embeddings():
    """The model's max_position_embeddings as the engines' rules read it: the simulator preset's
    (its config.json), else model.max_model_len (a model servelab has no preset for)."""
    if "preset" in config["model"]:
        from servelab.sim.presets import model_preset

        return model_preset(config["model"]["preset"]).max_position_embeddings
    return int(config["model"]["max_model_len"])


def all_tables():
    return [
        rules.table3.output.csv,
        rules.table4.output.csv,
        rules.table5.output.csv,
        rules.table6.output.csv,
    ]


def campaign_outputs(floor=True):
    """What the target `all` builds: Tables 3-6, results/defaults_diff.csv, run_metrics.csv,
    floor.csv (unless `floor` is false: an ablation's), the figures, numbers.json, checksums."""
    outputs = {
        "tables": all_tables(),
        "defaults_diff": rules.defaults_diff.output.csv,
        "run_metrics": rules.run_metrics.output.csv,
        "floor": rules.floor.output.csv,
        "figures": rules.figures.output.figures,
        "numbers": rules.numbers.output.numbers,
        "checksums": rules.checksums.output.checksums,
    }
    if not floor:
        del outputs["floor"]
    return outputs


# ----------------------------------------------------------------------------- capacity


def capacity_search(wildcards):
    search = SEARCHES[wildcards.search]
    return {"arm": search.arm, "engine": search.engine, "shape": search.shape}


def capacity_identity(wildcards):
    """What defines the search's measurements (servelab.capacity.method.search_identity)."""
    return capacity.search_identity(config, SEARCHES[wildcards.search])


def capacity_deployment(wildcards):
    """The node-slot key of a capacity search's deployment (results/deployments/capacity-{search})."""
    return f"capacity-{wildcards.search}"


def capacity_previous_step(wildcards):
    """Step k reads step k-1's state (the first step reads none)."""
    step = int(wildcards.step)
    previous = "results/capacity/{search}/step-{step}.json"
    return [] if step == 0 else [previous.format(search=wildcards.search, step=step - 1)]


def capacity_final_states(wildcards):
    """Each search's last state: walk its checkpoint chain until a step says it is done."""
    if not SEARCHES:
        raise ValueError(
            "the capacity target: the config has no `capacity:` section (docs/capacity.md; "
            "e.g. --configfile config/capacity.yaml)"
        )
    finals = []
    for search_id in SEARCHES:
        step = 0
        while True:
            state = checkpoints.capacity_step.get(search=search_id, step=step).output.state
            if capacity.read_state(state)["done"]:
                break
            step += 1
        finals.append(state)
    return finals


def print_capacity_cost():
    """Print the capacity search's worst-case cost when it is a target on a non-sim backend."""
    from servelab.workflow_io import requested_targets

    if not SEARCHES or config["backend"] == "sim":
        return
    if "results/capacity.csv" not in requested_targets(workflow):
        return
    hours = capacity.worst_case_cost_s(config) / 3600
    print(
        f"servelab: the capacity search's worst case is {hours:.1f} h of load on the "
        f"{config['backend']} backend ({len(SEARCHES)} searches x max_probes x repetitions x "
        "(duration + pause), plus a deployment each)"
    )


# ----------------------------------------------------------------------------- handlers


def stop_local_backend(results="results", backend=None):
    """The local backend's sim servers and Prometheus outlive their jobs; stop them at the end
    (those of the results folder `results`, whose campaign's backend is `backend`, default this
    configuration's)."""
    if (backend or config["backend"]) == "local":
        from servelab.deploy.local import stop_all

        for stopped in stop_all(results):
            print(f"stopped {stopped}")


# ----------------------------------------------------------------------------- unloaded floor


def floor_block(wildcards):
    block_id = f"{wildcards.deployment}/{wildcards.floor}"
    block = FLOOR_BLOCKS.get(block_id)
    if block is None or (block.deployment.arm, block.deployment.engine) != (
        wildcards.arm,
        wildcards.engine,
    ):
        raise ValueError(f"{block_id} is not a floor of the configured grid")
    return block


def floor_shape(wildcards):
    """The floor trace's requests, and its idle gaps (config floor.idle_gaps) and requests sent
    together (floor.shapes[].together) only when it has them: a floor without them keeps the
    params it was made with."""
    shape = FLOOR_SHAPES[wildcards.floor]
    gaps = grid.floor_idle_gaps(config)
    return {
        "sharing": shape.sharing,
        "prompt_tokens": shape.prompt_tokens,
        **({"idle_gaps": gaps} if gaps else {}),
        **({"together": shape.together} if shape.together > 1 else {}),
    }


def floor_seed(wildcards):
    return grid.trace_seed(config["campaign_seed"], wildcards.floor, wildcards.floor_rep)


def floor_run_files(name, kind="floor"):
    """The file `name` of every floor run (of the floor after the loaded runs: kind
    "floor_after"), block by block, repetition by repetition."""
    return [
        f"{BLOCK_DIRS[kind]}/{rep}/{name}".format(
            deployment=block.deployment.id,
            arm=block.deployment.arm,
            engine=block.deployment.engine,
            floor=block.shape.id,
        )
        for block in FLOOR_BLOCKS.values()
        for rep in FLOOR_REPS
    ]


# ----------------------------------------------------------------------------- sim vs real
# The simulator against the real engines (docs/simulator.md, "Against the real engines"): the CPU
# platform is fitted from the floor runs only; each run of the grid is predicted on its own trace.
PREDICTED_DIR = "results/sim_vs_real/predicted/{arm}/{engine}/{condition}/{rep}"


def deployment_blocks(kind):
    """With config `floor.bracket`, what a block of `kind` waits for so that each deployment's
    floors bracket its loaded runs: a loaded run ("run") the deployment's floor before them, the
    floor after them ("floor_after") every block of its loaded runs. Order only: neither job
    reads the other's files. Without a bracket, nothing."""

    def blocks(wildcards):
        if FLOOR_BRACKET_BAND is None:
            return []
        deployment = block_of(kind, wildcards)[0].id
        if kind == "run":
            return [
                rules.floor_run.output.block.format(
                    deployment=deployment,
                    arm=block.deployment.arm,
                    engine=block.deployment.engine,
                    floor=block.shape.id,
                )
                for block in FLOOR_BLOCKS.values()
                if block.deployment.id == deployment
            ]
        return sorted(
            {
                rules.run.output.block.format(
                    arm=run.arm, engine=run.engine, condition=run.condition
                )
                for run in RUNS
                if deployment_of(run).id == deployment
            }
        )

    return blocks


def floor_runs_read(kind):
    """Every floor run of `kind` as the fit and the bracket read it: its folder, its trace's
    folder (of the rule's inputs, in floor_run_files order: both kinds run the same traces) and
    its deployment."""

    def runs(wildcards, input):
        run_json = getattr(input, f"{kind}_run_json")
        return [
            {
                "run_dir": str(Path(path).parent),
                "trace_dir": str(Path(trace).parent),
                "engine": block.deployment.engine,
                "arm": block.deployment.arm,
                "flags": list(block.deployment.flags),
            }
            for (block, rep), path, trace in zip(
                [(block, rep) for block in FLOOR_BLOCKS.values() for rep in FLOOR_REPS],
                run_json,
                input.floor_traces,
                strict=True,
            )
        ]

    return runs


def floor_trace_files(name):
    """The floor trace file `name` of every floor run, in floor_run_files order."""
    return [
        rules.floor_trace.output[name].format(floor=block.shape.id, floor_rep=rep)
        for block in FLOOR_BLOCKS.values()
        for rep in FLOOR_REPS
    ]


def predicted_outputs(name):
    return f"{PREDICTED_DIR}/{name}"


def prediction_settings(wildcards):
    """What the predicted run is made of: the deployment's flags, the trace's run protocol and
    the CPU platform (its step costs are the rule's input)."""
    if not is_run(wildcards.arm, wildcards.engine, wildcards.condition, wildcards.rep):
        raise ValueError(
            f"{wildcards.arm}/{wildcards.engine}/{wildcards.condition}/{wildcards.rep} "
            "is not a run of the configured grid"
        )
    from servelab.sim.cpu_fit import prediction_settings as settings  # scipy: load when used

    return settings(
        config,
        arm=wildcards.arm,
        engine=wildcards.engine,
        condition=wildcards.condition,
    )


def sim_vs_real_pairs(wildcards, input):
    """Every run of the grid, real and predicted (the folders of the rule's inputs, in RUNS
    order), as analysis.sim_vs_real.RunPair fields."""
    return [
        {
            "engine": run.engine,
            "arm": run.arm,
            "condition": run.condition,
            "rep": run.rep,
            "rate": float(CONDITIONS[run.condition].rate),
            "duration_s": float(CONDITIONS[run.condition].duration_s),
            "real_dir": str(Path(real).parent),
            "predicted_dir": str(Path(predicted).parent),
        }
        for run, real, predicted in zip(
            RUNS, input.real_run_json, input.predicted_run_json, strict=True
        )
    ]


def predicted_files(name):
    return [
        predicted_outputs(name).format(
            arm=run.arm, engine=run.engine, condition=run.condition, rep=run.rep
        )
        for run in RUNS
    ]
