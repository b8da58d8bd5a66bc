"""Snakemake adapter: results/floor.csv (every deployment's unloaded floor) and its definitions."""

from servelab.analysis.floor import write_floor
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_floor(list(snakemake.params.run_dirs), snakemake.output.csv)
