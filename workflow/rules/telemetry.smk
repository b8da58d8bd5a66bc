# Map each run's raw engine-metric window to the canonical telemetry table. A missing or partial
# window is an error, never an empty table.


rule telemetry:
    input:
        # written by the run job of the repetition's block
        scrape=run_file("scrape.parquet"),
        run_json=run_file("run.json"),
    output:
        telemetry=run_file("telemetry.parquet"),
    log:
        "results/logs/telemetry/{arm}/{engine}/{condition}/{rep}.log",
    conda:
        "../../environment.yml"
    params:
        engine="{engine}",
        step_s=config["telemetry"]["step_s"],
    message:
        "telemetry of {wildcards.arm}/{wildcards.engine}/{wildcards.condition}/{wildcards.rep}"
    script:
        "../scripts/telemetry.py"
