# Reduce per-request run logs into the study's tables and figures. Each output declares exactly
# the runs it reads; the analysis never knows which backend produced them (it refuses to mix them).


rule table3:
    input:
        code=analysis_code(),
        run_json=run_files("run_json", RUNS),
        requests=run_files("requests", RUNS),
    output:
        csv=report("results/table3.csv", caption="../report/table3.rst", category="Tables"),
    log:
        "results/logs/analysis/table3.log",
    conda:
        "../../environment.yml"
    params:
        number=3,
        settings=analysis_settings(),
        run_dirs=run_dirs_of_input,
    message:
        "Table 3 (requests per run) -> {output.csv}"
    script:
        "../scripts/table.py"


rule table4:
    input:
        code=analysis_code(),
        run_json=run_files("run_json", table4_runs()),
        requests=run_files("requests", table4_runs()),
    output:
        csv=report("results/table4.csv", caption="../report/table4.rst", category="Tables"),
    log:
        "results/logs/analysis/table4.log",
    conda:
        "../../environment.yml"
    params:
        number=4,
        settings=analysis_settings(),
        run_dirs=run_dirs_of_input,
    message:
        "Table 4 (SGLang under defaults and matched) -> {output.csv}"
    script:
        "../scripts/table.py"


rule table5:
    input:
        code=analysis_code(),
        run_json=run_files("run_json", table5_runs()),
        requests=run_files("requests", table5_runs()),
        telemetry=run_files("telemetry", table5_runs()),
        # Not read by the table: written before any run, so table5.csv comes with the answer
        # to "what did the defaults arm compare?" (docs/engines.md).
        defaults_diff=rules.defaults_diff.output.csv,
    output:
        csv=report("results/table5.csv", caption="../report/table5.rst", category="Tables"),
    log:
        "results/logs/analysis/table5.log",
    conda:
        "../../environment.yml"
    params:
        number=5,
        settings=analysis_settings(),
        run_dirs=run_dirs_of_input,
    message:
        "Table 5 (the decomposition) -> {output.csv}"
    script:
        "../scripts/table.py"


rule table6:
    input:
        code=analysis_code(),
        run_json=run_files("run_json", table5_runs()),
        requests=run_files("requests", table5_runs()),
    output:
        csv=report("results/table6.csv", caption="../report/table6.rst", category="Tables"),
    log:
        "results/logs/analysis/table6.log",
    conda:
        "../../environment.yml"
    params:
        number=6,
        settings=analysis_settings(),
        run_dirs=run_dirs_of_input,
    message:
        "Table 6 (TTFT dispersion) -> {output.csv}"
    script:
        "../scripts/table.py"


rule figures:
    input:
        code=analysis_code(),
        run_json=run_files("run_json", RUNS),
        requests=run_files("requests", RUNS),
        telemetry=run_files("telemetry", RUNS),
        manifests=trace_manifests(),
        restarts=restart_records(),
    output:
        figures=figure_outputs(),
    log:
        "results/logs/analysis/figures.log",
    conda:
        "../../environment.yml"
    params:
        settings=analysis_settings(),
        run_dirs=run_dirs_of_input,
        out_dir=figure_dir,
    message:
        "Figures 1 and 6-14"
    script:
        "../scripts/figures.py"


rule numbers:
    input:
        code=analysis_code(),
        run_json=run_files("run_json", RUNS),
        requests=run_files("requests", RUNS),
        telemetry=run_files("telemetry", RUNS),
        manifests=trace_manifests(),
        restarts=restart_records(),
    output:
        numbers=report("results/numbers.json", caption="../report/numbers.rst", category="Numbers"),
        notes="results/analysis_notes.txt",
    log:
        "results/logs/analysis/numbers.log",
    conda:
        "../../environment.yml"
    params:
        settings=analysis_settings(),
        run_dirs=run_dirs_of_input,
    message:
        "numbers.json and analysis notes -> {output.numbers}"
    script:
        "../scripts/numbers.py"


rule run_metrics:
    input:
        code=analysis_code(),
        run_json=run_files("run_json", RUNS),
        requests=run_files("requests", RUNS),
        # the GPU's energy counter, where the backend has one (kubernetes)
        telemetry=run_files("telemetry", RUNS),
    output:
        csv="results/run_metrics.csv",
        definitions="results/run_metrics.csv.json",
    log:
        "results/logs/analysis/run_metrics.log",
    conda:
        "../../environment.yml"
    params:
        # The per-request SLO (config analysis.slo; default MLPerf's TTFT 2 s, TPOT 100 ms).
        slo=grid.request_slo(config),
        exclude_first_graph=config["analysis"]["exclude_first_graph"],
        # USD per hour of the campaign's GPU node (config analysis.cost; null: no dollar figures)
        usd_per_node_hour=grid.node_usd_per_hour(config),
        run_dirs=run_dirs_of_input,
    message:
        "every run's named latency metrics, goodput, SLO attainment, energy and cost per token -> {output.csv}"
    script:
        "../scripts/run_metrics.py"


rule checksums:
    input:
        tables=all_tables(),
        figures=rules.figures.output.figures,
        numbers=rules.numbers.output.numbers,
        notes=rules.numbers.output.notes,
    output:
        checksums="results/checksums.json",
    log:
        "results/logs/analysis/checksums.log",
    conda:
        "../../environment.yml"
    params:
        results_dir=results_dir_of_checksums,
    message:
        "checksums of every analysis output -> {output.checksums}"
    script:
        "../scripts/checksums.py"


# Recompute every table, figure and number from the run logs in a scratch folder and compare
# byte for byte with the recorded checksums.
rule verify:
    input:
        code=analysis_code(),
        checksums=rules.checksums.output.checksums,
        run_json=run_files("run_json", RUNS),
        requests=run_files("requests", RUNS),
        telemetry=run_files("telemetry", RUNS),
        manifests=trace_manifests(),
        restarts=restart_records(),
    output:
        verified="results/verify.txt",
    log:
        "results/logs/analysis/verify.log",
    conda:
        "../../environment.yml"
    params:
        settings=analysis_settings(),
        run_dirs=run_dirs_of_input,
    message:
        "re-analyse from the run logs and compare byte for byte -> {output.verified}"
    script:
        "../scripts/verify.py"


# The fluid (§6.3, Eq. 8) and the closed queueing model against every measured run
# (docs/analysis.md, "Closed queueing model"). The closed model reads the floor, the deployments'
# KV sizes, the traces and, when the config has a `capacity:` section, the capacity probes; no
# loaded run of the grid enters its predictions. Not in `all`: with a capacity section it runs
# the capacity searches first (config/capacity-saturation.yaml).
rule queue_models:
    input:
        code=analysis_code(),
        run_json=run_files("run_json", RUNS),
        requests=run_files("requests", RUNS),
        traces=trace_files(),
        manifests=trace_manifests(),
        # results/floor.csv (rule floor, in floor.smk: included after this file)
        floor="results/floor.csv",
        resolved=deployment_resolved_files(),
        capacity=queue_models_capacity(),
    output:
        csv="results/queue_models.csv",
        summary="results/queue_models_summary.csv",
        definitions="results/queue_models.csv.json",
    log:
        "results/logs/analysis/queue_models.log",
    conda:
        "../../environment.yml"
    params:
        settings=analysis_settings(),
        run_dirs=run_dirs(RUNS),
        capacity_searches=capacity_search_dirs(),
    message:
        "the fluid and the closed queueing model against every run -> {output.csv}"
    script:
        "../scripts/queue_models.py"
