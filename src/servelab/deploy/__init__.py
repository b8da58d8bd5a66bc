"""servelab.deploy: backends that bring an engine up and run a trace against it.

A backend differs only where it must: `deploy` writes the engine's start-up log (the shared parser
and gate then confirm what it resolved), and `run` writes the run's artifacts (requests.parquet,
scrape.parquet, run.json) to the shared schemas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["BACKENDS", "Backend", "RunRequest", "get_backend"]

BACKENDS = ("sim", "local", "kubernetes")


@dataclass(frozen=True)
class RunRequest:
    """Everything a backend needs for one attempt of one run (plain values)."""

    arm: str
    engine: str
    condition: str
    rep: str
    deployment: dict[str, Any]
    resolved_config: dict[str, Any]
    trace_path: str
    manifest_path: str
    offered_load_rps: float
    dispatch: dict[str, Any]
    telemetry: dict[str, Any]
    success_threshold: float
    attempt: int
    requests_path: str
    scrape_path: str
    run_json_path: str
    faults: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return f"{self.arm}/{self.engine}/{self.condition}/{self.rep}"


class Backend(Protocol):
    name: str

    def deploy(
        self, deployment: Mapping[str, Any], *, manifest_path: str, startup_log_path: str
    ) -> None: ...

    def run(self, request: RunRequest) -> dict[str, Any]: ...


def get_backend(
    name: str,
    *,
    gpu: Mapping[str, Any],
    model: Mapping[str, Any],
    kubernetes: Mapping[str, Any] | None = None,
) -> Backend:
    if name == "sim":
        from servelab.deploy.sim import SimBackend

        return SimBackend(gpu=gpu, model=model)
    if name == "local":
        from servelab.deploy.local import LocalBackend

        return LocalBackend(gpu=gpu, model=model)
    if name == "kubernetes":
        from servelab.deploy.kubernetes import KubernetesBackend

        return KubernetesBackend.from_settings(dict(kubernetes or {}))
    raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
