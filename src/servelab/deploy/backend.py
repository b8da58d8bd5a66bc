"""What every backend implements (`Backend`) and what it is given for one run (`RunRequest`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from servelab.grid.settings import DispatchSettings, TelemetrySettings

__all__ = ["Backend", "RunRequest"]


@dataclass(frozen=True)
class RunRequest:
    """Everything a backend needs for one attempt of one run."""

    arm: str
    engine: str
    condition: str
    rep: str
    deployment: dict[str, Any]
    resolved_config: dict[str, Any]
    trace_path: str
    manifest_path: str
    offered_load_rps: float
    dispatch: DispatchSettings
    telemetry: TelemetrySettings
    success_threshold: float
    attempt: int
    requests_path: str
    scrape_path: str
    run_json_path: str
    # The deployment's folder (its start-up log and resolved.json): where a backend that keeps
    # state of its own keeps the deployment's (the local backend: the server's pid and log).
    deployment_dir: str
    faults: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return f"{self.arm}/{self.engine}/{self.condition}/{self.rep}"

    def trace_and_coordinates(self) -> dict[str, str]:
        """The trace files and the run's coordinates, as both the simulator's and the live
        dispatcher's run functions take them (keyword arguments)."""
        return {
            "trace_path": self.trace_path,
            "manifest_path": self.manifest_path,
            "arm": self.arm,
            "engine": self.engine,
            "condition": self.condition,
            "rep": self.rep,
        }


class Backend(Protocol):
    name: str

    def deploy(
        self, deployment: Mapping[str, Any], *, manifest_path: str, startup_log_path: str
    ) -> Any: ...

    def run(self, request: RunRequest) -> dict[str, Any]: ...
