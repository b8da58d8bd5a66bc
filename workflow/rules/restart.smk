# The restart experiment (study §7.5, Fig. 14): on the kubernetes backend, delete the serving pod,
# re-apply it and record the event timeline (scheduled, pulling, pulled, started, ready).
# Other backends have no pods to restart, so their figures say that no records exist.


rule restart:
    input:
        manifest=restart_manifest,
        resolved=restart_resolved,
    output:
        record="results/restarts/{engine}/{restart}/restart.json",
    log:
        "results/logs/restarts/{engine}/{restart}.log",
    conda:
        "../../environment.yml"
    resources:
        **node_resources(lambda wildcards: restart_deployment(wildcards).id),
    params:
        deployment=restart_deployment_spec,
        backend=config["backend"],
        kubernetes=config.get("kubernetes", {}),
    message:
        "restart experiment: {wildcards.engine} {wildcards.restart}"
    script:
        "../scripts/restart.py"


rule restarts:
    input:
        records=restart_records(),
    log:
        "results/logs/restarts/all.log",
    conda:
        "../../environment.yml"
    shell:
        "echo 'restart records: {input.records}' > {log}"
