# Render each deployment's manifests, bring the engine up and confirm, from its own start-up log,
# the configuration it actually resolved. A deployment that resolved otherwise than its arm
# expects fails here, quoting the log line, and none of its runs is measured.


rule render_manifests:
    output:
        manifest="manifests/rendered/{deployment}.yaml",
    log:
        "results/logs/deployments/{deployment}.render.log",
    conda:
        "../../environment.yml"
    params:
        deployment=deployment_spec,
        namespace=config.get("kubernetes", {}).get("namespace", "servelab"),
        kubernetes=config.get("kubernetes", {}),
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
        gpu_slots=1,
    params:
        deployment=deployment_spec,
        backend=config["backend"],
        gpu=config["gpu"],
        model=config["model"],
        kubernetes=config.get("kubernetes", {}),
    message:
        "deploy {wildcards.deployment} and confirm its resolved configuration"
    script:
        "../scripts/deploy.py"
