# The unloaded floor (docs/capacity.md, "The unloaded floor"): each deployment measured one request
# at a time on every request shape (σ, L) it serves, the denominator of slowdown-relative SLOs.
# A floor is a block of the campaign's own kind (deployment, gate, retries, sealed measurement);
# its trace is a closed-loop chain (servelab.workload.floor), so every backend runs it unchanged.


rule floor_trace:
    output:
        trace="results/floor/traces/{floor}/{floor_rep}/trace.parquet",
        manifest="results/floor/traces/{floor}/{floor_rep}/manifest.json",
    log:
        "results/logs/floor/traces/{floor}/{floor_rep}.log",
    priority: 1000
    conda:
        "../../environment.yml"
    params:
        shape=floor_shape,
        seed=floor_seed,
        requests=FLOOR["requests"],
        workload=config["workload"],
        tokenizer=config["tokenizer"],
    message:
        "compile and validate the floor trace of {wildcards.floor}/{wildcards.floor_rep}"
    script:
        "../scripts/floor_trace.py"


rule floor_run:
    input:
        traces=block_inputs("floor", "trace"),
        manifests=block_inputs("floor", "manifest"),
        resolved=block_resolved_config("floor"),
    output:
        requests=block_outputs("floor", "requests.parquet"),
        scrape=block_outputs("floor", "scrape.parquet"),
        run_json=block_outputs("floor", "run.json"),
        block="results/floor/{deployment}/runs/{arm}/{engine}/{floor}/block.json",
    log:
        "results/logs/floor/{deployment}/{arm}/{engine}/{floor}.log",
    priority: block_priority("floor")
    conda:
        "../../environment.yml"
    resources:
        **node_resources(block_deployment("floor")),
    params:
        identity=block_identity("floor"),
        results_dir=results_root,
    message:
        "measure the unloaded floor of {wildcards.deployment} on {wildcards.floor}"
    script:
        "../scripts/run.py"


# With config `floor.bracket`: the same floor made again just after its deployment's loaded runs
# (they are its order-only input), on the same traces, under results/floor-after/.
rule floor_after_run:
    input:
        traces=block_inputs("floor_after", "trace"),
        manifests=block_inputs("floor_after", "manifest"),
        resolved=block_resolved_config("floor_after"),
        loaded_runs=deployment_blocks("floor_after"),
    output:
        requests=block_outputs("floor_after", "requests.parquet"),
        scrape=block_outputs("floor_after", "scrape.parquet"),
        run_json=block_outputs("floor_after", "run.json"),
        block="results/floor-after/{deployment}/runs/{arm}/{engine}/{floor}/block.json",
    log:
        "results/logs/floor-after/{deployment}/{arm}/{engine}/{floor}.log",
    priority: block_priority("floor_after")
    conda:
        "../../environment.yml"
    resources:
        **node_resources(block_deployment("floor_after")),
    params:
        identity=block_identity("floor_after"),
        results_dir=results_root,
    message:
        "measure the unloaded floor of {wildcards.deployment} on {wildcards.floor} again, after "
        "its loaded runs"
    script:
        "../scripts/run.py"


rule floor:
    input:
        code=analysis_code(),
        run_json=floor_run_files("run.json"),
        requests=floor_run_files("requests.parquet"),
    output:
        csv="results/floor.csv",
        definitions="results/floor.csv.json",
    log:
        "results/logs/analysis/floor.log",
    conda:
        "../../environment.yml"
    params:
        run_dirs=run_dirs_in_order,
    message:
        "every deployment's unloaded floor -> {output.csv}"
    script:
        "../scripts/floor.py"
