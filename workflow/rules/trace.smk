# Compile and validate each (condition, rep)'s trace (or import it: a condition with `trace`). The
# seed depends only on (condition, rep), so both engines and both arms replay byte-identical traces.


rule compile_trace:
    input:
        # a condition replaying an imported trace reads its file; a compiled one reads none
        source=trace_source,
    output:
        trace="results/traces/{condition}/{rep}/trace.parquet",
        manifest="results/traces/{condition}/{rep}/manifest.json",
    log:
        "results/logs/traces/{condition}/{rep}.log",
    priority: 1000
    conda:
        "../../environment.yml"
    params:
        condition=trace_condition,
        rep="{rep}",
        seed=trace_seed,
        workload=config["workload"],
        tokenizer=config["tokenizer"],
    message:
        "compile and validate the trace of {wildcards.condition}/{wildcards.rep}"
    script:
        "../scripts/compile_trace.py"
