# Map each run's raw engine-metric window to the canonical telemetry table. A missing or partial
# window is an error, never an empty table.


rule telemetry:
    input:
        scrape=rules.run.output.scrape,
        run_json=rules.run.output.run_json,
    output:
        telemetry="results/runs/{arm}/{engine}/{condition}/{rep}/telemetry.parquet",
    log:
        "results/logs/telemetry/{arm}/{engine}/{condition}/{rep}.log",
    conda:
        "../../environment.yml"
    params:
        engine="{engine}",
        step_s=config["telemetry"]["step_s"],
    script:
        "../scripts/telemetry.py"
