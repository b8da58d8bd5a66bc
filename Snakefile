# servelab: controlled comparisons of LLM serving engines.
# Thin on purpose: configuration, validation, includes and targets. Logic lives in src/servelab.
from snakemake.utils import min_version

# The oldest Snakemake the workflow is tested with: pyproject.toml pins snakemake>=9.18,<10.
min_version("9.18")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/campaign.smk"


rule all:
    default_target: True
    input:
        **campaign_outputs(),


# Every ablation of config/ablations/ (docs/ablations.md), and the target `ablations`.
include: "workflow/rules/ablations.smk"


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
    for ablation in ABLATIONS:  # an ablation on the local backend (none on sim)
        stop_local_backend(ablation.results_dir, ablation.config["backend"])
    print(summary_line(requested_targets(workflow), workflow_started_s))


onerror:
    from servelab.workflow_io import requested_targets, summary_line

    stop_local_backend()
    for ablation in ABLATIONS:  # an ablation on the local backend (none on sim)
        stop_local_backend(ablation.results_dir, ablation.config["backend"])
    print(summary_line(requested_targets(workflow), workflow_started_s, failed=True))
