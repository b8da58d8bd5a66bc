"""servelab.deploy: backends that bring an engine up and run a trace against it.

A backend differs only where it must: `deploy` brings the engine up, writes its start-up log and
returns it (`Deployed`), and `run` writes the run's artifacts (requests.parquet, scrape.parquet,
run.json) to the shared schemas. No backend gates: the campaign parses the start-up log with the
one parser and gates it (servelab.campaign.deploy.gate), and passes that gate in (`Gate`,
`RunRequest.gate`) where a backend brings an engine up again by itself. The two live backends
measure through one function, servelab.deploy.measure.measure_live.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.deploy.backend import Backend, Deployed, Gate, NodeSlot, RunRequest
from servelab.grid.settings import KubernetesSettings

__all__ = ["BACKENDS", "Backend", "Deployed", "Gate", "NodeSlot", "RunRequest", "get_backend"]

BACKENDS = ("sim", "local", "kubernetes")


def get_backend(
    name: str,
    *,
    gpu: Mapping[str, Any],
    model: Mapping[str, Any],
    kubernetes: Mapping[str, Any] | KubernetesSettings | None = None,
    sim: Mapping[str, Any] | None = None,
    node: NodeSlot | None = None,
) -> Backend:
    """The backend `name`, measuring on GPU node slot `node` (default: the one node)."""
    node = node or NodeSlot()
    # Each backend's module only when it is chosen: the kubernetes client alone takes 0.3 s to
    # import, and servelab.deploy.manifests (this package) is read at every Snakefile parse.
    if name == "sim":
        from servelab.deploy.sim import SimBackend

        return SimBackend(gpu=gpu, model=model, sim=sim, node=node)
    if name == "local":
        from servelab.deploy.local import LocalBackend

        return LocalBackend(gpu=gpu, model=model, node=node)
    if name == "kubernetes":
        from servelab.deploy.kubernetes import KubernetesBackend

        return KubernetesBackend.from_settings(kubernetes, node=node)
    raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
