"""Snakemake adapter: results/sim_vs_real.csv, its summary, waiting series and figure."""

import json
from pathlib import Path

from servelab.analysis.sim_vs_real import RunPair, write_sim_vs_real
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    pairs = [
        RunPair(
            **{
                **pair,
                "real_dir": Path(pair["real_dir"]),
                "predicted_dir": Path(pair["predicted_dir"]),
            }
        )
        for pair in snakemake.params.pairs
    ]
    write_sim_vs_real(
        pairs,
        out_csv=snakemake.output.csv,
        out_json=snakemake.output.summary,
        out_waiting=snakemake.output.waiting,
        out_figure=snakemake.output.figure,
        keeps_pace=float(snakemake.params.keeps_pace),
        # config floor.bracket: the record of each deployment's floors before and after its runs
        floor_drift=(
            json.loads(Path(snakemake.input.floor_drift[0]).read_text(encoding="utf-8"))
            if snakemake.input.floor_drift
            else None
        ),
    )
