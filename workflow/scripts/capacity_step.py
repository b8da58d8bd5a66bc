"""Snakemake adapter: one step of a capacity search (decide, measure one probe, write the state)."""

from servelab.capacity.method import Search
from servelab.capacity.step import capacity_step
from servelab.workflow_io import log_to

# `snakemake` is injected by Snakemake. The job runs with the workflow's config (its identity is
# the params, servelab.capacity.method.search_identity).
with log_to(snakemake.log[0]):
    previous = list(snakemake.input.previous)
    capacity_step(
        snakemake.config,
        Search(**snakemake.params.search),
        previous=previous[0] if previous else None,
        resolved_path=snakemake.input.resolved,
        probe_dir=snakemake.output.probe,
        state_path=snakemake.output.state,
    )
