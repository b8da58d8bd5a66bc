"""Snakemake adapter: one restart of an engine's pod, with its event timeline."""

from servelab.campaign.restart import restart_experiment
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    restart_experiment(
        deployment=dict(snakemake.params.deployment),
        backend=snakemake.params.backend,
        kubernetes=dict(snakemake.params.kubernetes),
        rep=snakemake.wildcards.restart,
        manifest_path=snakemake.input.manifest,
        record_path=snakemake.output.record,
    )
