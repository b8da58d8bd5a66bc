"""Snakemake adapter: bring a deployment up and gate its resolved configuration."""

from servelab.campaign.deploy import deploy
from servelab.grid.identity import operational_settings
from servelab.workflow_io import log_to

# `snakemake` is injected by Snakemake. Operational settings (kubeconfig, timeouts, ...) are read
# from the workflow's config when the job runs, deliberately not through params.
identity = dict(snakemake.params.identity)
with log_to(snakemake.log[0]):
    deploy(
        deployment={k: v for k, v in identity.items() if k not in ("backend", "gpu", "model")},
        backend=identity["backend"],
        gpu=dict(identity["gpu"]),
        model=dict(identity["model"]),
        kubernetes=operational_settings(snakemake.config)["kubernetes"],
        manifest_path=snakemake.input.manifest,
        startup_log_path=snakemake.output.startup_log,
        resolved_path=snakemake.output.resolved,
    )
