"""Snakemake adapter: an ablation's record (results/ablations/ID/ablation.json) and the configuration
it ran (config.yaml), written last."""

import logging

from servelab.artifacts import write_json, write_text
from servelab.grid.config import config_text
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    record = dict(snakemake.params.record)
    write_text(snakemake.output.config, config_text(snakemake.params.config))
    write_json(snakemake.output.record, record)
    logging.getLogger("servelab.ablations").info(
        "ablation %s: %d outputs under %s",
        record["id"],
        len(snakemake.input),
        record["results_dir"],
    )
