"""Snakemake adapter: canonical telemetry for one run."""

from servelab.telemetry import canonicalize_files
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    canonicalize_files(
        engine=snakemake.params.engine,  # noqa: F821
        step_s=snakemake.params.step_s,  # noqa: F821
        scrape_path=snakemake.input.scrape,  # noqa: F821
        run_json_path=snakemake.input.run_json,  # noqa: F821
        telemetry_path=snakemake.output.telemetry,  # noqa: F821
    )
