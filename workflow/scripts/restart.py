"""Snakemake adapter: one restart of an engine's pod, with its event timeline."""

from servelab.campaign.deploy import node_for
from servelab.campaign.restart import restart_experiment
from servelab.grid.identity import deployment_identity
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    restart_experiment(
        identity=deployment_identity(snakemake.config, snakemake.params.deployment),
        kubernetes=dict(snakemake.params.kubernetes),
        rep=snakemake.wildcards.restart,
        manifest_path=snakemake.input.manifest,
        record_path=snakemake.output.record,
        node=node_for(snakemake.config, snakemake.params.deployment["deployment_id"]),
    )
