# servelab: controlled comparisons of LLM serving engines.
# Thin on purpose: configuration, validation, includes and targets. Logic lives in src/servelab.


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/trace.smk"
include: "workflow/rules/deploy.smk"
include: "workflow/rules/run.smk"
include: "workflow/rules/telemetry.smk"
include: "workflow/rules/restart.smk"
include: "workflow/rules/analysis.smk"


rule all:
    default_target: True
    input:
        tables=all_tables(),
        figures=rules.figures.output.figures,
        numbers=rules.numbers.output.numbers,
        checksums=rules.checksums.output.checksums,


onsuccess:
    stop_local_backend()


onerror:
    stop_local_backend()
