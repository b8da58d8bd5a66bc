"""Snakemake adapter: bring a deployment up and gate its resolved configuration."""

from servelab.campaign import deploy
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    deploy(
        deployment=dict(snakemake.params.deployment),
        backend=snakemake.params.backend,
        gpu=dict(snakemake.params.gpu),
        model=dict(snakemake.params.model),
        kubernetes=dict(snakemake.params.kubernetes),
        manifest_path=snakemake.input.manifest,
        startup_log_path=snakemake.output.startup_log,
        resolved_path=snakemake.output.resolved,
    )
