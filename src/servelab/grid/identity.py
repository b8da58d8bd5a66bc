"""Measurement identity: which settings define a measurement, and which only operate the campaign.

A measurement is defined by what the engine was, what it was sent and how it was asked: the
engine's image, flags and the configuration it resolved; the trace's SHA-256; the dispatch
protocol (warm-ups, request timeout, `ignore_eos`, the stream interval asked for, the client kind
and its worker processes); the pass mark that decides whether a run counts; the backend, GPU and
model. Everything else operates the campaign: timeouts, poll and watch intervals, where the
cluster and Prometheus are (kubeconfig, context, URLs), pauses, retries, injected faults.

Only identity reaches the params of the deploy, run and telemetry rules and the sealed
measurement's key (`measurement_key`), so changing an operational setting re-measures nothing, and
changing an identity setting re-measures exactly the runs it defines. Operational settings reach a
job at run time (`operational_settings`), never as a param. `CLASSIFICATION` names the class of
every key of the four settings sections; a test checks that it covers the schema exactly, so a new
key must be classified before it can be used. `TRACE_CLASSIFICATION` does the same for the keys
that define a trace (`workload`, a condition and its imported `trace`): all identity, through the
trace's SHA-256. docs/campaigns.md explains the consequences.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from servelab.engines.base import CONFIG_FIELDS
from servelab.grid.settings import (
    CampaignSettings,
    DispatchSettings,
    KubernetesSettings,
    LocalSettings,
    SimSettings,
    TelemetrySettings,
)

__all__ = [
    "CLASSIFICATION",
    "IDENTITY",
    "MANIFEST_KEYS",
    "OPERATIONAL",
    "TRACE_CLASSIFICATION",
    "deployment_identity",
    "identity_keys",
    "manifest_settings",
    "measurement_key",
    "operational_settings",
    "run_identity",
]

IDENTITY: Literal["identity"] = "identity"
OPERATIONAL: Literal["operational"] = "operational"
Kind = Literal["identity", "operational"]

# Every key of the dispatch, campaign, telemetry and kubernetes sections, by class. The kubernetes
# keys that shape the pod (resources, selectors, volumes, probe, shm) are written into the rendered
# manifests: a change re-renders and redeploys the deployment, and its runs are re-measured only if
# the engine then resolves a different configuration (the key holds the resolved configuration).
CLASSIFICATION: dict[str, dict[str, Kind]] = {
    "dispatch": {
        "warmup_requests": IDENTITY,
        "warmup_prompt_tokens": IDENTITY,
        "warmup_spacing_s": IDENTITY,
        "request_timeout_s": IDENTITY,
        "ignore_eos": IDENTITY,
        "stream_interval": IDENTITY,
        "client": IDENTITY,
        "workers": IDENTITY,
        "health_timeout_s": OPERATIONAL,
    },
    "campaign": {
        "success_threshold": IDENTITY,
        "pause_between_runs_s": OPERATIONAL,
        "retries": OPERATIONAL,
        # where a block runs, never what it measures: N nodes give the artifacts of one
        "gpu_nodes": OPERATIONAL,
        "faults": OPERATIONAL,
    },
    "telemetry": {
        # the grid a run's raw metric window (scrape.parquet) is sampled on
        "step_s": IDENTITY,
        "prometheus_url": OPERATIONAL,
    },
    "kubernetes": {
        "kubeconfig": OPERATIONAL,
        "context": OPERATIONAL,
        "namespace": OPERATIONAL,
        "run_label": OPERATIONAL,
        "node_selector": OPERATIONAL,
        "gpu_resource": OPERATIONAL,
        "gpu_taint_key": OPERATIONAL,
        "resources": OPERATIONAL,
        "image_pull_policy": OPERATIONAL,
        "termination_grace_period_s": OPERATIONAL,
        "node_watch_s": OPERATIONAL,
        "model_volume": OPERATIONAL,
        "hf_token_secret": OPERATIONAL,
        "readiness_probe": OPERATIONAL,
        "sglang_shm_size": OPERATIONAL,
        "pod_monitor": OPERATIONAL,
        "engine_url": OPERATIONAL,
        "metrics_selector": OPERATIONAL,
        # Where the GPU's energy and power series come from: they add rows to scrape.parquet but
        # change nothing the engine does or is sent, so a run sealed without them is not measured
        # again for them (its energy figures stay null).
        "dcgm_exporter": OPERATIONAL,
        "gpu_metrics_selector": OPERATIONAL,
        "timeouts": OPERATIONAL,
        # where the campaign's driver runs (a Job on the CPU node), never what it measures
        "campaign_job": OPERATIONAL,
    },
}

# Every key that defines a trace, by class: the `workload` section, a condition, and a condition's
# imported `trace` (docs/workload.md). All are identity: they change the trace's bytes, and the
# trace's SHA-256 is in every measurement's key (`measurement_key`); the workload's graph shapes
# (`workers_per_graph`, `topologies`) and a condition's rate also set the offered load in
# `run_identity`. None is a param of a run rule: the compile_trace rule takes them, and the
# compiled trace is the run's input. An imported trace's `path` names the file whose bytes define
# it (the manifest records the file's SHA-256): the same bytes moved elsewhere compile to the same
# trace, so the same measurement.
TRACE_CLASSIFICATION: dict[str, dict[str, Kind]] = {
    "workload": {
        "arrival_cv": IDENTITY,
        "workers_per_graph": IDENTITY,
        "max_tokens": IDENTITY,
        "tool_delay": IDENTITY,
        "topologies": IDENTITY,
    },
    "conditions": {
        "sweep": IDENTITY,
        "rate": IDENTITY,
        "sharing": IDENTITY,
        "prompt_tokens": IDENTITY,
        "duration_s": IDENTITY,
        "trace": IDENTITY,
    },
    "conditions.trace": {
        "format": IDENTITY,
        "path": IDENTITY,
        "start_s": IDENTITY,
        "max_request_tokens": IDENTITY,
    },
}

# The kubernetes keys written into the rendered manifests: the render rule's params (a change
# re-renders and redeploys; see CLASSIFICATION). The other kubernetes keys never reach a manifest.
MANIFEST_KEYS = (
    "namespace",
    "run_label",
    "node_selector",
    "gpu_resource",
    "gpu_taint_key",
    "resources",
    "image_pull_policy",
    "termination_grace_period_s",
    "model_volume",
    "hf_token_secret",
    "readiness_probe",
    "sglang_shm_size",
    "pod_monitor",
    "dcgm_exporter",
)

_SECTIONS = {
    "dispatch": DispatchSettings,
    "campaign": CampaignSettings,
    "telemetry": TelemetrySettings,
    "kubernetes": KubernetesSettings,
}


def identity_keys(section: str) -> tuple[str, ...]:
    """The identity keys of a settings section, in CLASSIFICATION order."""
    return tuple(k for k, kind in CLASSIFICATION[section].items() if kind == IDENTITY)


def _section(config: Mapping[str, Any], section: str, kind: Kind) -> dict[str, Any]:
    """The keys of `kind` of one section, defaults filled in (so spelling a default out in the
    config changes nothing). A key whose value is None (an optional setting left unset) is left
    out, so adding an optional key keeps every measurement key made before it."""
    typed = _SECTIONS[section].from_section(config.get(section))  # type: ignore[attr-defined]
    values = typed.as_dict()
    return {
        k: values[k]
        for k, c in CLASSIFICATION[section].items()
        if c == kind and values[k] is not None
    }


def deployment_identity(config: Mapping[str, Any], deployment: Mapping[str, Any]) -> dict[str, Any]:
    """What defines a deployment: the engine, image (by digest), flags and the configuration the
    arm expects it to resolve, on which backend, GPU and model."""
    out = {
        "backend": config["backend"],
        "gpu": dict(config["gpu"]),
        "model": dict(config["model"]),
        **dict(deployment),
    }
    local = LocalSettings.from_section(config.get("local"))
    if config["backend"] == "local" and local.pinned:
        # The cores the engine and its client are pinned to (servelab.deploy.machine_load).
        out["local"] = local.as_dict()
    return out


def run_identity(config: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """What defines one run beyond its deployment and trace: which run it is, the offered load,
    the dispatch protocol, the pass mark and the metric window's sampling step. `run` holds arm, engine, condition, rep and
    offered_load_rps."""
    out = {
        "backend": config["backend"],
        "gpu": dict(config["gpu"]),
        "model": dict(config["model"]),
        **dict(run),
        "dispatch": _section(config, "dispatch", IDENTITY),
        "campaign": _section(config, "campaign", IDENTITY),
        "telemetry": _section(config, "telemetry", IDENTITY),
    }
    if config["backend"] == "sim":
        # The simulated platform defines a simulated measurement; a real one has its own, so
        # the key of a run on real hardware does not depend on it.
        out["sim"] = SimSettings.from_section(config.get("sim")).as_dict()
    return out


def manifest_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The kubernetes settings the rendered manifests are made of (defaults filled in)."""
    values = KubernetesSettings.from_section(config.get("kubernetes")).as_dict()
    return {k: values[k] for k in MANIFEST_KEYS}


def operational_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The operational keys of every section (defaults filled in), as a job reads them at run
    time; faults stay as the config lists them (a job picks its own)."""
    return {section: _section(config, section, OPERATIONAL) for section in _SECTIONS}


def measurement_key(
    *,
    trace_sha256: str,
    deployment: Mapping[str, Any],
    run: Mapping[str, Any],
    resolved: Mapping[str, Any],
) -> str:
    """The sealed measurement's key: SHA-256 of the identity alone. `deployment` and `run` are
    `deployment_identity` and `run_identity`; of the resolved configuration only its values count
    (not the log lines they were read from, whose timestamps change with every start-up)."""
    identity = {
        "trace_sha256": trace_sha256,
        "deployment": dict(deployment),
        "run": dict(run),
        "resolved": {k: resolved.get(k) for k in CONFIG_FIELDS},
    }
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
