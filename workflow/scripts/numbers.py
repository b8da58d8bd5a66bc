"""Snakemake adapter: numbers.json and the analysis notes."""

from servelab.analysis import write_numbers
from servelab.workflow_io import log_to

with log_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    write_numbers(
        list(snakemake.params.run_dirs),  # noqa: F821
        snakemake.output.numbers,  # noqa: F821
        manifests=list(snakemake.input.manifests),  # noqa: F821
        restart_records=list(snakemake.input.restarts),  # noqa: F821
        notes_path=snakemake.output.notes,  # noqa: F821
        **snakemake.params.settings,  # noqa: F821
    )
