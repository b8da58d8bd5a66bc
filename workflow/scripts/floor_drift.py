"""Snakemake adapter: each deployment's floor before its loaded runs against its floor after them."""

from servelab.sim.cpu_fit import write_floor_drift
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_floor_drift(
        list(snakemake.params.before),
        list(snakemake.params.after),
        band=float(snakemake.params.band),
        max_noise=snakemake.params.max_noise,
        out_path=snakemake.output.drift,
    )
