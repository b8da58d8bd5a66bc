# servelab: controlled comparisons of LLM serving engines.
# Thin on purpose: configuration, validation, includes and targets. Logic lives in src/servelab.
from snakemake.utils import min_version

# The oldest Snakemake the workflow is tested with: pyproject.toml pins snakemake>=9.18,<10.
min_version("9.18")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/trace.smk"
include: "workflow/rules/deploy.smk"
include: "workflow/rules/run.smk"
include: "workflow/rules/telemetry.smk"
include: "workflow/rules/restart.smk"
include: "workflow/rules/defaults.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/status.smk"
include: "workflow/rules/bundle.smk"
include: "workflow/rules/capacity.smk"
include: "workflow/rules/floor.smk"
include: "workflow/rules/sim_vs_real.smk"


rule all:
    default_target: True
    input:
        tables=all_tables(),
        defaults_diff=rules.defaults_diff.output.csv,
        run_metrics=rules.run_metrics.output.csv,
        floor=rules.floor.output.csv,
        figures=rules.figures.output.figures,
        numbers=rules.numbers.output.numbers,
        checksums=rules.checksums.output.checksums,


onstart:
    # Outputs modified from now on are what this invocation wrote (the closing summary line).
    global workflow_started_s
    import time

    workflow_started_s = time.time()
    # On real hardware the capacity search's worst case is GPU time: say it before the first probe.
    print_capacity_cost()


onsuccess:
    from servelab.workflow_io import requested_targets, summary_line

    stop_local_backend()
    print(summary_line(requested_targets(workflow), workflow_started_s))


onerror:
    from servelab.workflow_io import requested_targets, summary_line

    stop_local_backend()
    print(summary_line(requested_targets(workflow), workflow_started_s, failed=True))
