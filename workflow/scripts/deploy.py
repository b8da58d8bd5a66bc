"""Snakemake adapter: bring a deployment up and gate its resolved configuration."""

from servelab.campaign import deploy
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    deploy(
        deployment=dict(snakemake.params.deployment),  # noqa: F821
        backend=snakemake.params.backend,  # noqa: F821
        gpu=dict(snakemake.params.gpu),  # noqa: F821
        model=dict(snakemake.params.model),  # noqa: F821
        kubernetes=dict(snakemake.params.kubernetes),  # noqa: F821
        manifest_path=snakemake.input.manifest,  # noqa: F821
        startup_log_path=snakemake.output.startup_log,  # noqa: F821
        resolved_path=snakemake.output.resolved,  # noqa: F821
    )
