# One campaign in one file: every trace, deployment record, run artifact and analysis output with
# the configuration and provenance, as a deterministic .tar.gz that `servelab verify` checks and
# regenerates byte for byte on another machine (servelab.bundle.archive).


rule bundle:
    input:
        checksums=rules.checksums.output.checksums,
        run_json=run_files("run_json", RUNS),
        requests=run_files("requests", RUNS),
        telemetry=run_files("telemetry", RUNS),
        manifests=trace_manifests(),
        restarts=restart_records(),
    output:
        bundle="results/bundle.tar.gz",
    log:
        "results/logs/analysis/bundle.log",
    conda:
        "../../environment.yml"
    params:
        # The results folder the bundle reads: where checksums.json lives.
        results_dir=lambda wildcards, input: str(Path(input.checksums).parent),
    message:
        "the campaign as one verifiable bundle -> {output.bundle}"
    script:
        "../scripts/bundle.py"
