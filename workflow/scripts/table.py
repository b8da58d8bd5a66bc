"""Snakemake adapter: one of the study's tables (3-6), by the rule's `params.number`."""

from servelab.analysis import write_table
from servelab.grid.settings import AnalysisSettings
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_table(
        int(snakemake.params.number),
        list(snakemake.params.run_dirs),
        snakemake.output.csv,
        settings=AnalysisSettings.from_mapping(snakemake.params.settings),
    )
