"""Snakemake adapter: compile and validate one trace."""

from servelab.workflow_io import log_to
from servelab.workload import compile_trace_files

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    compile_trace_files(
        **snakemake.params.condition,  # noqa: F821
        rep=snakemake.params.rep,  # noqa: F821
        seed=snakemake.params.seed,  # noqa: F821
        workload=dict(snakemake.params.workload),  # noqa: F821
        tokenizer=snakemake.params.tokenizer,  # noqa: F821
        trace_path=snakemake.output.trace,  # noqa: F821
        manifest_path=snakemake.output.manifest,  # noqa: F821
    )
