# Reduce per-request run logs into the study's tables and figures. Each table declares exactly the
# runs it reads; the analysis never knows which backend produced them (it refuses to mix them).


rule table5:
    input:
        run_json=run_files("run_json", table5_runs()),
        requests=run_files("requests", table5_runs()),
        telemetry=run_files("telemetry", table5_runs()),
    output:
        csv=report("results/table5.csv", caption="../report/table5.rst", category="Tables"),
    log:
        "results/logs/analysis/table5.log",
    conda:
        "../../environment.yml"
    params:
        settings=analysis_settings(),
        run_dirs=run_dirs(table5_runs()),
    script:
        "../scripts/table5.py"
