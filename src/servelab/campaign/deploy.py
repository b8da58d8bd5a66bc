"""Deploy and gate (study §5.4): render a deployment's manifests, bring its engine up through its
backend, parse the start-up log the backend returns with the one parser and refuse a configuration
the arm does not expect. `gate` is the only resolved-configuration gate: this module applies it to
every deployment, and hands it to the backends that must confirm an engine they bring up again by
themselves (servelab.campaign.blocks: a pod the kubernetes backend finds recreated). `resolved.json`
exists only if the gate passed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servelab.artifacts import (
    next_generation_dir,
    write_json,
    write_text,
)
from servelab.deploy import Backend, Deployed, NodeSlot, get_backend
from servelab.deploy.manifests import render_deployment
from servelab.engines import check_resolved, kv_capacity_tokens, parse_startup_log
from servelab.grid.config import gpu_nodes, node_slot

__all__ = [
    "backend_deployment",
    "backend_for",
    "confirm",
    "deploy",
    "gate",
    "node_for",
    "render_manifests",
]

log = logging.getLogger(__name__)


def render_manifests(
    *,
    deployment: Mapping[str, Any],
    namespace: str,
    kubernetes: Mapping[str, Any],
    manifest_path: str,
) -> None:
    """Render the deployment's Kubernetes objects (for every backend: shows what would be deployed).
    An engine with no image (one the local backend builds) has nothing to deploy: the file says so."""
    if deployment.get("image") is None:
        write_text(
            manifest_path,
            f"# engines.{deployment['engine']} has no image pinned by digest: this deployment runs "
            "on the local backend only, so there are no Kubernetes objects to render.\n",
        )
        return
    rendered = render_deployment(
        deployment_id=deployment["deployment_id"],
        engine=deployment["engine"],
        image=deployment["image"],
        port=deployment["port"],
        flags=list(deployment["flags"]),
        namespace=namespace,
        k8s_settings=kubernetes,
    )
    documents = [rendered[name].strip() + "\n" for name in sorted(rendered)]
    write_text(manifest_path, "---\n".join(documents))


def backend_deployment(identity: Mapping[str, Any]) -> dict[str, Any]:
    """A deployment's identity (servelab.grid.identity.deployment_identity) as a backend is given
    it: everything but where it runs (backend, GPU, model)."""
    return {k: v for k, v in identity.items() if k not in ("backend", "gpu", "model")}


def node_for(config: Mapping[str, Any], deployment_id: str) -> NodeSlot:
    """The GPU node slot a deployment is pinned to (servelab.grid.config.node_slot), of
    `campaign.gpu_nodes`: read from the workflow's config when a job runs (operational)."""
    return NodeSlot(node_slot(config, deployment_id), gpu_nodes(config))


def backend_for(
    identity: Mapping[str, Any], kubernetes: Mapping[str, Any], node: NodeSlot | None = None
) -> Backend:
    """The backend a deployment's identity names, from the registry, for its GPU and model, on
    GPU node slot `node` (default: the one node)."""
    return get_backend(
        str(identity["backend"]),
        gpu=dict(identity["gpu"]),
        model=dict(identity["model"]),
        kubernetes=kubernetes,
        node=node,
    )


def gate(deployment: Mapping[str, Any], startup_log: str) -> dict[str, Any]:
    """The resolved-configuration gate (a servelab.deploy.Gate): the configuration the start-up
    log shows, read by the one parser; raises ResolvedConfigMismatch, quoting the log line, when
    it is not the chunked-prefill setting (and chunk size) the deployment's arm expects, or, when
    the arm expects them, not its schedule policy or KV capacity. A deployment that expects a KV
    capacity has the one the log shows as `kv_capacity_tokens` in the returned configuration."""
    parsed = parse_startup_log(startup_log, engine=deployment["engine"])
    expected_kv = deployment.get("expect_kv_capacity_tokens")
    check_resolved(
        parsed,
        expect_chunked_prefill=deployment["expect_chunked_prefill"],
        expect_chunk_size=deployment["expect_chunk_size"],
        expect_schedule_policy=deployment.get("expect_schedule_policy"),
        expect_kv_capacity_tokens=expected_kv,
        kv_capacity_tolerance=float(deployment.get("expect_kv_capacity_tolerance") or 0.0),
    )
    resolved = dict(json.loads(parsed.to_json()))
    if expected_kv is not None:
        found = kv_capacity_tokens(parsed)
        assert found is not None  # check_resolved refused a log that shows none
        resolved["kv_capacity_tokens"] = found[0]
    return resolved


def confirm(deployment: Mapping[str, Any], deployed: Deployed) -> dict[str, Any]:
    """Gate the start-up log a backend's `deploy` returned and report the verdict to the backend
    (`Deployed.on_gate`: None when it passed, else the refusal, which is then raised). Returns
    the configuration the log shows."""
    try:
        resolved = gate(deployment, deployed.startup_log)
    except Exception as exc:
        if deployed.on_gate is not None:
            deployed.on_gate(exc)
        raise
    if deployed.on_gate is not None:
        deployed.on_gate(None)
    return resolved


def deploy(
    *,
    identity: Mapping[str, Any],
    kubernetes: Mapping[str, Any],
    manifest_path: str,
    startup_log_path: str,
    resolved_path: str,
    node: NodeSlot | None = None,
) -> dict[str, Any]:
    """Bring the engine up on GPU node slot `node`, gate its start-up log and refuse a
    configuration the arm does not expect.

    `identity` is the deployment's identity whole (servelab.grid.identity.deployment_identity:
    the deployment, its backend, GPU and model); `kubernetes` the operational kubernetes settings.
    The start-up log is kept whatever the outcome; `resolved.json` is written only when the gate
    passes, so no run of a refused deployment is measured.
    """
    backend = str(identity["backend"])
    deployment = backend_deployment(identity)
    deployed = backend_for(identity, kubernetes, node).deploy(
        deployment, manifest_path=manifest_path, startup_log_path=startup_log_path
    )
    if backend != "sim":
        # A real engine's start-up log is a measurement too: every one is kept (a forced
        # redeployment replaces the declared startup.log, never this copy).
        archive = next_generation_dir(Path(startup_log_path).parent / "startups")
        os.link(startup_log_path, archive / "startup.log")
    resolved = confirm(deployment, deployed)
    resolved.update(deployment_id=deployment["deployment_id"], backend=backend)
    write_json(resolved_path, resolved)
    log.info(
        "deployment %s confirmed: chunked_prefill=%s chunk_size=%s",
        deployment["deployment_id"],
        resolved["chunked_prefill"],
        resolved["chunk_size"],
    )
    return resolved
