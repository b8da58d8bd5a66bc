"""Snakemake adapter: Table 6."""

from servelab.analysis import write_table6
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    write_table6(
        list(snakemake.params.run_dirs),  # noqa: F821
        snakemake.output.csv,  # noqa: F821
        **snakemake.params.settings,  # noqa: F821
    )
