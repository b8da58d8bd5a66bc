"""One step of a capacity search: decide from the search's state, measure one probe through the
campaign's own code (trace compilation, deployment and gate, runs and success check), and write the
next state (`servelab.capacity.method` has the method)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servelab.campaign import blocks as campaign_blocks
from servelab.campaign import deploy as campaign_deploy
from servelab.capacity.method import (
    Search,
    bracket_of,
    deployment_params,
    evaluate_probe,
    next_rate,
    probe_condition,
    read_state,
    saturation_bracket,
    write_state,
)
from servelab.deploy import NodeSlot
from servelab.grid.config import offered_load, trace_seed
from servelab.grid.identity import deployment_identity, manifest_settings
from servelab.grid.settings import CapacitySettings
from servelab.grid.topology import mean_requests_per_graph
from servelab.workload.compiler import compile_trace_files

__all__ = ["capacity_step", "deploy_search", "measure_probe"]


def deploy_search(config: Mapping[str, Any], search: Search, folder: str | Path) -> dict[str, Any]:
    """Render the search's manifests (every backend, as the campaign does), deploy its engine once
    and confirm its resolved configuration (the gate)."""
    dep = deployment_params(config, search)
    folder = Path(folder)
    kubernetes = manifest_settings(config)
    campaign_deploy.render_manifests(
        deployment=dep,
        namespace=kubernetes["namespace"],
        kubernetes=kubernetes,
        manifest_path=str(folder / "manifest.yaml"),
    )
    # The deployment's identity whole, with its cores when the local backend pins (`local`): the
    # server starts as its probes run it, so the first probe does not start it again, pinned.
    return campaign_deploy.deploy(
        identity=deployment_identity(config, dep),
        kubernetes=config.get("kubernetes") or {},
        manifest_path=str(folder / "manifest.yaml"),
        startup_log_path=str(folder / "startup.log"),
        resolved_path=str(folder / "resolved.json"),
        node=search_node(config, search),
    )


def search_node(config: Mapping[str, Any], search: Search) -> NodeSlot:
    """The GPU node slot of a search's deployment (results/deployments/capacity-{search})."""
    return campaign_deploy.node_for(config, f"capacity-{search.id}")


def measure_probe(
    config: Mapping[str, Any],
    search: Search,
    rate: float,
    *,
    saturation: bool,
    probe_dir: str | Path,
    resolved_path: str | Path,
) -> list[Path]:
    """Every repetition of one probe, under `probe_dir` (traces/, runs/); returns the run dirs."""
    settings = CapacitySettings.from_config(config)
    shape = settings.shape(search.shape)
    duration = settings.saturation_duration_s if saturation else None
    condition = probe_condition(shape, rate, duration_s=duration, saturation=saturation)
    cid = condition.id
    dep = deployment_params(config, search)
    root = Path(probe_dir)
    run_dirs = []
    for k in range(1, settings.repetitions + 1):
        rep = f"rep{k}"
        traces = root / "traces" / cid / rep
        compile_trace_files(
            condition=condition,
            rep=rep,
            seed=trace_seed(int(config["campaign_seed"]), cid, rep),
            workload=config["workload"],
            tokenizer=str(config["tokenizer"]),
            trace_path=traces / "trace.parquet",
            manifest_path=traces / "manifest.json",
        )
        campaign_blocks.execute_run(
            settings={
                "backend": config["backend"],
                "arm": search.arm,
                "engine": search.engine,
                "condition": cid,
                "rep": rep,
                "offered_load_rps": offered_load(condition, config["workload"]),
                "gpu": config["gpu"],
                "model": config["model"],
                "dispatch": config["dispatch"],
                "campaign": config["campaign"],
                "telemetry": config["telemetry"],
                "faults": [],
                "kubernetes": config.get("kubernetes") or {},
            },
            deployment=dep,
            results_dir=str(root),
            trace_path=str(traces / "trace.parquet"),
            manifest_path=str(traces / "manifest.json"),
            resolved_path=str(resolved_path),
            node=search_node(config, search),
        )
        run_dirs.append(root / "runs" / search.arm / search.engine / cid / rep)
    return run_dirs


def capacity_step(
    config: Mapping[str, Any],
    search: Search,
    *,
    previous: str | Path | None,
    resolved_path: str | Path,
    probe_dir: str | Path,
    state_path: str | Path,
) -> dict[str, Any]:
    """Step k: from step k-1's state (None for the first), probe the next rate (or stop), write the
    state. The probe's runs live in `probe_dir` (the step's declared output folder)."""
    settings = CapacitySettings.from_config(config)
    if previous is None:
        state: dict[str, Any] = {
            "search": search.id,
            "arm": search.arm,
            "engine": search.engine,
            "shape": search.shape,
            "bracket": list(settings.bracket) if settings.bracket else None,
            "probes": [],
            "done": False,
            "stopped": "",
        }
    else:
        state = read_state(previous)
    Path(probe_dir).mkdir(parents=True, exist_ok=True)
    if state["done"]:
        write_state(state_path, state)
        return state
    action, rate = next_rate(state, settings)
    if action == "done":
        low, high = bracket_of(state)
        probes = sum(1 for p in state["probes"] if not p.get("saturation"))
        state["stopped"] = (
            "below-bracket"
            if low is None
            else "above-bracket"
            if high is None
            else "max-probes"
            if probes >= settings.max_probes and (high - low) / high >= settings.tolerance
            else "tolerance"
        )
        state["done"] = True
        write_state(state_path, state)
        return state
    assert rate is not None
    saturation = action == "saturation"
    run_dirs = measure_probe(
        config,
        search,
        rate,
        saturation=saturation,
        probe_dir=probe_dir,
        resolved_path=resolved_path,
    )
    shape = settings.shape(search.shape)
    duration = settings.saturation_duration_s if saturation else shape.duration_s
    probe: dict[str, Any] = {
        "rate": rate,
        "saturation": saturation,
        "load_s": duration * len(run_dirs),
    }
    if saturation:
        per_graph = mean_requests_per_graph(config["workload"])
        state["bracket"] = saturation_bracket(run_dirs, per_graph)
        probe["passed"] = None
    else:
        probe.update(
            evaluate_probe(
                run_dirs,
                settings,
                duration_s=duration,
                step_s=float(config["telemetry"]["step_s"]),
            )
        )
    state["probes"].append(probe)
    write_state(state_path, state)
    return state
