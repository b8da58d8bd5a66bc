"""Snakemake adapter: numbers.json and the analysis notes."""

from servelab.analysis import write_numbers
from servelab.grid.settings import AnalysisSettings
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_numbers(
        list(snakemake.params.run_dirs),
        snakemake.output.numbers,
        manifests=list(snakemake.input.manifests),
        restart_records=list(snakemake.input.restarts),
        notes_path=snakemake.output.notes,
        settings=AnalysisSettings.from_mapping(snakemake.params.settings),
    )
