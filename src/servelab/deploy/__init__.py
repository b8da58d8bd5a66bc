"""servelab.deploy: backends that bring an engine up and run a trace against it.

A backend differs only where it must: `deploy` writes the engine's start-up log (the shared parser
and gate then confirm what it resolved), and `run` writes the run's artifacts (requests.parquet,
scrape.parquet, run.json) to the shared schemas. The two live backends measure through one
function, servelab.deploy.measure.measure_live.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.deploy.backend import Backend, RunRequest
from servelab.deploy.kubernetes import KubernetesBackend
from servelab.deploy.local import LocalBackend
from servelab.deploy.sim import SimBackend
from servelab.settings import KubernetesSettings

__all__ = ["BACKENDS", "Backend", "RunRequest", "get_backend"]

BACKENDS = ("sim", "local", "kubernetes")


def get_backend(
    name: str,
    *,
    gpu: Mapping[str, Any],
    model: Mapping[str, Any],
    kubernetes: Mapping[str, Any] | KubernetesSettings | None = None,
    sim: Mapping[str, Any] | None = None,
) -> Backend:
    if name == "sim":
        return SimBackend(gpu=gpu, model=model, sim=sim)
    if name == "local":
        return LocalBackend(gpu=gpu, model=model)
    if name == "kubernetes":
        return KubernetesBackend.from_settings(kubernetes)
    raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
