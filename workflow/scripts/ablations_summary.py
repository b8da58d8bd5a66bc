"""Snakemake adapter: results/ablations/summary.csv, every ablation's Table 5 beside the study's."""

from servelab.analysis.ablations import ablation_summary
from servelab.artifacts import write_text
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    tables = [snakemake.input.study, *snakemake.input.tables]
    write_text(snakemake.output.csv, ablation_summary(list(snakemake.params.sources), tables))
