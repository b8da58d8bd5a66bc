"""Snakemake adapter: render one deployment's Kubernetes manifests."""

from servelab.campaign import render_manifests
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    render_manifests(
        deployment=dict(snakemake.params.deployment),  # noqa: F821
        namespace=snakemake.params.namespace,  # noqa: F821
        kubernetes=dict(snakemake.params.kubernetes),  # noqa: F821
        manifest_path=snakemake.output.manifest,  # noqa: F821
    )
