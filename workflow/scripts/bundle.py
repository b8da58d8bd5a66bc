"""Snakemake adapter: the campaign's results, configuration and provenance as one bundle."""

from servelab.bundle.archive import write_bundle
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_bundle(snakemake.params.results_dir, snakemake.config, snakemake.output.bundle)
