"""The restart experiment (study §7.5, Figure 14): restart a deployment's engine once and record the
event timeline. The backend comes from the registry (servelab.deploy.get_backend); only one that
restarts real pods (kubernetes: `restart_timeline`) can run it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.campaign.deploy import backend_deployment, backend_for
from servelab.deploy import NodeSlot

__all__ = ["restart_experiment"]


def restart_experiment(
    *,
    identity: Mapping[str, Any],
    kubernetes: Mapping[str, Any],
    rep: str,
    manifest_path: str,
    record_path: str,
    node: NodeSlot | None = None,
) -> dict[str, Any]:
    """Restart the engine's pod once and record the event timeline (study §7.5, Fig. 14).

    `identity` is the restarted deployment's identity whole (servelab.grid.identity), as the
    deploy rule takes it; `kubernetes` the kubernetes settings."""
    backend = str(identity["backend"])
    if backend != "kubernetes":
        raise ValueError(
            f"the restart experiment restarts real pods: backend {backend!r} has none "
            "(run it with --config backend=kubernetes)"
        )
    impl = backend_for(identity, kubernetes, node)
    deployment = backend_deployment(identity)
    # Only a backend with real pods restarts them (servelab.deploy.kubernetes.KubernetesBackend).
    record: dict[str, Any] = impl.restart_timeline(  # type: ignore[attr-defined]
        deployment["deployment_id"], manifest_path, record_path, rep=rep
    )
    return record
