"""The restart experiment (study §7.5, Figure 14): restart a deployment's engine once and record the
event timeline. Kubernetes only: the other backends have no pod to restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.deploy.kubernetes import KubernetesBackend

__all__ = ["restart_experiment"]


def restart_experiment(
    *,
    deployment: Mapping[str, Any],
    backend: str,
    kubernetes: Mapping[str, Any],
    rep: str,
    manifest_path: str,
    record_path: str,
) -> dict[str, Any]:
    """Restart the engine's pod once and record the event timeline (study §7.5, Fig. 14)."""
    if backend != "kubernetes":
        raise ValueError(
            f"the restart experiment restarts real pods: backend {backend!r} has none "
            "(run it with --config backend=kubernetes)"
        )
    impl = KubernetesBackend.from_settings(kubernetes)
    return impl.restart_timeline(deployment["deployment_id"], manifest_path, record_path, rep=rep)
