# The capacity search (docs/capacity.md): per (arm, engine, shape) a chain of checkpoint steps, each
# measuring one probe through the campaign's own deployment, gate and runs, until the bisection's
# bracket is narrow enough. `snakemake --cores 1 results/capacity.csv`; resumable: a step already
# written is reused, never redone.


rule capacity_deploy:
    output:
        manifest="results/deployments/capacity-{search}/manifest.yaml",
        startup_log="results/deployments/capacity-{search}/startup.log",
        resolved="results/deployments/capacity-{search}/resolved.json",
    log:
        "results/logs/capacity/{search}/deploy.log",
    conda:
        "../../environment.yml"
    resources:
        **node_resources(capacity_deployment),
    params:
        search=capacity_search,
        # What defines the deployment; operational settings are read when the job runs.
        identity=capacity_identity,
    message:
        "deploy the engine of capacity search {wildcards.search}"
    script:
        "../scripts/capacity_deploy.py"


checkpoint capacity_step:
    input:
        resolved=rules.capacity_deploy.output.resolved,
        previous=capacity_previous_step,
    output:
        state="results/capacity/{search}/step-{step}.json",
        probe=directory("results/capacity/{search}/probe-{step}"),
    log:
        "results/logs/capacity/{search}/step-{step}.log",
    conda:
        "../../environment.yml"
    resources:
        **node_resources(capacity_deployment),
    params:
        search=capacity_search,
        # What defines the probes (servelab.capacity.method.search_identity); operational settings are
        # read from the workflow's config when the step runs: changing one re-measures nothing.
        identity=capacity_identity,
    message:
        "capacity search {wildcards.search}, step {wildcards.step}"
    script:
        "../scripts/capacity_step.py"


rule capacity:
    input:
        states=capacity_final_states,
    output:
        csv="results/capacity.csv",
        figure="results/figures/capacity.png",
    log:
        "results/logs/capacity/capacity.log",
    conda:
        "../../environment.yml"
    params:
        capacity=config.get("capacity"),
        keeps_pace=config["analysis"]["keeps_pace"],
        # USD per hour of the campaign's GPU node (config analysis.cost; null: no dollar figures)
        usd_per_node_hour=grid.node_usd_per_hour(config),
    message:
        "capacity brackets of every search -> {output.csv}"
    script:
        "../scripts/capacity.py"
