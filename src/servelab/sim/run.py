"""The simulator's artifact-writing API (plain-value arguments, so Snakemake scripts stay thin).

- `sim_deploy(...)`: resolve an engine's configuration from its flags by the engine's own rules, derive
  its KV capacity, write its start-up log in the engine's real format (the orchestrator then runs the
  shared parser and gate on it) and return the `ResolvedConfig`.
- `simulate_run_files(...)`: serve one trace on the simulated engine in virtual time and write
  requests.parquet, scrape.parquet and run.json, exactly as a live run would.

Outputs are deterministic: the same inputs give byte-identical files (virtual clock on a fixed epoch,
no wall-clock values, fixed ordering).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from servelab.artifacts import (
    REQUESTS_SCHEMA,
    SCRAPE_SCHEMA,
    write_json,
    write_parquet,
    write_text,
)
from servelab.artifacts.runrecord import build_run_record
from servelab.engines import ResolvedConfig, render_startup_log, resolve, startup_log_flags
from servelab.grid.config import conditions, deployment_for, offered_load
from servelab.grid.settings import PlatformSettings
from servelab.sim.base import EngineModel
from servelab.sim.cost import DEFAULT_CALIBRATION, Calibration, CostModel
from servelab.sim.cpu_platform import StepCost, after_idle_clock, step_costs_from_config
from servelab.sim.memory import KvCapacity
from servelab.sim.models import build_model, engine_params, simulated_engine
from servelab.sim.params import EngineParams
from servelab.sim.platform import PlatformModel
from servelab.sim.presets import GpuPreset, ModelPreset, gpu_preset, model_preset
from servelab.sim.runner import RunOutcome, WarmupRequest, run_trace
from servelab.workload.loader import load_trace

__all__ = [
    "SIM_EPOCH_UNIX_S",
    "WARMUP_MAX_TOKENS",
    "WARMUP_PROMPT_TOKENS",
    "SimEngine",
    "build_engine",
    "kv_capacity",
    "make_warmups",
    "node_identity",
    "sim_deploy",
    "simulate_run_files",
]

# Every simulated run starts at this virtual instant (2026-01-01T00:00:00Z): deterministic run.json.
SIM_EPOCH_UNIX_S = 1_767_225_600.0
WARMUP_PROMPT_TOKENS = 128
WARMUP_MAX_TOKENS = 16
FAULT_KINDS = ("reclaim", "fail")


def kv_capacity(
    resolved: ResolvedConfig, model: ModelPreset, gpu: GpuPreset, gpu_memory_mib: int
) -> KvCapacity:
    """The KV capacity the engine derives at start-up (sim.memory; docs/simulator.md)."""
    return simulated_engine(resolved.engine).kv_capacity(resolved, model, gpu, gpu_memory_mib)


@dataclass(frozen=True)
class SimEngine:
    """A configured simulated engine: resolved configuration, capacity and the stepping model."""

    resolved: ResolvedConfig
    capacity: KvCapacity
    params: EngineParams
    model: EngineModel
    model_preset: ModelPreset
    gpu: GpuPreset
    memory_mib: int  # the memory the configuration was resolved against


def build_engine(
    *,
    engine: str,
    flags: Sequence[str],
    gpu_name: str = "L4",
    gpu_memory_mib: int | None = None,
    model_preset_name: str = "llama-3.1-8b",
    calibration: Calibration = DEFAULT_CALIBRATION,
    track_emitted: bool = True,
    slowdown: float = 1.0,
    step_costs: Mapping[str, Any] | None = None,
) -> SimEngine:
    """Resolve `flags` by `engine`'s rules and build its model (also used by a real-time server).

    On the CPU platform (`gpu_name` CPU) the step time is the engine's fitted `StepCost` from
    `step_costs` (config `gpu.step_cost`; servelab.sim.cpu_platform) instead of the roofline."""
    gpu = gpu_preset(gpu_name)
    mem = int(gpu_memory_mib if gpu_memory_mib is not None else gpu.memory_mib)
    preset = model_preset(model_preset_name)
    resolved = resolve(
        engine,
        list(flags),
        gpu_memory_mib=mem,
        model_max_position_embeddings=preset.max_position_embeddings,
        gpu_name=gpu.name,
    )
    cap = kv_capacity(resolved, preset, gpu, mem)
    params = engine_params(resolved, kv_capacity_tokens=cap.tokens)
    cost: Any
    if gpu.name == "CPU":
        fitted = (step_costs or {}).get(engine)
        if fitted is None:
            raise ValueError(
                f"config key gpu.step_cost.{engine}: the CPU platform has no fitted step time for "
                f"{engine} (fit it from the engine's floor: the cpu_platform rule, "
                'docs/simulator.md "Against the real engines")'
            )
        # an after-idle term's state is this engine's own (servelab.sim.cpu_platform)
        cost = (
            after_idle_clock(fitted.with_slowdown(slowdown))
            if isinstance(fitted, StepCost)
            else fitted
        )
    else:
        cost = CostModel(preset, gpu, engine, calibration, slowdown=slowdown)
    model = build_model(params, preset, cost, track_emitted=track_emitted)
    return SimEngine(resolved, cap, params, model, preset, gpu, mem)


def _timestamp(value: datetime | str) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError as exc:
        raise ValueError(f"timestamp: not an ISO 8601 date-time: {value!r}") from exc


def sim_deploy(
    *,
    engine: str,
    flags: Sequence[str],
    gpu_name: str,
    gpu_memory_mib: int,
    model_preset: str,
    deployment_id: str,
    startup_log_path: str | os.PathLike[str],
    timestamp: datetime | str,
    step_costs: Mapping[str, Any] | None = None,
) -> ResolvedConfig:
    """Resolve the configuration, derive the KV capacity, write the engine's start-up log."""
    sim = build_engine(
        engine=engine,
        flags=flags,
        gpu_name=gpu_name,
        gpu_memory_mib=gpu_memory_mib,
        model_preset_name=model_preset,
        step_costs=step_costs,
    )
    write_text(startup_log_path, gate_startup_log(sim, flags, _timestamp(timestamp)))
    return sim.resolved


def gate_startup_log(sim: SimEngine, flags: Sequence[str], timestamp: datetime) -> str:
    """The start-up log the gate reads for `sim`: its own, or, for an engine that is confirmed
    from a start-up probe (llama-server at trace verbosity), the probe start's, resolved from the
    probe's flags as the real backend starts it (servelab.engines.startup_log_flags)."""
    resolved = sim.resolved
    log_flags = startup_log_flags(resolved.engine, flags)
    if log_flags != list(flags):
        resolved = resolve(
            resolved.engine,
            log_flags,
            gpu_memory_mib=sim.memory_mib,
            model_max_position_embeddings=sim.model_preset.max_position_embeddings,
            gpu_name=sim.gpu.name,
        )
    return render_startup_log(
        resolved,
        kv_capacity_tokens=sim.capacity.tokens,
        weights_gib=sim.model_preset.weights_gib,
        timestamp=timestamp,
        kv_bytes_per_token=sim.model_preset.kv_bytes_per_token,
    )


def make_warmups(
    seed: int,
    n: int,
    avoid_first: set[int],
    vocab_size: int,
    prompt_tokens: int = WARMUP_PROMPT_TOKENS,
) -> list[WarmupRequest]:
    """`n` warm-up prompts of `prompt_tokens` tokens, deterministic in `seed`, sharing no prefix
    with the trace: their first tokens are pairwise distinct and never a trace prompt's first token.

    The simulator compares token ids only for equality, so these ids behave exactly like the live
    dispatcher's `servelab.workload.warmup_prompts` (which guarantee the same property) without loading
    a tokenizer.
    """
    rng = np.random.default_rng(np.random.SeedSequence([int(seed) & (2**63 - 1), 0x5741524D]))
    out: list[WarmupRequest] = []
    used = set(avoid_first)
    for k in range(n):
        ids = rng.integers(1000, max(vocab_size - 1000, 2000), size=prompt_tokens)
        while int(ids[0]) in used:
            ids[0] = rng.integers(1000, max(vocab_size - 1000, 2000))
        used.add(int(ids[0]))
        out.append(WarmupRequest(f"warmup-{k:02d}", ids.astype(np.int64), WARMUP_MAX_TOKENS))
    return out


def node_identity(gpu_name: str, generation: int, node: str | None = None) -> dict[str, Any]:
    """A deterministic stand-in for the GPU node's identity; a reclamation bumps the generation.
    `node` names one of several virtual nodes (config campaign.gpu_nodes > 1: `node0`, `node1`,
    ...); with one node the name is the one-node campaign's, so its artifacts do not change."""
    name = f"sim-{gpu_name.lower()}-{node or 'node'}-{generation}"
    return {
        "name": name,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"servelab-sim/{name}")),
        "provider_id": f"sim://{gpu_name}/{generation}",
        "spot": False,
    }


def _check_faults(faults: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None, bool]:
    stop_at = crash_at = None
    fail = False
    for i, f in enumerate(faults):
        kind = f.get("kind")
        if kind not in FAULT_KINDS:
            raise ValueError(f"faults[{i}].kind: {kind!r} is not one of {', '.join(FAULT_KINDS)}")
        if kind == "reclaim":
            if "at_s" not in f:
                raise ValueError(f"faults[{i}].at_s: required for a reclaim fault")
            at = float(f["at_s"])
            if at < 0:
                raise ValueError(f"faults[{i}].at_s: must be >= 0, got {at}")
            stop_at = at if stop_at is None else min(stop_at, at)
        else:
            fail = True
            if "at_s" in f and f["at_s"] is not None:
                at = float(f["at_s"])
                crash_at = at if crash_at is None else min(crash_at, at)
    return stop_at, crash_at, fail


def _requests_table(run_id: str, outcome: RunOutcome) -> pa.Table:
    recs = outcome.records
    chunk_offsets = np.zeros(len(recs) + 1, dtype=np.int32)
    for i, r in enumerate(recs):
        chunk_offsets[i + 1] = chunk_offsets[i] + r.chunk_times_s.shape[0]
    times = (
        np.concatenate([r.chunk_times_s for r in recs]) if recs else np.zeros(0, dtype=np.float64)
    )
    tokens = np.concatenate([r.chunk_tokens for r in recs]) if recs else np.zeros(0, dtype=np.int32)
    offsets = pa.array(chunk_offsets, type=pa.int32())
    return pa.table(
        {
            "run_id": pa.array([run_id] * len(recs), type=pa.string()),
            "request_id": pa.array([r.request_id for r in recs], type=pa.string()),
            "graph_id": pa.array([r.graph_id for r in recs], type=pa.int32()),
            "role": pa.array([r.role for r in recs], type=pa.string()),
            "warmup": pa.array([r.warmup for r in recs], type=pa.bool_()),
            "scheduled_s": pa.array([r.scheduled_s for r in recs], type=pa.float64()),
            "sent_s": pa.array([r.sent_s for r in recs], type=pa.float64()),
            # in virtual time the request reaches the engine the moment it is sent
            "written_s": pa.array([r.sent_s for r in recs], type=pa.float64()),
            "chunk_times_s": pa.ListArray.from_arrays(
                offsets, pa.array(times.astype(np.float64), type=pa.float64())
            ),
            "chunk_tokens": pa.ListArray.from_arrays(
                offsets, pa.array(tokens.astype(np.int32), type=pa.int32())
            ),
            "prompt_tokens": pa.array([r.prompt_tokens for r in recs], type=pa.int32()),
            "output_tokens": pa.array([r.output_tokens for r in recs], type=pa.int32()),
            "max_tokens": pa.array([r.max_tokens for r in recs], type=pa.int32()),
            "status": pa.array([r.status for r in recs], type=pa.string()),
            "error": pa.array([r.error for r in recs], type=pa.string()),
        },
        schema=REQUESTS_SCHEMA,
    )


def _scrape_table(run_id: str, outcome: RunOutcome) -> pa.Table:
    t_s: list[float] = []
    names: list[str] = []
    values: list[float] = []
    for t, snap in outcome.samples:
        for name in sorted(snap):
            t_s.append(t)
            names.append(name)
            values.append(float(snap[name]))
    return pa.table(
        {
            "run_id": pa.array([run_id] * len(t_s), type=pa.string()),
            "t_s": pa.array(t_s, type=pa.float64()),
            "source_metric": pa.array(names, type=pa.string()),
            "value": pa.array(values, type=pa.float64()),
        },
        schema=SCRAPE_SCHEMA,
    )


def simulate_run_files(
    *,
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
    arm: str,
    engine: str,
    condition: str,
    rep: str,
    flags: Sequence[str],
    gpu_name: str,
    gpu_memory_mib: int,
    model_preset: str,
    deployment_id: str,
    warmup_requests: int,
    request_timeout_s: float,
    stream_interval: int,
    telemetry_step_s: float,
    success_threshold: float,
    offered_load_rps: float,
    attempt: int,
    faults: Sequence[Mapping[str, Any]],
    requests_path: str | os.PathLike[str],
    scrape_path: str | os.PathLike[str],
    run_json_path: str | os.PathLike[str],
    calibration: Calibration = DEFAULT_CALIBRATION,
    platform: PlatformModel | None = None,
    step_costs: Mapping[str, Any] | None = None,
    node: str | None = None,
    warmup_prompt_tokens: int | None = None,
    warmup_spacing_s: float = 0.0,
) -> dict[str, Any]:
    """Simulate one run and write requests.parquet, scrape.parquet and run.json; return the record.
    `node` names the virtual GPU node (`node_identity`; None: the one node);
    `warmup_prompt_tokens` each warm-up prompt's length (None: WARMUP_PROMPT_TOKENS);
    `warmup_spacing_s` the seconds between two warm-ups' sends (0: all at once).

    `platform` slows or speeds every iteration by the deployment's drift and the run's noise
    (servelab.sim.platform), recorded in run.json's `sim.platform`; None runs the model alone
    (the sim backend always passes the config's, which is on by default)."""
    if platform is None:
        platform = PlatformModel(PlatformSettings(enabled=False))
    if stream_interval < 1:
        raise ValueError(f"stream_interval: must be >= 1, got {stream_interval}")
    if telemetry_step_s <= 0:
        raise ValueError(f"telemetry_step_s: must be positive, got {telemetry_step_s}")
    if request_timeout_s <= 0:
        raise ValueError(f"request_timeout_s: must be positive, got {request_timeout_s}")
    if warmup_requests < 0:
        raise ValueError(f"warmup_requests: must be >= 0, got {warmup_requests}")
    warmup_tokens = WARMUP_PROMPT_TOKENS if warmup_prompt_tokens is None else warmup_prompt_tokens
    if warmup_tokens < 1:
        raise ValueError(f"warmup_prompt_tokens: must be >= 1, got {warmup_prompt_tokens}")
    if warmup_spacing_s < 0:
        raise ValueError(f"warmup_spacing_s: must be >= 0, got {warmup_spacing_s}")
    stop_at, crash_at, fail = _check_faults(list(faults))
    trace = load_trace(trace_path, manifest_path)
    for key, want in (("condition", condition), ("rep", rep)):
        if str(trace.manifest[key]) != want:
            raise ValueError(
                f"{manifest_path}: {key} is {trace.manifest[key]!r}, but the run is for {want!r}"
            )
    drift, noise = platform.drift(deployment_id), platform.noise(deployment_id, condition, rep)
    sim = build_engine(
        engine=engine,
        flags=flags,
        gpu_name=gpu_name,
        gpu_memory_mib=gpu_memory_mib,
        model_preset_name=model_preset,
        calibration=calibration,
        track_emitted=False,
        slowdown=drift * noise,
        step_costs=step_costs,
    )
    prompts = {rid: p.token_ids for rid, p in trace.prompts.items()}
    first_tokens = {int(ids[0]) for ids in prompts.values() if ids.shape[0]}
    warm = make_warmups(
        trace.seed, warmup_requests, first_tokens, sim.model_preset.vocab_size, warmup_tokens
    )
    outcome = run_trace(
        sim.model,
        trace.requests,
        prompts,
        warmups=warm,
        warmup_spacing_s=float(warmup_spacing_s),
        request_timeout_s=float(request_timeout_s),
        stream_interval=int(stream_interval),
        telemetry_step_s=float(telemetry_step_s),
        stop_at_s=stop_at,
        crash_at_s=crash_at,
        crash_at_trace_start=fail and crash_at is None,
    )
    run_id = f"{arm}/{engine}/{condition}/{rep}"
    requests = _requests_table(run_id, outcome)
    scrape = _scrape_table(run_id, outcome)
    node_start = node_identity(gpu_name, 0, node)
    node_end = node_identity(gpu_name, 1 if outcome.interrupted else 0, node)
    stats = sim.model.metrics()
    extra = {
        "trace_start_s": outcome.trace_start_s,
        "sim": {
            "kv_capacity": sim.capacity.to_dict(),
            "iterations": outcome.iterations,
            "virtual_duration_s": outcome.end_s,
            "calibration": calibration.to_dict(),
            **(
                {"step_cost": sim_step_cost.coefficients() | sim_step_cost.after_idle()}
                if isinstance(sim_step_cost := (step_costs or {}).get(engine), StepCost)
                else {}
            ),
            "platform": {
                **platform.to_dict(),
                "drift": drift,
                "noise": noise,
            },
            "faults": [dict(f) for f in faults],
            "engine_crashed": outcome.crashed,
            **(
                {"steps_with_output": int(steps)}
                if (steps := getattr(sim.model, "steps_with_output", None)) is not None
                else {}
            ),
            "preemptions": int(getattr(sim.model, "num_preemptions", 0)),
            "retractions": int(getattr(sim.model, "num_retractions", 0)),
            "final_metrics": {k: stats[k] for k in sorted(stats)},
            "warmup_prompt_tokens": warmup_tokens,
            "warmup_max_tokens": WARMUP_MAX_TOKENS,
            # kept out when 0, so that a run simulated before the key existed reads the same
            **({"warmup_spacing_s": warmup_spacing_s} if warmup_spacing_s else {}),
        },
        "telemetry_step_s": float(telemetry_step_s),
    }
    record = build_run_record(
        arm=arm,
        engine=engine,
        condition=condition,
        rep=rep,
        seed=trace.seed,
        trace_sha256=trace.trace_sha256,
        backend="sim",
        deployment_id=deployment_id,
        resolved_config=sim.resolved.as_run_config(),
        start_unix_s=SIM_EPOCH_UNIX_S,
        end_unix_s=SIM_EPOCH_UNIX_S + outcome.end_s,
        offered_load_rps=offered_load_rps,
        requests=requests,
        success_threshold=success_threshold,
        attempt=attempt,
        node={"start": node_start, "end": node_end},
        interrupted=outcome.interrupted,
        extra=extra,
    )
    write_parquet(requests_path, requests, REQUESTS_SCHEMA)
    write_parquet(scrape_path, scrape, SCRAPE_SCHEMA)
    write_json(run_json_path, record)
    return record


def simulate_config_run(
    config: Mapping[str, Any],
    *,
    arm: str,
    engine: str,
    condition: str,
    rep: str,
    trace_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    attempt: int = 1,
    faults: Sequence[Mapping[str, Any]] = (),
    calibration: Calibration = DEFAULT_CALIBRATION,
    platform: PlatformModel | None = None,
) -> dict[str, Any]:
    """`simulate_run_files` for one run of a validated servelab config, outside Snakemake
    (the `servelab sim run` command and the benchmarks); the platform model is the config's
    `sim.platform` unless `platform` is given."""
    deployment = deployment_for(config, arm, engine, condition)
    trace, out = Path(trace_dir), Path(out_dir)
    return simulate_run_files(
        trace_path=trace / "trace.parquet",
        manifest_path=trace / "manifest.json",
        arm=arm,
        engine=engine,
        condition=condition,
        rep=rep,
        flags=list(deployment.flags),
        gpu_name=config["gpu"]["name"],
        gpu_memory_mib=int(config["gpu"]["memory_mib"]),
        model_preset=config["model"]["preset"],
        deployment_id=deployment.id,
        warmup_requests=int(config["dispatch"]["warmup_requests"]),
        warmup_prompt_tokens=config["dispatch"].get("warmup_prompt_tokens"),
        warmup_spacing_s=float(config["dispatch"].get("warmup_spacing_s") or 0.0),
        request_timeout_s=float(config["dispatch"]["request_timeout_s"]),
        stream_interval=int(config["dispatch"]["stream_interval"]),
        telemetry_step_s=float(config["telemetry"]["step_s"]),
        success_threshold=float(config["campaign"]["success_threshold"]),
        offered_load_rps=offered_load(conditions(config)[condition], config["workload"]),
        attempt=attempt,
        faults=[dict(f) for f in faults],
        requests_path=out / "requests.parquet",
        scrape_path=out / "scrape.parquet",
        run_json_path=out / "run.json",
        calibration=calibration,
        platform=platform or sim_platform(config),
        step_costs=step_costs_from_config(config["gpu"]),
    )


def sim_platform(config: Mapping[str, Any]) -> PlatformModel:
    """The platform model of a config (`sim.platform`; defaults when absent)."""
    return PlatformModel.from_config(config.get("sim"))
