# One campaign: every rule, its paths under results/. The Snakefile runs it on the configured
# grid; workflow/rules/ablations.smk runs it again as a module for each ablation, with the
# ablation's configuration and its paths under results/ablations/ID/ (docs/ablations.md).


include: "rules/common.smk"
include: "rules/trace.smk"
include: "rules/deploy.smk"
include: "rules/run.smk"
include: "rules/telemetry.smk"
include: "rules/restart.smk"
include: "rules/defaults.smk"
include: "rules/analysis.smk"
include: "rules/status.smk"
include: "rules/bundle.smk"
include: "rules/capacity.smk"
include: "rules/floor.smk"
include: "rules/sim_vs_real.smk"
