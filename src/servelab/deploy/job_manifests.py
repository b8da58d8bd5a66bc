"""Render the Kubernetes objects of the campaign as a Job (docs/kubernetes.md, "The campaign as a
Job") from the package's templates, `servelab/deploy/templates/campaign/*.yaml.j2`.

One campaign becomes eight objects, one YAML file each, in the order they are applied:

- `serviceaccount.yaml`, `clusterrole.yaml`, `clusterrolebinding.yaml`, `role.yaml`,
  `rolebinding.yaml`: the Job's identity, allowed exactly what the kubernetes backend calls
  (the rules are written in the templates; tests/unit/test_campaign_rbac.py derives them from
  servelab's code and compares, both ways). Nodes are cluster-scoped, hence the ClusterRole;
- `persistentvolumeclaim.yaml`: the campaign volume, holding `results/` and `.snakemake/`;
- `configmap.yaml`: the configuration files the campaign was submitted with, as given, then the
  in-cluster overlay (`IN_CLUSTER_OVERLAY`: connect with the pod's ServiceAccount);
- `job.yaml`: the workflow's own `snakemake` with the local executor, one pod on the CPU node,
  replaced when lost (a disruption never counts against `backoff_limit`) and only once the old
  pod has terminated (`podReplacementPolicy: Failed`), so two snakemakes never share `results/`.

`render_fetch_pod` renders the helper pod `servelab campaign fetch` copies `results/` out of.

Rendering is pure and deterministic, as for the engine's objects (servelab.deploy.manifests):
the same inputs give byte-identical text, and nothing comes from the environment. The Job names
no secret: the engines read the Hugging Face token from their Secret, and the driver needs none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from servelab.deploy.manifests import (
    ManifestError,
    pinned_by_digest,
    template_environment,
    templates_dir,
)
from servelab.grid.settings import CampaignJobSettings, KubernetesSettings

__all__ = [
    "CAMPAIGN_FILES",
    "CAMPAIGN_LABEL",
    "CHECKOUT",
    "CONFIG_DIR",
    "CONTAINER",
    "FETCH_LABEL",
    "IN_CLUSTER_OVERLAY",
    "TARGETS_ANNOTATION",
    "UID",
    "WORK_DIR",
    "CampaignSpec",
    "cluster_role_name",
    "config_file_keys",
    "fetch_pod_name",
    "render_campaign",
    "render_fetch_pod",
    "snakemake_args",
]

# File name -> template, in the order the objects are applied (identity and rights before the
# Job that uses them, the volume and the configuration before the pod that mounts them).
CAMPAIGN_FILES = {
    "serviceaccount.yaml": "campaign/serviceaccount.yaml.j2",
    "clusterrole.yaml": "campaign/clusterrole.yaml.j2",
    "clusterrolebinding.yaml": "campaign/clusterrolebinding.yaml.j2",
    "role.yaml": "campaign/role.yaml.j2",
    "rolebinding.yaml": "campaign/rolebinding.yaml.j2",
    "persistentvolumeclaim.yaml": "campaign/persistentvolumeclaim.yaml.j2",
    "configmap.yaml": "campaign/configmap.yaml.j2",
    "job.yaml": "campaign/job.yaml.j2",
}
_KINDS = {
    "serviceaccount.yaml": "ServiceAccount",
    "clusterrole.yaml": "ClusterRole",
    "clusterrolebinding.yaml": "ClusterRoleBinding",
    "role.yaml": "Role",
    "rolebinding.yaml": "RoleBinding",
    "persistentvolumeclaim.yaml": "PersistentVolumeClaim",
    "configmap.yaml": "ConfigMap",
    "job.yaml": "Job",
    "fetch-pod.yaml": "Pod",
}

# What the image (the repository's Dockerfile) provides: the checkout the workflow runs from,
# whose `results` and `.snakemake` are links into WORK_DIR, where the campaign volume is mounted;
# the user it runs as.
CHECKOUT = "/opt/servelab"
WORK_DIR = "/work"
UID = 10001
CONFIG_DIR = "/etc/servelab/config"
CONTAINER = "snakemake"
# The pod label that finds the campaign's pods (and only them: the helper has FETCH_LABEL).
CAMPAIGN_LABEL = "servelab.dev/campaign"
FETCH_LABEL = "servelab.dev/campaign-fetch"
# On the Job: what its snakemake makes (`servelab campaign status --cluster` shows it).
TARGETS_ANNOTATION = "servelab.dev/targets"
# Merged last: in the pod, connect with its ServiceAccount (a workstation's kubeconfig path or
# context means nothing there).
IN_CLUSTER_OVERLAY = (
    "zz-in-cluster.yaml",
    "# servelab campaign submit: in the Job's pod, connect with its ServiceAccount.\n"
    "kubernetes:\n  kubeconfig: null\n  context: null\n",
)
_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class CampaignSpec:
    """What one submission renders: the settings (`kubernetes:`, its `campaign_job`), the image,
    the configuration files by ConfigMap key (`config_file_keys`), the workflow's targets (none:
    its default target), the cores snakemake may use, and annotations recorded on the Job (where
    the submission came from: servelab version, commit)."""

    settings: KubernetesSettings
    image: str
    config_files: Mapping[str, str]
    targets: tuple[str, ...] = ()
    cores: int = 1
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def job(self) -> CampaignJobSettings:
        return self.settings.campaign_job


def cluster_role_name(settings: KubernetesSettings) -> str:
    """The ClusterRole's (and its binding's) name: cluster-wide, so the namespace is in it."""
    return f"{settings.campaign_job.name}-{settings.namespace}"


def fetch_pod_name(settings: KubernetesSettings) -> str:
    return f"{settings.campaign_job.name}-fetch"


def config_file_keys(paths: Sequence[str]) -> list[str]:
    """The ConfigMap key of each configuration file, in the order snakemake merges them:
    `01-<file name>`, `02-...`; the in-cluster overlay sorts after them all."""
    keys = [f"{i:02d}-{Path(p).name}" for i, p in enumerate(paths, 1)]
    for key in keys:
        if not _CONFIG_KEY.match(key):
            raise ManifestError(f"configuration file {key[3:]!r}: its name is not a ConfigMap key")
    return keys


def snakemake_args(config_keys: Sequence[str], targets: Sequence[str], cores: int) -> list[str]:
    """The Job's snakemake arguments: the cores, every configuration file (the submitted ones,
    then the in-cluster overlay), `--`, the targets. The profile (profiles/default in the
    checkout) adds rerun-incomplete, keep-going and nolock."""
    files = [f"{CONFIG_DIR}/{key}" for key in (*config_keys, IN_CLUSTER_OVERLAY[0])]
    return ["--cores", str(cores), "--configfile", *files, "--", *targets]


def _labels(name: str, run_label: str, component: str) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/part-of": "servelab",
        "app.kubernetes.io/managed-by": "servelab",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/instance": name,
        "servelab.dev/run": run_label,
    }
    for key, value in labels.items():
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ManifestError(f"label {key}: {value!r} is not a valid Kubernetes label value")
    return labels


def _check(spec: CampaignSpec) -> None:
    if not pinned_by_digest(spec.image):
        raise ManifestError(
            f"campaign image {spec.image!r}: must be pinned by digest (name[:tag]@sha256:<64 hex>)"
        )
    if isinstance(spec.cores, bool) or not isinstance(spec.cores, int) or spec.cores < 1:
        raise ManifestError(f"cores {spec.cores!r}: expected an integer >= 1")
    for target in spec.targets:
        if not target or target.startswith("-") or any(c.isspace() for c in target):
            raise ManifestError(f"target {target!r}: expected a workflow target (a file or rule)")
    for key in spec.config_files:
        if not _CONFIG_KEY.match(key) or key == IN_CLUSTER_OVERLAY[0]:
            raise ManifestError(f"configuration key {key!r}: not a ConfigMap key of its own")


def _context(spec: CampaignSpec) -> dict[str, Any]:
    s, job = spec.settings, spec.job
    labels = _labels(job.name, s.run_label, "campaign")
    return {
        "name": job.name,
        "cluster_name": cluster_role_name(s),
        "namespace": s.namespace,
        "job": job,
        "image": spec.image,
        "labels": labels,
        "pod_labels": {**labels, CAMPAIGN_LABEL: job.name},
        "annotations": {
            TARGETS_ANNOTATION: " ".join(spec.targets) or "(the workflow's default target)",
            **spec.annotations,
        },
        "config_files": {**spec.config_files, IN_CLUSTER_OVERLAY[0]: IN_CLUSTER_OVERLAY[1]},
        "args": snakemake_args(list(spec.config_files), spec.targets, spec.cores),
        "init_command": ["mkdir", "-p", f"{WORK_DIR}/results", f"{WORK_DIR}/.snakemake"],
        "container": CONTAINER,
        "container_security": _CONTAINER_SECURITY,
        "checkout": CHECKOUT,
        "work_dir": WORK_DIR,
        "config_dir": CONFIG_DIR,
        "uid": UID,
        "requests": {str(k): str(v) for k, v in job.resources.items()},
    }


def _render(
    env: jinja2.Environment, template: str, file_name: str, context: Mapping[str, Any]
) -> str:
    try:
        text = env.get_template(template).render(**context)
    except jinja2.TemplateNotFound as exc:
        raise ManifestError(f"template {exc.name!r} not found under {templates_dir()}") from exc
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if len(docs) != 1 or not isinstance(docs[0], dict) or docs[0].get("kind") != _KINDS[file_name]:
        raise ManifestError(f"rendered {file_name}: expected one {_KINDS[file_name]} object")
    return text


def render_campaign(spec: CampaignSpec) -> dict[str, str]:
    """The campaign's objects: {file name: YAML text} in CAMPAIGN_FILES (apply) order."""
    _check(spec)
    env = template_environment(templates_dir())
    context = _context(spec)
    return {
        name: _render(env, template, name, context) for name, template in CAMPAIGN_FILES.items()
    }


def render_fetch_pod(
    settings: KubernetesSettings, image: str, *, node_name: str | None = None
) -> str:
    """The helper pod of `servelab campaign fetch`: the campaign volume read-only, a command
    that only waits (`campaign_job.fetch_timeout_s`, also its deadline), on `node_name` when the
    campaign's pod runs there (a ReadWriteOnce volume is attached to one node), else on the
    CPU pool."""
    if not pinned_by_digest(image):
        raise ManifestError(f"campaign image {image!r}: must be pinned by digest")
    job = settings.campaign_job
    context = {
        "fetch_name": fetch_pod_name(settings),
        "namespace": settings.namespace,
        "job": job,
        "image": image,
        "node_name": node_name,
        "deadline_s": max(1, int(job.fetch_timeout_s)),
        "fetch_labels": {
            **_labels(job.name, settings.run_label, "campaign-fetch"),
            FETCH_LABEL: job.name,
        },
        "container_security": _CONTAINER_SECURITY,
        "work_dir": WORK_DIR,
        "uid": UID,
    }
    env = template_environment(templates_dir())
    return _render(env, "campaign/fetch-pod.yaml.j2", "fetch-pod.yaml", context)
