# Ablations (docs/ablations.md): each file config/ablations/NAME.yaml with an `ablation:` section
# is laid over the study's configuration (servelab.campaign.ablations) and runs the whole campaign
# again as a Snakemake module (workflow/campaign.smk): the same rules, prefixed ablation_ID_, their
# paths results/... replaced by results/ablations/ID/... (its traces, deployments, runs, logs,
# tables and figures). `snakemake --cores 1 ablations` builds every one and the summary beside the
# study's own Table 5. They are loaded only when the command names one (a word containing
# "ablation": servelab.workflow_io.ablations_requested; SERVELAB_ABLATIONS=1 loads them anyway):
# each is the whole workflow parsed again, seconds each, which no other command should pay.

import os
import sys

from servelab.workflow_io import ablations_requested

ABLATIONS = []
if ablations_requested(sys.argv[1:], os.environ):
    import servelab.campaign.ablations as ablation_overlays

    try:
        # config/ablations/ and each ablation's base, found where configfile: finds its file
        ABLATIONS = ablation_overlays.load_ablations(Path.cwd())
    except ConfigError as error:
        raise WorkflowError(str(error)) from None


for ABLATION in ABLATIONS:
    ABLATION_MODULE = f"ablation_{ABLATION.slug}"
    ABLATION_RULES = f"ablation_{ABLATION.slug}_"

    module:
        name: ABLATION_MODULE
        snakefile:
            "../campaign.smk"
        config:
            ABLATION.config
        replace_prefix:
            {"results/": f"{ABLATION.results_dir}/"}

    use rule * from ABLATION_MODULE as ABLATION_RULES*

    # The ablation's record, written once everything it builds exists: what it was laid over
    # (each file's SHA-256) and what was derived from the engines' rules (ablation.json), and the
    # configuration it ran (config.yaml).
    rule:
        name:
            f"ablation_{ABLATION.slug}"
        input:
            # everything `all` builds but the unloaded floor (no ablation's question needs it),
            # the module's rules' outputs under the ablation's folder
            **workflow.globals[ABLATION_MODULE].campaign_outputs(floor=False),
        output:
            record=f"{ABLATION.results_dir}/ablation.json",
            # the configuration it ran, merged and derived: what `servelab campaign plan|status
            # --config` reads for it
            config=f"{ABLATION.results_dir}/config.yaml",
        log:
            f"results/logs/ablations/{ABLATION.id}.log",
        localrule: True
        conda:
            "../../environment.yml"
        params:
            record=ABLATION.record(),
            config=ABLATION.config,
        message:
            f"ablation {ABLATION.id} -> {ABLATION.results_dir}/"
        script:
            "../scripts/ablation_record.py"


if ABLATIONS:

    rule ablations:
        input:
            records=[f"{ablation.results_dir}/ablation.json" for ablation in ABLATIONS],
            tables=[f"{ablation.results_dir}/table5.csv" for ablation in ABLATIONS],
            # the study's own Table 5, the summary's first rows
            study=rules.table5.output.csv,
        output:
            csv="results/ablations/summary.csv",
        log:
            "results/logs/ablations/summary.log",
        conda:
            "../../environment.yml"
        params:
            sources=[
                {"ablation": "study", "variant": None},
                *({"ablation": a.name, "variant": a.variant} for a in ABLATIONS),
            ],
        message:
            "every ablation's Table 5 beside the study's -> {output.csv}"
        script:
            "../scripts/ablations_summary.py"
