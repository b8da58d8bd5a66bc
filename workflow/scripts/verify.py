"""Snakemake adapter: recompute the analysis and compare it byte for byte with the checksums."""

from servelab.analysis import verify_against_checksums
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    verify_against_checksums(
        list(snakemake.params.run_dirs),  # noqa: F821
        snakemake.input.checksums,  # noqa: F821
        snakemake.output.verified,  # noqa: F821
        manifests=list(snakemake.input.manifests),  # noqa: F821
        restart_records=list(snakemake.input.restarts),  # noqa: F821
        **snakemake.params.settings,  # noqa: F821
    )
