# One block: every repetition of one (arm, engine, condition), measured by one job (retrying failed
# attempts, keeping each; on a reclaimed node, discarding and repeating the whole block), with the
# raw engine-metric window and the run record of each repetition. Only the settings that define a
# measurement are params (servelab.grid.identity); operational ones are read when the job runs.


rule run:
    input:
        traces=block_inputs("run", "trace"),
        manifests=block_inputs("run", "manifest"),
        # A redeployment re-plans the block, but each repetition's sealed measurement is
        # published again, not re-measured, while the deployment's identity and the
        # configuration it resolved are the same (they are in the measurement's key).
        resolved=block_resolved_config("run"),
        # With config `floor.bracket`, the deployment's floor is measured just before its runs.
        floor_before=deployment_blocks("run"),
    output:
        requests=block_outputs("run", "requests.parquet"),
        scrape=block_outputs("run", "scrape.parquet"),
        run_json=block_outputs("run", "run.json"),
        block="results/runs/{arm}/{engine}/{condition}/block.json",
    log:
        "results/logs/runs/{arm}/{engine}/{condition}.log",
    priority: block_priority("run")
    conda:
        "../../environment.yml"
    resources:
        **node_resources(block_deployment("run")),
    params:
        identity=block_identity("run"),
        results_dir=results_root,
    message:
        "run every repetition of {wildcards.arm}/{wildcards.engine}/{wildcards.condition}"
    script:
        "../scripts/run.py"
