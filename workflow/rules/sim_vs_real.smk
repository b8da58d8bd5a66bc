# The simulator's schedulers held against the real ones (docs/simulator.md, "Against the real
# engines"). The CPU platform is fitted from the floor runs only (its inputs are the floor's files:
# no loaded run is read); every run of the grid is then predicted on its own seeded trace, and
# the predictions are compared with the real runs by the analysis's own reductions.


rule cpu_platform:
    input:
        floor_run_json=floor_run_files("run.json"),
        floor_requests=floor_run_files("requests.parquet"),
        floor_traces=floor_trace_files("trace"),
        floor_manifests=floor_trace_files("manifest"),
    output:
        platform="results/sim_vs_real/platform.json",
    log:
        "results/logs/sim_vs_real/platform.log",
    conda:
        "../../environment.yml"
    params:
        floor_runs=floor_runs_read("floor"),
        gpu_memory_mib=int(config["gpu"]["memory_mib"]),
        model_preset=config["model"].get("preset"),
    message:
        "fit the CPU platform's step time of every engine from its floor -> {output.platform}"
    script:
        "../scripts/cpu_platform.py"


# With config `floor.bracket`: did the machine's speed move while each deployment's loaded runs
# were measured? Its floor before them against its floor after them, on the same traces.
rule floor_drift:
    input:
        floor_run_json=floor_run_files("run.json"),
        floor_requests=floor_run_files("requests.parquet"),
        floor_after_run_json=floor_run_files("run.json", "floor_after"),
        floor_after_requests=floor_run_files("requests.parquet", "floor_after"),
        floor_traces=floor_trace_files("trace"),
    output:
        drift="results/sim_vs_real/floor_drift.json",
    log:
        "results/logs/sim_vs_real/floor_drift.log",
    conda:
        "../../environment.yml"
    params:
        before=floor_runs_read("floor"),
        after=floor_runs_read("floor_after"),
        band=FLOOR_BRACKET_BAND,
        max_noise=grid.floor_bracket_max_noise(config),
    message:
        "each deployment's floor before its loaded runs against its floor after them -> "
        "{output.drift}"
    script:
        "../scripts/floor_drift.py"


rule predict_run:
    input:
        trace=rules.compile_trace.output.trace,
        manifest=rules.compile_trace.output.manifest,
        platform=rules.cpu_platform.output.platform,
    output:
        requests=predicted_outputs("requests.parquet"),
        scrape=predicted_outputs("scrape.parquet"),
        run_json=predicted_outputs("run.json"),
    log:
        "results/logs/sim_vs_real/predicted/{arm}/{engine}/{condition}/{rep}.log",
    conda:
        "../../environment.yml"
    params:
        settings=prediction_settings,
    message:
        "predict {wildcards.arm}/{wildcards.engine}/{wildcards.condition}/{wildcards.rep} "
        "on the fitted CPU platform"
    script:
        "../scripts/predict_run.py"


rule sim_vs_real:
    input:
        code=analysis_code(),
        real_requests=run_files("requests", RUNS),
        real_run_json=run_files("run_json", RUNS),
        real_scrape=[
            run_file("scrape.parquet").format(
                arm=run.arm, engine=run.engine, condition=run.condition, rep=run.rep
            )
            for run in RUNS
        ],
        predicted_requests=predicted_files("requests.parquet"),
        predicted_run_json=predicted_files("run.json"),
        predicted_scrape=predicted_files("scrape.parquet"),
        floor_drift=([rules.floor_drift.output.drift] if FLOOR_BRACKET_BAND is not None else []),
    output:
        csv="results/sim_vs_real.csv",
        summary="results/sim_vs_real.json",
        waiting="results/sim_vs_real_waiting.csv",
        figure="results/figures/sim_vs_real.png",
    log:
        "results/logs/analysis/sim_vs_real.log",
    conda:
        "../../environment.yml"
    params:
        pairs=sim_vs_real_pairs,
        keeps_pace=grid.analysis_settings(config)["keeps_pace"],
    message:
        "the simulator against the real engines -> {output.csv}"
    script:
        "../scripts/sim_vs_real.py"
