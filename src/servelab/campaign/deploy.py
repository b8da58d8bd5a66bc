"""Deploy and gate (study §5.4): render a deployment's manifests, bring its engine up through its
backend, parse the start-up log with the one parser and refuse a configuration the arm does not
expect. The only place a start-up log is gated; `resolved.json` exists only if the gate passed.
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
from servelab.deploy import get_backend
from servelab.deploy.manifests import render_deployment
from servelab.engines import check_resolved, parse_startup_log

__all__ = ["deploy", "render_manifests"]

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


def deploy(
    *,
    deployment: Mapping[str, Any],
    backend: str,
    gpu: Mapping[str, Any],
    model: Mapping[str, Any],
    kubernetes: Mapping[str, Any],
    manifest_path: str,
    startup_log_path: str,
    resolved_path: str,
) -> dict[str, Any]:
    """Bring the engine up, parse its start-up log and refuse a configuration the arm does not expect.

    The start-up log is kept whatever the outcome; `resolved.json` is written only when the gate
    passes, so no run of a refused deployment is measured.
    """
    impl = get_backend(backend, gpu=gpu, model=model, kubernetes=kubernetes)
    impl.deploy(deployment, manifest_path=manifest_path, startup_log_path=startup_log_path)
    if backend != "sim":
        # A real engine's start-up log is a measurement too: every one is kept (a forced
        # redeployment replaces the declared startup.log, never this copy).
        archive = next_generation_dir(Path(startup_log_path).parent / "startups")
        os.link(startup_log_path, archive / "startup.log")
    text = Path(startup_log_path).read_text(encoding="utf-8", errors="replace")
    parsed = parse_startup_log(text, engine=deployment["engine"])
    check_resolved(
        parsed,
        expect_chunked_prefill=deployment["expect_chunked_prefill"],
        expect_chunk_size=deployment["expect_chunk_size"],
    )
    resolved = json.loads(parsed.to_json())
    resolved.update(deployment_id=deployment["deployment_id"], backend=backend)
    write_json(resolved_path, resolved)
    log.info(
        "deployment %s confirmed: chunked_prefill=%s chunk_size=%s",
        deployment["deployment_id"],
        parsed.chunked_prefill,
        parsed.chunk_size,
    )
    return resolved
