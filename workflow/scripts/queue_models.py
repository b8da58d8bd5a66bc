"""Snakemake adapter: results/queue_models.csv, its summary and definitions (the fluid and the
closed queueing model against every run)."""

from servelab.analysis.queue_models import discover_probe_dirs, write_queue_models
from servelab.grid.settings import AnalysisSettings
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_queue_models(
        list(snakemake.params.run_dirs),
        snakemake.output.csv,
        snakemake.output.summary,
        traces=list(zip(snakemake.input.traces, snakemake.input.manifests, strict=True)),
        floor_csv=snakemake.input.floor,
        resolved=list(snakemake.input.resolved),
        probe_dirs=discover_probe_dirs(snakemake.params.capacity_searches),
        settings=AnalysisSettings.from_mapping(snakemake.params.settings),
    )
