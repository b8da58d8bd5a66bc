# One measured run: dispatch the trace to the deployed engine (retrying failed attempts, keeping
# each), record the raw engine-metric window, and the run record with its success check.


rule run:
    input:
        trace=rules.compile_trace.output.trace,
        manifest=rules.compile_trace.output.manifest,
        resolved=run_resolved_config,
    output:
        requests="results/runs/{arm}/{engine}/{condition}/{rep}/requests.parquet",
        scrape="results/runs/{arm}/{engine}/{condition}/{rep}/scrape.parquet",
        run_json="results/runs/{arm}/{engine}/{condition}/{rep}/run.json",
    log:
        "results/logs/runs/{arm}/{engine}/{condition}/{rep}.log",
    priority: run_priority
    conda:
        "../../environment.yml"
    resources:
        gpu_slots=1,
    params:
        settings=run_settings,
        deployment=run_deployment_spec,
        results_dir=results_root,
    message:
        "run {wildcards.arm}/{wildcards.engine}/{wildcards.condition}/{wildcards.rep}"
    script:
        "../scripts/run.py"
