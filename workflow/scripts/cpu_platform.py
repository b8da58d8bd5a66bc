"""Snakemake adapter: fit the CPU platform's step time of every engine from its floor runs."""

from servelab.sim.cpu_fit import write_cpu_platform
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    write_cpu_platform(
        list(snakemake.params.floor_runs),
        gpu_memory_mib=int(snakemake.params.gpu_memory_mib),
        model_preset=snakemake.params.model_preset,
        out_path=snakemake.output.platform,
    )
