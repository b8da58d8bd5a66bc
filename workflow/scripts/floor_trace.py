"""Snakemake adapter: compile and validate one floor trace (servelab.workload.floor)."""

from servelab.grid.config import FloorShape
from servelab.workflow_io import log_to
from servelab.workload.floor import IdleGaps, compile_floor_trace_files

with log_to(snakemake.log[0]):  # `snakemake` is injected by Snakemake
    # the shape whose id is the {floor} wildcard (the workflow's floor shapes are keyed by it)
    shape = FloorShape(
        float(snakemake.params.shape["sharing"]),
        int(snakemake.params.shape["prompt_tokens"]),
        int(snakemake.params.shape.get("together", 1)),
    )
    compile_floor_trace_files(
        shape=shape,
        rep=snakemake.wildcards.floor_rep,
        seed=int(snakemake.params.seed),
        requests=int(snakemake.params.requests),
        workload=dict(snakemake.params.workload),
        tokenizer=str(snakemake.params.tokenizer),
        trace_path=snakemake.output.trace,
        manifest_path=snakemake.output.manifest,
        idle_gaps=IdleGaps.from_config(snakemake.params.shape.get("idle_gaps")),
    )
