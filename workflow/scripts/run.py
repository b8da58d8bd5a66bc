"""Snakemake adapter: one measured run, with retries and reclamation handling."""

from servelab.campaign import execute_run
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    execute_run(
        settings=dict(snakemake.params.settings),
        deployment=dict(snakemake.params.deployment),
        results_dir=snakemake.params.results_dir,
        trace_path=snakemake.input.trace,
        manifest_path=snakemake.input.manifest,
        resolved_path=snakemake.input.resolved,
        requests_path=snakemake.output.requests,
        scrape_path=snakemake.output.scrape,
        run_json_path=snakemake.output.run_json,
    )
