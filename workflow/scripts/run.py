"""Snakemake adapter: one measured run, with retries and reclamation handling."""

from servelab.campaign import execute_run
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    execute_run(
        settings=dict(snakemake.params.settings),  # noqa: F821
        deployment=dict(snakemake.params.deployment),  # noqa: F821
        results_dir=snakemake.params.results_dir,  # noqa: F821
        trace_path=snakemake.input.trace,  # noqa: F821
        manifest_path=snakemake.input.manifest,  # noqa: F821
        resolved_path=snakemake.input.resolved,  # noqa: F821
        requests_path=snakemake.output.requests,  # noqa: F821
        scrape_path=snakemake.output.scrape,  # noqa: F821
        run_json_path=snakemake.output.run_json,  # noqa: F821
    )
