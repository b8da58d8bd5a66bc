"""Snakemake adapter: one block (every repetition of one arm, engine and condition)."""

from servelab.campaign.blocks import execute_block
from servelab.campaign.deploy import node_for
from servelab.grid.identity import operational_settings
from servelab.workflow_io import log_to

# `snakemake` is injected by Snakemake. Operational settings are read from the workflow's config
# when the job runs, deliberately not through params: changing one must re-measure nothing.
with log_to(snakemake.log[0]):
    execute_block(
        identity=dict(snakemake.params.identity),
        operational=operational_settings(snakemake.config),
        faults=list(snakemake.config["campaign"].get("faults", [])),
        results_dir=snakemake.params.results_dir,
        traces=list(snakemake.input.traces),
        manifests=list(snakemake.input.manifests),
        resolved_path=snakemake.input.resolved,
        block_json_path=snakemake.output.block,
        # the GPU node its deployment is pinned to (operational, as the settings above)
        node=node_for(snakemake.config, snakemake.params.identity["deployment"]["deployment_id"]),
    )
