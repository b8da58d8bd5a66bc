"""Snakemake adapter: Figures 1 and 6-14."""

from servelab.analysis import write_figures
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    write_figures(
        list(snakemake.params.run_dirs),  # noqa: F821
        snakemake.params.out_dir,  # noqa: F821
        manifests=list(snakemake.input.manifests),  # noqa: F821
        restart_records=list(snakemake.input.restarts),  # noqa: F821
        **snakemake.params.settings,  # noqa: F821
    )
