"""A fake Kubernetes API server for the kubernetes backend's tests and the campaign Job's (see
server.py, cluster.py, and batch.py: the Job controller and exec).

Scenario logs under logs/ hold engine start-up logs in the real formats of vLLM 0.6.3 and
SGLang 0.4.1 for the study's configurations (each file's first line says how it was made).
"""

from __future__ import annotations

from pathlib import Path

from .cluster import START, ApiError, FakeCluster, PodScript
from .server import FakeKube, running

LOGS = Path(__file__).resolve().parent / "logs"

__all__ = [
    "FAST",
    "LOGS",
    "START",
    "ApiError",
    "FakeCluster",
    "FakeKube",
    "PodScript",
    "backend_for",
    "engine_log",
    "running",
]


def engine_log(name: str) -> str:
    """The text of logs/{name}.log."""
    return (LOGS / f"{name}.log").read_text(encoding="utf-8")


FAST = {"poll_s": 0.001, "ready_s": 900.0, "delete_s": 300.0, "request_s": 10.0}


def backend_for(kube: FakeKube, settings: dict | None = None, *, node=None, **timeouts: float):
    """A KubernetesBackend on the fake server through Configuration(host=...): polls without
    sleeping (the fake clock advances per poll), so a wait of minutes takes milliseconds. `node`:
    the servelab.deploy.NodeSlot it measures on (default: the one node)."""
    from servelab.deploy.kubernetes import KubernetesBackend

    merged = dict(settings or {})
    merged["timeouts"] = {**FAST, **timeouts}
    return KubernetesBackend(kube.api_client(), merged, node=node, sleep=lambda _s: None)
