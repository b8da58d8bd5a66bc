# Which settings still differ between the campaign's engines under vendor defaults, resolved by
# each engine's own rules before any run (docs/engines.md "Which defaults still differ").


rule defaults_diff:
    output:
        csv="results/defaults_diff.csv",
    log:
        "results/logs/analysis/defaults_diff.log",
    # Written first: it says, before any GPU time, what the defaults arm compares.
    priority: 100
    conda:
        "../../environment.yml"
    params:
        engines={engine: list(grid.vendor_default_flags(config, engine)) for engine in ENGINES},
        versions={engine: str(config["engines"][engine]["version"]) for engine in ENGINES},
        gpus=grid.defaults_diff_gpus(config),
        max_position_embeddings=model_max_position_embeddings(),
    message:
        "which defaults still differ -> {output.csv}"
    script:
        "../scripts/defaults_diff.py"
