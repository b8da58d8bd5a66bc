"""Snakemake adapter: Table 3."""

from servelab.analysis import write_table3
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    write_table3(
        list(snakemake.params.run_dirs),  # noqa: F821
        snakemake.output.csv,  # noqa: F821
        **snakemake.params.settings,  # noqa: F821
    )
