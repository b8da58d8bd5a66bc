"""Snakemake adapter: results/run_metrics.csv (every run's named metrics, goodput, energy and cost
per output token) and its definitions beside it."""

from servelab.analysis.slo import write_run_metrics
from servelab.grid.settings import RequestSlo
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_run_metrics(
        list(snakemake.params.run_dirs),
        snakemake.output.csv,
        slo=RequestSlo.from_config(snakemake.params.slo),
        exclude_first_graph=bool(snakemake.params.exclude_first_graph),
        usd_per_node_hour=snakemake.params.usd_per_node_hour,
    )
