"""Snakemake adapter: results/defaults_diff.csv from the engines' resolution rules."""

from servelab.artifacts import write_text
from servelab.engines.defaults import GpuSpec, defaults_diff, defaults_diff_csv
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    rows = defaults_diff(
        dict(snakemake.params.engines),
        [GpuSpec(g["name"], g["memory_mib"]) for g in snakemake.params.gpus],
        versions=dict(snakemake.params.versions),
        model_max_position_embeddings=int(snakemake.params.max_position_embeddings),
    )
    write_text(snakemake.output.csv, defaults_diff_csv(rows))
