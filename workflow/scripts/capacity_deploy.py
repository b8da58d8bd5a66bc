"""Snakemake adapter: deploy one capacity search's engine and confirm its resolved configuration."""

from servelab.capacity.method import Search
from servelab.capacity.step import deploy_search
from servelab.workflow_io import log_to

# `snakemake` is injected by Snakemake. The job runs with the workflow's config (its identity is
# the params, servelab.capacity.method.search_identity).
with log_to(snakemake.log[0]):
    deploy_search(
        snakemake.config,
        Search(**snakemake.params.search),
        folder=str(snakemake.output.resolved).rsplit("/", 1)[0],
    )
