"""Snakemake adapter: bring a deployment up and gate its resolved configuration."""

from servelab.campaign.deploy import deploy, node_for
from servelab.grid.identity import operational_settings
from servelab.workflow_io import log_to

# `snakemake` is injected by Snakemake. The deployment's identity travels whole; operational
# settings (kubeconfig, timeouts, the GPU node it is pinned to, ...) are read from the workflow's
# config when the job runs,
# deliberately not through params.
with log_to(snakemake.log[0]):
    deploy(
        identity=dict(snakemake.params.identity),
        kubernetes=operational_settings(snakemake.config)["kubernetes"],
        manifest_path=snakemake.input.manifest,
        startup_log_path=snakemake.output.startup_log,
        resolved_path=snakemake.output.resolved,
        node=node_for(snakemake.config, snakemake.wildcards.deployment),
    )
