"""Snakemake adapter: results/campaign_status.csv, every run of the grid with its state."""

from pathlib import Path

from servelab.campaign.status import write_status_csv
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_status_csv(
        snakemake.config,
        results=Path(snakemake.output.csv).parent,
        path=snakemake.output.csv,
    )
