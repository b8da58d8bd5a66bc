"""The default backend: the simulated engines, in virtual time."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from servelab.deploy.backend import Deployed, NodeSlot, RunRequest
from servelab.sim.cpu_platform import step_costs_from_config
from servelab.sim.platform import PlatformModel
from servelab.sim.run import sim_deploy, simulate_run_files

__all__ = ["SIM_STARTUP_TIME", "SimBackend"]

# A fixed clock for simulated start-up logs, so re-deploying gives byte-identical logs.
SIM_STARTUP_TIME = datetime(2025, 1, 1, 0, 0, 0, tzinfo=UTC)


class SimBackend:
    name = "sim"

    def __init__(
        self,
        *,
        gpu: Mapping[str, Any],
        model: Mapping[str, Any],
        sim: Mapping[str, Any] | None = None,
        node: NodeSlot | None = None,
    ) -> None:
        self.gpu = dict(gpu)
        # the virtual GPU node the runs are measured on (one of config campaign.gpu_nodes)
        self.node = node or NodeSlot()
        self.model = dict(model)
        # config `sim`: the simulated platform's drift and noise (servelab.sim.platform)
        self.platform = PlatformModel.from_config(sim)
        # config `gpu.step_cost`: the CPU platform's fitted step times (servelab.sim.cpu_platform)
        self.step_costs = step_costs_from_config(self.gpu)

    def deploy(
        self, deployment: Mapping[str, Any], *, manifest_path: str, startup_log_path: str
    ) -> Deployed:
        del manifest_path  # nothing to apply: the simulator resolves from the same flags
        sim_deploy(
            engine=deployment["engine"],
            flags=list(deployment["flags"]),
            gpu_name=self.gpu["name"],
            gpu_memory_mib=int(self.gpu["memory_mib"]),
            model_preset=self.model["preset"],
            deployment_id=deployment["deployment_id"],
            startup_log_path=startup_log_path,
            timestamp=SIM_STARTUP_TIME,
            step_costs=self.step_costs,
        )
        return Deployed.read(startup_log_path)

    def run(self, request: RunRequest) -> dict[str, Any]:
        return simulate_run_files(
            **request.trace_and_coordinates(),
            flags=list(request.deployment["flags"]),
            gpu_name=self.gpu["name"],
            gpu_memory_mib=int(self.gpu["memory_mib"]),
            model_preset=self.model["preset"],
            deployment_id=request.deployment["deployment_id"],
            warmup_requests=request.dispatch.warmup_requests,
            warmup_prompt_tokens=request.dispatch.warmup_prompt_tokens,
            warmup_spacing_s=request.dispatch.warmup_spacing_s or 0.0,
            request_timeout_s=request.dispatch.request_timeout_s,
            stream_interval=request.dispatch.stream_interval,
            telemetry_step_s=request.telemetry.step_s,
            success_threshold=request.success_threshold,
            offered_load_rps=request.offered_load_rps,
            attempt=request.attempt,
            faults=request.faults,
            requests_path=request.requests_path,
            scrape_path=request.scrape_path,
            run_json_path=request.run_json_path,
            platform=self.platform,
            step_costs=self.step_costs,
            node=self.node.name if self.node.count > 1 else None,
        )
