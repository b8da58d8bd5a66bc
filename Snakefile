# servelab: controlled comparisons of LLM serving engines.
# Thin on purpose: configuration, validation, includes and targets. Logic lives in src/servelab.


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/trace.smk"
include: "workflow/rules/deploy.smk"
include: "workflow/rules/run.smk"
include: "workflow/rules/telemetry.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/restart.smk"


rule all:
    default_target: True
    input:
        tables=rules.table5.output.csv,
