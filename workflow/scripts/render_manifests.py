"""Snakemake adapter: render one deployment's Kubernetes manifests."""

from servelab.campaign.deploy import render_manifests
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    render_manifests(
        deployment=dict(snakemake.params.deployment),
        namespace=snakemake.params.kubernetes["namespace"],
        kubernetes=dict(snakemake.params.kubernetes),
        manifest_path=snakemake.output.manifest,
    )
