"""Snakemake adapter: recompute the analysis and compare it byte for byte with the checksums."""

from servelab.analysis import verify_against_checksums
from servelab.grid.settings import AnalysisSettings
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    verify_against_checksums(
        list(snakemake.params.run_dirs),
        snakemake.input.checksums,
        snakemake.output.verified,
        manifests=list(snakemake.input.manifests),
        restart_records=list(snakemake.input.restarts),
        settings=AnalysisSettings.from_mapping(snakemake.params.settings),
    )
