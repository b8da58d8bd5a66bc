"""Snakemake adapter: compile and validate one trace."""

from servelab.grid.config import conditions
from servelab.workflow_io import log_to
from servelab.workload import compile_trace_files

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    # The condition whole, as the workflow's grid defines it (`params.condition` holds its values,
    # so a change to one of them recompiles the trace).
    compile_trace_files(
        condition=conditions(snakemake.config)[snakemake.wildcards.condition],
        rep=snakemake.params.rep,
        seed=snakemake.params.seed,
        workload=dict(snakemake.params.workload),
        tokenizer=snakemake.params.tokenizer,
        trace_path=snakemake.output.trace,
        manifest_path=snakemake.output.manifest,
    )
