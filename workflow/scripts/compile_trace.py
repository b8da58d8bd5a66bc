"""Snakemake adapter: compile and validate one trace."""

from servelab.workflow_io import log_to
from servelab.workload import compile_trace_files

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    compile_trace_files(
        **snakemake.params.condition,
        rep=snakemake.params.rep,
        seed=snakemake.params.seed,
        workload=dict(snakemake.params.workload),
        tokenizer=snakemake.params.tokenizer,
        trace_path=snakemake.output.trace,
        manifest_path=snakemake.output.manifest,
    )
