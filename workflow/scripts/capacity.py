"""Snakemake adapter: results/capacity.csv from every search's final state."""

from servelab.capacity import CapacitySettings, write_capacity
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_capacity(
        list(snakemake.input.states),
        snakemake.output.csv,
        CapacitySettings.from_config(snakemake.config),
    )
