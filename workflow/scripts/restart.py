"""Snakemake adapter: one restart of an engine's pod, with its event timeline."""

from servelab.campaign import restart_experiment
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    restart_experiment(
        deployment=dict(snakemake.params.deployment),  # noqa: F821
        backend=snakemake.params.backend,  # noqa: F821
        kubernetes=dict(snakemake.params.kubernetes),  # noqa: F821
        rep=snakemake.wildcards.restart,  # noqa: F821
        manifest_path=snakemake.input.manifest,  # noqa: F821
        record_path=snakemake.output.record,  # noqa: F821
    )
