"""The campaign as a Job in the cluster: what `servelab campaign submit`, `status --cluster`,
`logs` and `fetch` do (docs/kubernetes.md, "The campaign as a Job").

`submit` validates the configuration the way the workflow will read it (config/config.yaml, then
each `--configfile` in order), renders the campaign's objects (servelab.deploy.job_manifests)
and applies them (servelab.deploy.kube_job), or prints them (`dry_run`: no cluster is contacted).
The Job's pod runs the workflow's own snakemake on the CPU node, on the campaign volume, with the
same configuration files; a replacement pod runs the same command on the same volume and resumes.

The other three read the Job from the workstation: its state and pods, its snakemake log, and a
copy of `results/` after which `servelab campaign status` (and every analysis) reads the copy.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import yaml

from servelab import __version__
from servelab.artifacts.provenance import git_commit
from servelab.deploy.job_manifests import CampaignSpec, config_file_keys, render_campaign
from servelab.grid.config import load_config
from servelab.grid.settings import CampaignSettings, KubernetesSettings

if TYPE_CHECKING:
    from servelab.deploy.kube_job import CampaignCluster, CampaignState

__all__ = [
    "BACKENDS_IN_A_JOB",
    "BASE_CONFIG",
    "campaign_cluster",
    "check_in_cluster_urls",
    "format_state",
    "render_submission",
    "settings_of",
    "submit",
]

# The configuration the Job's snakemake starts from: the image's, as the Snakefile names it.
BASE_CONFIG = "config/config.yaml"
# The backends a campaign Job can run: the GPU campaign, and the simulator (a rehearsal of the
# Job's mechanics on the cluster at no GPU cost). The local backend starts engines on the machine
# it runs on, which the image has none of.
BACKENDS_IN_A_JOB = ("kubernetes", "sim")


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_in_cluster_urls(config: dict[str, Any]) -> None:
    """Refuse a URL that points at the submitting machine: in the Job's pod, 127.0.0.1 is the pod
    (a port-forward on a workstation is what such a URL meant)."""
    settings = KubernetesSettings.from_section(config.get("kubernetes"))
    urls = {
        "kubernetes.engine_url": settings.engine_url_for("engine", 8000),
        "telemetry.prometheus_url": str((config.get("telemetry") or {}).get("prometheus_url", "")),
    }
    for key, url in urls.items():
        if config["backend"] == "kubernetes" and _is_loopback(url):
            raise ValueError(
                f"{key} {url!r} points at this machine; in the Job's pod it would be the pod "
                "itself. Use the in-cluster address (docs/kubernetes.md, 'The campaign as a Job')"
            )


def render_submission(
    configfiles: Sequence[str],
    targets: Sequence[str],
    *,
    image: str | None = None,
    cores: int | None = None,
) -> tuple[KubernetesSettings, dict[str, str]]:
    """The campaign's objects for these configuration files and targets: (the settings they
    give, {file name: YAML}). Raises ValueError on a configuration the Job cannot run."""
    config = load_config(BASE_CONFIG, configfiles)
    if config["backend"] not in BACKENDS_IN_A_JOB:
        raise ValueError(
            f"backend {config['backend']!r}: a campaign Job runs {' or '.join(BACKENDS_IN_A_JOB)}"
        )
    check_in_cluster_urls(config)
    settings = KubernetesSettings.from_section(config.get("kubernetes"))
    chosen = image or settings.campaign_job.image
    if not chosen:
        raise ValueError(
            "no image for the campaign Job: give --image or kubernetes.campaign_job.image "
            "(the repository's Dockerfile, pushed, pinned by digest)"
        )
    keys = config_file_keys(configfiles)
    spec = CampaignSpec(
        settings=settings,
        image=chosen,
        config_files={
            k: Path(p).read_text(encoding="utf-8") for k, p in zip(keys, configfiles, strict=True)
        },
        targets=tuple(targets),
        cores=cores or CampaignSettings.from_section(config["campaign"]).gpu_nodes,
        annotations={
            "servelab.dev/servelab-version": __version__,
            "servelab.dev/submitted-from-commit": git_commit(),
        },
    )
    return settings, render_campaign(spec)


def campaign_cluster(settings: KubernetesSettings, **kwargs: Any) -> CampaignCluster:
    """The campaign Job's cluster operations (servelab.deploy.kube_job.CampaignCluster),
    connected as the settings say (kubeconfig, context; else $KUBECONFIG or ~/.kube/config)."""
    from servelab.deploy.kube_cluster import make_api_client
    from servelab.deploy.kube_job import CampaignCluster

    return CampaignCluster(
        make_api_client(settings.kubeconfig, settings.context), settings, **kwargs
    )


def submit(
    configfiles: Sequence[str],
    targets: Sequence[str],
    *,
    image: str | None = None,
    cores: int | None = None,
    replace: bool = False,
    dry_run: bool = False,
) -> str:
    """Render and apply (or, with `dry_run`, only print) the campaign's objects; the text to show."""
    settings, rendered = render_submission(configfiles, targets, image=image, cores=cores)
    if dry_run:
        return "---\n".join(text.strip() + "\n" for text in rendered.values())
    objects = [yaml.safe_load(text) for text in rendered.values()]
    lines = campaign_cluster(settings).submit(objects, replace=replace)
    return "\n".join(lines) + "\n"


def settings_of(configfiles: Sequence[str], base: str = BASE_CONFIG) -> KubernetesSettings:
    """The `kubernetes:` settings of a configuration (where the Job is, how to connect)."""
    return KubernetesSettings.from_section(load_config(base, configfiles).get("kubernetes"))


def _when(value: str | None) -> str:
    return "" if not value else str(value).replace("+00:00", "Z")


def format_state(state: CampaignState) -> str:
    """The campaign Job's state for people."""
    head = f"campaign Job {state.name} (namespace {state.namespace}): {state.phase}"
    if state.phase == "not submitted":
        return head + "\n  servelab campaign submit starts it (docs/kubernetes.md)\n"
    lines = [head + (f" ({state.reason}: {state.message})" if state.reason else "")]
    lines.append(f"  targets: {state.targets}")
    lines.append(f"  image: {state.image}")
    lines.append(
        f"  started {_when(state.started)}"
        + (f", completed {_when(state.completed)}" if state.completed else "")
        + f"; pods failed {state.failed} of backoff limit {state.backoff_limit} "
        "(disruptions do not count)"
    )
    lines.append(f"  pods ({len(state.pods)}, oldest first):")
    for pod in state.pods:
        detail = [pod.phase + (" (deleting)" if pod.deleting else "")]
        if pod.node:
            detail.append(f"node {pod.node}")
        if pod.started:
            detail.append(f"started {_when(pod.started)}")
        if pod.exit_code is not None:
            detail.append(f"exit {pod.exit_code}")
        if pod.reason:
            detail.append(pod.reason)
        lines.append(f"    {pod.name}  " + ", ".join(detail))
    lines.append("  every run's state: servelab campaign fetch, then servelab campaign status")
    return "\n".join(lines) + "\n"
