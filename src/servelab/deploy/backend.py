"""What every backend implements (`Backend`), what its `deploy` returns (`Deployed`), what it is
given for one run (`RunRequest`), and the shape of the resolved-configuration gate (`Gate`) the
campaign passes in. No backend gates a start-up log of its own accord: the gate is the campaign's
(servelab.campaign.deploy.gate), and a backend that brings an engine up again by itself (the
kubernetes backend's pod recreated after a reclamation) calls the one it was given."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict

from servelab.grid.settings import DispatchSettings, TelemetrySettings

__all__ = ["Backend", "Deployed", "Gate", "NodeSlot", "RunRequest"]

# The resolved-configuration gate: (deployment, start-up log text) -> the configuration the log
# shows; raises (servelab.engines.ResolvedConfigMismatch) when it is not what the arm expects.
Gate = Callable[[Mapping[str, Any], str], Mapping[str, Any]]


@dataclass(frozen=True)
class NodeSlot:
    """The GPU node a job measures on: slot `index` of `count` (config `campaign.gpu_nodes`;
    servelab.grid.config.node_slot pins each deployment to one). Operational: where a block runs,
    never what it measures. The sim backend names a virtual node by it, the local backend keeps
    one engine server per slot, the kubernetes backend schedules onto the node that carries the
    slot's label."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"node slot {self.index} of {self.count}: need 0 <= slot < count")

    @property
    def name(self) -> str:
        """`node{index}`: the slot's name in node identities, logs and Snakemake resources."""
        return f"node{self.index}"


@dataclass(frozen=True)
class Deployed:
    """What `Backend.deploy` brought up: the engine's start-up log as written to startup.log, and
    the facts the backend observed beside it (kubernetes: namespace, pod, node identity; local:
    the server's pid, URL and node id; sim: none). Facts are neither gated nor written to
    resolved.json.

    `on_gate`, when set, is what the backend records of the gate's verdict: the campaign calls it
    with None once the gate passed, or with the refusal (then re-raises it). The kubernetes backend
    marks the pod that passed on its Deployment, or keeps the refused log beside startup.log.
    """

    startup_log: str
    facts: Mapping[str, Any] = field(default_factory=dict)
    on_gate: Callable[[BaseException | None], None] | None = None

    @classmethod
    def read(
        cls,
        startup_log_path: str | os.PathLike[str],
        facts: Mapping[str, Any] | None = None,
        on_gate: Callable[[BaseException | None], None] | None = None,
    ) -> Deployed:
        """The start-up log as written to `startup_log_path` (read back as the gate reads a file:
        UTF-8, undecodable bytes replaced)."""
        text = Path(startup_log_path).read_text(encoding="utf-8", errors="replace")
        return cls(startup_log=text, facts=dict(facts or {}), on_gate=on_gate)


class TraceAndCoordinates(TypedDict):
    """`RunRequest.trace_and_coordinates`: the keyword arguments it gives the run functions."""

    trace_path: str
    manifest_path: str
    arm: str
    engine: str
    condition: str
    rep: str


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
    # The campaign's gate, for an engine the backend brings up again by itself during the run
    # (kubernetes: a pod recreated after a reclamation); None: such an engine cannot be confirmed.
    gate: Gate | None = None

    @property
    def run_id(self) -> str:
        return f"{self.arm}/{self.engine}/{self.condition}/{self.rep}"

    def trace_and_coordinates(self) -> TraceAndCoordinates:
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
    ) -> Deployed:
        """Bring the engine up fresh, write its start-up log to `startup_log_path`; return it."""
        ...

    def run(self, request: RunRequest) -> dict[str, Any]: ...
