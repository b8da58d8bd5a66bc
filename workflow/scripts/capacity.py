"""Snakemake adapter: results/capacity.csv and its figure from every search's final state."""

from servelab.capacity.figure import draw_capacity
from servelab.capacity.method import read_state, write_capacity
from servelab.grid.settings import CapacitySettings
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    states = [read_state(path) for path in snakemake.input.states]
    write_capacity(
        states,
        snakemake.output.csv,
        CapacitySettings.from_config(snakemake.config),
        usd_per_node_hour=snakemake.params.usd_per_node_hour,
    )
    draw_capacity(states, snakemake.output.figure)
