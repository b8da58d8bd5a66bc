"""Snakemake adapter: Figures 1 and 6-14."""

from servelab.analysis import write_figures
from servelab.grid.settings import AnalysisSettings
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_figures(
        list(snakemake.params.run_dirs),
        snakemake.params.out_dir,
        manifests=list(snakemake.input.manifests),
        restart_records=list(snakemake.input.restarts),
        settings=AnalysisSettings.from_mapping(snakemake.params.settings),
    )
