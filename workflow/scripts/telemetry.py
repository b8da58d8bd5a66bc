"""Snakemake adapter: canonical telemetry for one run."""

from servelab.telemetry import canonicalize_files
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    canonicalize_files(
        engine=snakemake.params.engine,
        step_s=snakemake.params.step_s,
        scrape_path=snakemake.input.scrape,
        run_json_path=snakemake.input.run_json,
        telemetry_path=snakemake.output.telemetry,
    )
