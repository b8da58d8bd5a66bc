"""Snakemake adapter: one of the study's tables (3-6), by the rule's `params.number`."""

from servelab.analysis import write_table
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    write_table(
        int(snakemake.params.number),  # noqa: F821
        list(snakemake.params.run_dirs),  # noqa: F821
        snakemake.output.csv,  # noqa: F821
        **snakemake.params.settings,  # noqa: F821
    )
