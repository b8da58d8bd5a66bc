"""Snakemake adapter: predict one run of the grid on the fitted CPU platform."""

from servelab.sim.cpu_fit import predict_run
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    predict_run(
        dict(snakemake.params.settings),
        platform_path=snakemake.input.platform,
        trace_path=snakemake.input.trace,
        manifest_path=snakemake.input.manifest,
        arm=snakemake.wildcards.arm,
        engine=snakemake.wildcards.engine,
        condition=snakemake.wildcards.condition,
        rep=snakemake.wildcards.rep,
        requests_path=snakemake.output.requests,
        scrape_path=snakemake.output.scrape,
        run_json_path=snakemake.output.run_json,
    )
