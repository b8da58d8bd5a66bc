"""Snakemake adapter: compile and validate one floor trace (servelab.workload.floor)."""

from servelab.workflow_io import log_to
from servelab.workload.floor import compile_floor_trace_files

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    compile_floor_trace_files(
        condition=snakemake.wildcards.floor,
        rep=snakemake.wildcards.floor_rep,
        seed=int(snakemake.params.seed),
        sharing=float(snakemake.params.shape["sharing"]),
        prompt_tokens=int(snakemake.params.shape["prompt_tokens"]),
        requests=int(snakemake.params.requests),
        workload=dict(snakemake.params.workload),
        tokenizer=str(snakemake.params.tokenizer),
        trace_path=snakemake.output.trace,
        manifest_path=snakemake.output.manifest,
    )
