"""Snakemake adapter: record the SHA-256 of every analysis output."""

from servelab.analysis import record_checksums
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    record_checksums(snakemake.params.results_dir, snakemake.output.checksums)
