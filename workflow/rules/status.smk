# The state of every run of the grid (done, failed, discarded, missing) with its attempts, node
# and wall time, read from the artifacts only: it plans no deploy, run or telemetry job, so it is
# safe to ask for during a campaign and after it. See docs/campaigns.md.

from servelab.campaign.status import artifacts_fingerprint


rule campaign_status:
    output:
        csv="results/campaign_status.csv",
    log:
        "results/logs/status/campaign_status.log",
    localrule: True
    conda:
        "../../environment.yml"
    params:
        # a digest of the artifacts the status reads: the CSV is rebuilt when they changed
        # (of the folder its output is in: results/, or an ablation's; a function of wildcards
        # alone, so that a change is seen when the DAG is built)
        artifacts=lambda wildcards: artifacts_fingerprint(
            Path(rules.campaign_status.output.csv).parent
        ),
    message:
        "write results/campaign_status.csv"
    script:
        "../scripts/campaign_status.py"
