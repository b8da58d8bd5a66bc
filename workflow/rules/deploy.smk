# Render each deployment's manifests, bring the engine up and confirm, from its own start-up log,
# the configuration it actually resolved. A deployment that resolved otherwise than its arm
# expects fails here, quoting the log line, and none of its runs is measured.


rule render_manifests:
    input:
        templates=manifest_templates,
    output:
        manifest="results/manifests/{deployment}.yaml",
    log:
        "results/logs/deployments/{deployment}.render.log",
    conda:
        "../../environment.yml"
    params:
        deployment=deployment_spec,
        # Only the kubernetes settings written into a manifest (servelab.grid.identity): a timeout or
        # the kubeconfig re-renders nothing.
        kubernetes=identity.manifest_settings(config),
    script:
        "../scripts/render_manifests.py"


rule deploy:
    input:
        manifest=rules.render_manifests.output.manifest,
    output:
        startup_log="results/deployments/{deployment}/startup.log",
        resolved="results/deployments/{deployment}/resolved.json",
    log:
        "results/logs/deployments/{deployment}.deploy.log",
    conda:
        "../../environment.yml"
    resources:
        **node_resources(deployment_wildcard),
    params:
        # What defines the deployment (servelab.grid.identity); the cluster's whereabouts and the
        # waits are operational, read when the job runs.
        identity=deployment_identity,
    message:
        "deploy {wildcards.deployment} and confirm its resolved configuration"
    script:
        "../scripts/deploy.py"
