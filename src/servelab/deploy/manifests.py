"""Render the Kubernetes objects of one engine deployment from the package's jinja2 templates.

One deployment (arm, engine, flags) becomes five objects, one YAML file each:

- `persistentvolumeclaim.yaml`: the model-weight volume (60 Gi by default), mounted as the Hugging
  Face cache and shared by every deployment of the campaign (created once, never replaced);
- `deployment.yaml`: one replica of the engine's published image (pinned by digest) on the GPU
  node: node selector, toleration of the `nvidia.com/gpu` taint, one `nvidia.com/gpu`, the flags
  of the deployment, the Hugging Face token only through `env.valueFrom.secretKeyRef`, a readiness
  probe on `/health` (60 s initial delay, 10 s period), Prometheus scrape annotations, and for
  SGLang a memory-backed `/dev/shm`;
- `service.yaml`: a ClusterIP Service in front of it (the dispatcher's target);
- `podmonitor.yaml`: a PodMonitor so kube-prometheus-stack scrapes `/metrics` every 5 s;
- `podmonitor-dcgm.yaml`: a PodMonitor for the GPU's DCGM exporter (GKE's managed one by default,
  `kubernetes.dcgm_exporter`), labelling each series with the node its exporter runs on, so a run's
  GPU energy and power series can be selected (left out with `dcgm_exporter.enabled: false`). One
  object, `servelab-dcgm-exporter`, shared by every deployment (like the volume).

Rendering is pure: the same inputs give byte-identical text, and nothing is read from the
environment (in particular no secret value: the token is referenced by Secret name and key only).
Settings come from the config's `kubernetes:` section; `resolve_settings` fills in DEFAULTS.

The templates are package data, `servelab/deploy/templates/*.yaml.j2`, found through the import
system (`templates_dir`). Each object has a common template, `<object>.yaml.j2`; an engine that
needs more has its own `<object>.<engine>.yaml.j2`, which extends the common one (SGLang's
deployment adds /dev/shm). `template_files(engine)` lists every file a deployment of that engine
is rendered from: the workflow's render rule declares them as inputs, so editing one re-renders
exactly the deployments that use it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any, cast

import jinja2
import jinja2.meta
import yaml

from servelab.artifacts import write_text
from servelab.engines.registry import EngineView, engine_names, product_of
from servelab.grid.settings import KubernetesSettings, SettingsError

__all__ = [
    "DCGM_MONITOR_NAME",
    "DEFAULTS",
    "ENGINE_COMMANDS",
    "MANIFEST_FILES",
    "ManifestError",
    "deployment_templates",
    "labels_for",
    "load_rendered",
    "pinned_by_digest",
    "render_deployment",
    "render_for",
    "resolve_settings",
    "template_environment",
    "template_files",
    "templates_dir",
    "write_rendered",
]

# File name -> common template, in the order the objects are applied (the volume before its user).
MANIFEST_FILES = {
    "persistentvolumeclaim.yaml": "persistentvolumeclaim.yaml.j2",
    "service.yaml": "service.yaml.j2",
    "deployment.yaml": "deployment.yaml.j2",
    "podmonitor.yaml": "podmonitor.yaml.j2",
    "podmonitor-dcgm.yaml": "podmonitor-dcgm.yaml.j2",
}
# The DCGM exporter's PodMonitor: one per namespace, whichever deployment applied it last.
DCGM_MONITOR_NAME = "servelab-dcgm-exporter"

# How each published image starts its OpenAI-compatible server (the engine registry's
# `EngineSpec.entrypoint`). The flags of the deployment follow `--host=0.0.0.0 --port=<port>`.
ENGINE_COMMANDS: EngineView[tuple[str, ...]] = EngineView(lambda spec: spec.entrypoint)

# The config's `kubernetes:` section with every key at its default: the defaults themselves are
# servelab.grid.settings.KubernetesSettings's (config/config.yaml repeats them; a test checks that the
# two agree). See docs/kubernetes.md for what each key does.
DEFAULTS: dict[str, Any] = KubernetesSettings().as_dict()

# A DNS-1035 label: Service names must match it, and we use one name for every object.
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
# Strings that look like a credential must never reach a manifest (flags end up in it verbatim).
_TOKEN_VALUE = re.compile(r"hf_[A-Za-z0-9]{20,}")
_SECRET_FLAG_WORDS = {"token", "secret", "password", "passwd", "credential", "credentials"}


class ManifestError(ValueError):
    """Bad input to rendering; the message names the key or value."""


def resolve_settings(k8s_settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """`k8s_settings` (the config's `kubernetes:` section, possibly partial) over DEFAULTS.

    Merged as servelab.grid.settings.KubernetesSettings merges: nested sections key by key, while
    `node_selector`, `resources`, `metrics_selector` and `pod_monitor.labels` replace the default
    as a whole (so a selector can drop the accelerator label). Unknown keys are an error naming
    them (the config schema says the same at load time).
    """
    try:
        return KubernetesSettings.from_section(k8s_settings).as_dict()
    except SettingsError as exc:
        raise ManifestError(str(exc)) from exc


def templates_dir() -> Path:
    """The folder of the imported servelab's templates (editable install: the source tree).

    Through the import system, not a path relative to this file: whichever servelab Python
    imports (site-packages, an editable install, a PYTHONPATH copy) renders with its own templates.
    """
    folder = files("servelab.deploy") / "templates"
    if not isinstance(folder, Path) or not folder.is_dir():
        # A zipped install: the workflow needs the templates as files (they are rule inputs).
        raise ManifestError(f"servelab.deploy has no templates folder on disk ({folder})")
    return folder


def deployment_templates(engine: str, templates: Path | None = None) -> dict[str, str]:
    """File name -> the template it is rendered from for `engine`, in MANIFEST_FILES order: the
    engine's own `<object>.<engine>.yaml.j2` where the folder has one, else its product's (every
    SGLang release family shares `deployment.sglang.yaml.j2`), else the common one."""
    folder = templates_dir() if templates is None else Path(templates)
    names = [engine]
    if engine in engine_names() and product_of(engine) != engine:
        names.append(product_of(engine))
    chosen = {}
    for file_name, common in MANIFEST_FILES.items():
        stem = file_name.removesuffix(".yaml")
        own = [
            f"{stem}.{name}.yaml.j2"
            for name in names
            if (folder / f"{stem}.{name}.yaml.j2").is_file()
        ]
        chosen[file_name] = own[0] if own else common
    return chosen


def template_files(engine: str, templates: Path | None = None) -> list[Path]:
    """Every template file a deployment of `engine` is rendered from, sorted: the chosen ones and
    each template they extend or include (found by parsing them, so a new `{% extends %}` or
    `{% include %}` is followed without a list to keep up to date)."""
    folder = templates_dir() if templates is None else Path(templates)
    env = _environment(str(folder))
    pending = list(deployment_templates(engine, folder).values())
    seen: set[str] = set()
    while pending:  # ends: each name is parsed once, and the folder holds finitely many
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            source = (folder / name).read_text(encoding="utf-8")
        except OSError as exc:
            raise ManifestError(f"template {name!r} not found under {folder}") from exc
        for referenced in jinja2.meta.find_referenced_templates(env.parse(source, name)):
            if referenced is None:
                raise ManifestError(
                    f"template {name!r} names a template only known at render time: "
                    "the render rule could not declare it as an input"
                )
            pending.append(referenced)
    return sorted(folder / name for name in seen)


def _q(value: Any) -> str:
    """A YAML scalar for any string: JSON's double-quoted form is valid YAML."""
    return json.dumps(str(value), ensure_ascii=False)


def _to_yaml(value: Any, indent: int) -> str:
    """A block-style YAML mapping/sequence, keys sorted, indented for inclusion after a key."""
    text = yaml.safe_dump(
        value, sort_keys=True, default_flow_style=False, allow_unicode=True, width=1000
    ).rstrip("\n")
    pad = " " * indent
    return "\n".join(pad + line for line in text.splitlines())


def pinned_by_digest(image: object) -> bool:
    """True for `name[:tag]@sha256:<64 hex>`: an image whose bytes the reference fixes."""
    return isinstance(image, str) and bool(_DIGEST.match(image))


def template_environment(folder: Path) -> jinja2.Environment:
    """The jinja2 environment every servelab template renders in (strict undefined, `q` and
    `to_yaml` filters), loading from `folder`; one per folder."""
    return _environment(str(folder))


@cache
def _environment(templates_dir: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = _q
    env.filters["to_yaml"] = _to_yaml
    return env


def labels_for(
    *, deployment_id: str | None, engine: str | None, image: str | None, settings: Mapping[str, Any]
) -> dict[str, str]:
    """app.kubernetes.io/* labels plus the servelab run and deployment labels."""
    labels = {
        "app.kubernetes.io/part-of": "servelab",
        "app.kubernetes.io/managed-by": "servelab",
        "servelab.dev/run": str(settings["run_label"]),
    }
    if engine is not None:
        labels["app.kubernetes.io/name"] = engine
        labels["app.kubernetes.io/component"] = "engine"
    else:
        labels["app.kubernetes.io/component"] = "model-cache"
    if deployment_id is not None:
        labels["app.kubernetes.io/instance"] = deployment_id
        labels["servelab.dev/deployment"] = deployment_id
    if image is not None:
        # The tag (v0.6.3, v0.4.1-cu121) is the version the image was published as.
        tag = image.split("@", 1)[0].rpartition("/")[2].partition(":")[2]
        if tag:
            labels["app.kubernetes.io/version"] = tag
    for key, value in labels.items():
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ManifestError(f"label {key}: {value!r} is not a valid Kubernetes label value")
    return labels


def _check_inputs(
    deployment_id: str, engine: str, image: str, port: int, flags: Sequence[str], namespace: str
) -> None:
    if (
        not isinstance(deployment_id, str)
        or len(deployment_id) > 63
        or not _NAME.match(deployment_id)
    ):
        raise ManifestError(
            f"deployment_id {deployment_id!r}: must be a DNS-1035 label (lower-case letters, digits "
            "and '-', starting with a letter, at most 63 characters): it names the Kubernetes objects"
        )
    if engine not in ENGINE_COMMANDS:
        raise ManifestError(f"engine {engine!r}: expected one of {', '.join(ENGINE_COMMANDS)}")
    if not pinned_by_digest(image):
        raise ManifestError(
            f"image {image!r}: must be pinned by digest (name[:tag]@sha256:<64 hex>)"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ManifestError(f"port {port!r}: expected an integer in 1..65535")
    if not isinstance(namespace, str) or len(namespace) > 63 or not _NAME.match(namespace):
        raise ManifestError(f"namespace {namespace!r}: must be a DNS label")
    if isinstance(flags, str):
        raise ManifestError("flags: expected a list of strings, got one string")
    for i, flag in enumerate(flags):
        if not isinstance(flag, str) or not flag.startswith("--"):
            raise ManifestError(f"flags[{i}] {flag!r}: expected a string starting with '--'")
        words = set(flag.split("=", 1)[0].lstrip("-").split("-"))
        if _TOKEN_VALUE.search(flag) or words & _SECRET_FLAG_WORDS or {"api", "key"} <= words:
            raise ManifestError(
                f"flags[{i}]: looks like a credential; pass secrets through the "
                "kubernetes.hf_token_secret Secret, never as a flag (value not shown)"
            )
        if flag.split("=", 1)[0] in ("--host", "--port"):
            raise ManifestError(f"flags[{i}] {flag!r}: host and port are set by the manifest")


def render_deployment(
    *,
    deployment_id: str,
    engine: str,
    image: str,
    port: int,
    flags: Sequence[str],
    namespace: str,
    k8s_settings: Mapping[str, Any],
    templates: str | os.PathLike[str] | None = None,
) -> dict[str, str]:
    """Render one deployment's objects; returns {file name: YAML text} in MANIFEST_FILES order
    (without `podmonitor-dcgm.yaml` when `kubernetes.dcgm_exporter.enabled` is false).

    `templates`: the folder to render from (default: the package's, `templates_dir()`).

    Deterministic: equal inputs give equal text. Every returned text is checked to parse as one
    YAML mapping of the expected kind.
    """
    _check_inputs(deployment_id, engine, image, port, flags, namespace)
    s = resolve_settings(k8s_settings)
    folder = templates_dir() if templates is None else Path(templates)
    env = _environment(str(folder))
    engine_labels = labels_for(deployment_id=deployment_id, engine=engine, image=image, settings=s)
    context = {
        "deployment_id": deployment_id,
        "name": deployment_id,
        "engine": engine,
        "image": image,
        "port": port,
        "namespace": namespace,
        "command": list(ENGINE_COMMANDS[engine]),
        "args": ["--host=0.0.0.0", f"--port={port}", *flags],
        "labels": engine_labels,
        "selector": {
            "app.kubernetes.io/instance": deployment_id,
            "servelab.dev/deployment": deployment_id,
        },
        "volume_labels": labels_for(deployment_id=None, engine=None, image=None, settings=s),
        "monitor_labels": {**engine_labels, **s["pod_monitor"]["labels"]},
        "dcgm_name": DCGM_MONITOR_NAME,
        "dcgm_monitor_labels": {
            **labels_for(deployment_id=None, engine=None, image=None, settings=s),
            "app.kubernetes.io/component": "gpu-metrics",
            **s["pod_monitor"]["labels"],
        },
        # Quantities as strings: the API's int-or-string, and the client's models want str.
        "requests": {str(k): str(v) for k, v in s["resources"].items()},
        "s": s,
    }
    out: dict[str, str] = {}
    for file_name, template in deployment_templates(engine, folder).items():
        if file_name == "podmonitor-dcgm.yaml" and not s["dcgm_exporter"]["enabled"]:
            continue
        try:
            text = env.get_template(template).render(**context)
        except jinja2.TemplateNotFound as exc:
            raise ManifestError(
                f"template {exc.name!r} not found under "
                f"{cast(jinja2.FileSystemLoader, env.loader).searchpath}"
            ) from exc
        _check_document(text, file_name)
        out[file_name] = text
    return out


_KINDS = {
    "persistentvolumeclaim.yaml": "PersistentVolumeClaim",
    "service.yaml": "Service",
    "deployment.yaml": "Deployment",
    "podmonitor.yaml": "PodMonitor",
    "podmonitor-dcgm.yaml": "PodMonitor",
}


def _check_document(text: str, file_name: str) -> None:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"rendered {file_name} is not valid YAML: {exc}") from exc
    if len(docs) != 1 or not isinstance(docs[0], dict) or docs[0].get("kind") != _KINDS[file_name]:
        raise ManifestError(f"rendered {file_name}: expected one {_KINDS[file_name]} object")


def render_for(config: Mapping[str, Any], deployment: Any) -> dict[str, str]:
    """Render a `servelab.grid.config.Deployment` with the engine image/port and settings of `config`."""
    engine_spec = config["engines"][deployment.engine]
    settings = resolve_settings(config.get("kubernetes"))
    return render_deployment(
        deployment_id=deployment.id,
        engine=deployment.engine,
        image=engine_spec["image"],
        port=int(engine_spec["port"]),
        flags=list(deployment.flags),
        namespace=settings["namespace"],
        k8s_settings=settings,
    )


def write_rendered(rendered: Mapping[str, str], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write each file atomically under `out_dir`; stale *.yaml files there are removed.

    Returns the written paths in application order.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in rendered:
        if "/" in name or name.startswith(".") or not name.endswith(".yaml"):
            raise ManifestError(f"rendered file name {name!r}: expected a plain *.yaml name")
    written = []
    for name, text in rendered.items():
        write_text(out / name, text)
        written.append(out / name)
    for stale in sorted(out.glob("*.yaml")):
        if stale.name not in rendered:
            stale.unlink()
    return written


def load_rendered(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The objects of a rendered deployment, in the order to apply them (volume, Service,
    Deployment, PodMonitor, then anything else): from a directory of *.yaml files or from one
    multi-document YAML file. Errors name the file."""
    path = Path(path)
    if path.is_dir():
        order = {name: i for i, name in enumerate(MANIFEST_FILES)}
        files = sorted(path.glob("*.yaml"), key=lambda p: (order.get(p.name, len(order)), p.name))
    elif path.is_file():
        files = [path]
    else:
        raise ManifestError(f"{path}: no rendered manifests (neither a directory nor a file)")
    objects: list[dict[str, Any]] = []
    for file in files:
        try:
            docs = list(yaml.safe_load_all(file.read_text(encoding="utf-8")))
        except (OSError, yaml.YAMLError) as exc:
            raise ManifestError(f"{file}: cannot read rendered manifest ({exc})") from exc
        for doc in docs:
            if doc is None:
                continue
            if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= set(doc):
                raise ManifestError(f"{file}: a document is not a Kubernetes object")
            objects.append(doc)
    if not objects:
        raise ManifestError(f"{path}: no Kubernetes objects found")
    # Apply order by kind (a multi-document file may list them in any order); stable otherwise.
    rank = {kind: i for i, kind in enumerate(_KINDS.values())}
    return sorted(objects, key=lambda o: rank.get(o["kind"], len(rank)))
