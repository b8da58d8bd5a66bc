"""The restart experiment (study §5.4 "Restart measurement", §7.5, Figure 14).

`restart_timeline` deletes the serving pod of a running deployment, waits for it to terminate,
applies the deployment again and records when the replacement was scheduled, pulled its image,
started and became Ready. The GPU node stays provisioned throughout, so the measurement isolates
engine initialisation from node provisioning.

Mechanics: the engine Deployment is deleted first (otherwise its ReplicaSet would recreate the pod
at once, and the new pod would wait for the GPU the old one still holds), then the pod itself;
once the pod is gone the rendered objects are applied again.

Every time comes from the cluster's clocks, never this machine's:

| event | source |
|---|---|
| deleted | the deleted pod's `deletionTimestamp − deletionGracePeriodSeconds` (when deletion was requested) |
| terminated | `Date` header of the first API response saying the old pod no longer exists (resolution: the poll interval, 1 s by default here) |
| scheduled | the new pod's `Scheduled` event (`eventTime`; the scheduler uses the events.k8s.io API) or its `PodScheduled` condition |
| pull_started, pulled | `Pulling` / `Pulled` events (kubelet, 1 s resolution); with the image already on the node there is no `Pulling` event and pull_started = pulled |
| container_started | `Started` event, else the container's `state.running.startedAt` |
| ready | the `Ready` condition's `lastTransitionTime` (quantised by the readiness probe: 60 s initial delay, 10 s period) |

The record (written with servelab.artifacts.write_json; read by servelab.analysis.restarts):

    {"engine": "vllm", "rep": "rep1", "deployment_id": ..., "backend": "kubernetes",
     "events": {"deleted": <unix s>, "terminated": ..., "scheduled": ..., "pull_started": ...,
                "pulled": ..., "container_started": ..., "ready": ...},
     "events_utc": {same keys: RFC 3339}, "extra_events": {"reapplied": ..., "pod_created": ...,
     "container_created": ...}, "phases_s": {"terminate", "schedule", "image_pull", "initialise",
     "unmeasured", "total"}, "sources": {...}, "old_pod": {...}, "new_pod": {...},
     "node_before": {...}, "node_after": {...}, "node_changed": <reason or null>,
     "image_pull_message": ..., "readiness_probe": {...}}
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servelab.artifacts import (
    RESTART_EVENTS,
    restart_events_out_of_order,
    restart_phases,
    write_json,
)
from servelab.deploy.kube_cluster import (
    KubeCluster,
    KubernetesBackendError,
    api_seconds,
    event_time,
    pod_ready,
)
from servelab.deploy.manifests import load_rendered
from servelab.deploy.node import detect_reclamation, observe

__all__ = [
    "RESTART_EVENTS",
    "event_time",
    "phases",
    "restart_timeline",
    "timeline_from_events",
]

log = logging.getLogger(__name__)


def _first(events: Sequence[Mapping[str, Any]], reason: str) -> Mapping[str, Any] | None:
    timed = [(event_time(e), i, e) for i, e in enumerate(events) if e.get("reason") == reason]
    timed = [x for x in timed if x[0] is not None]
    return min(timed, key=lambda x: (x[0], x[1]))[2] if timed else None


def _condition_time(pod: Mapping[str, Any], kind: str) -> float | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return api_seconds(cond.get("lastTransitionTime"))
    return None


def timeline_from_events(
    events: Sequence[Mapping[str, Any]], pod: Mapping[str, Any], container: str | None
) -> tuple[dict[str, float], dict[str, str], dict[str, float | None], str | None]:
    """The new pod's part of the timeline: (times, sources, extra times, Pulled message).

    Raises ValueError naming the first event that cannot be found.
    """
    times: dict[str, float] = {}
    sources: dict[str, str] = {}
    scheduled = _first(events, "Scheduled")
    if scheduled is not None:
        times["scheduled"], sources["scheduled"] = event_time(scheduled), "Scheduled event"  # type: ignore[assignment]
    elif (t := _condition_time(pod, "PodScheduled")) is not None:
        times["scheduled"], sources["scheduled"] = t, "PodScheduled condition"
    pulled = _first(events, "Pulled")
    pulling = _first(events, "Pulling")
    message = pulled.get("message") if pulled is not None else None
    if pulled is not None:
        times["pulled"], sources["pulled"] = event_time(pulled), "Pulled event"  # type: ignore[assignment]
        if pulling is not None:
            times["pull_started"], sources["pull_started"] = event_time(pulling), "Pulling event"  # type: ignore[assignment]
        else:
            times["pull_started"] = times["pulled"]
            sources["pull_started"] = "no Pulling event (image already on the node): = pulled"
    started = _first(events, "Started")
    if started is not None:
        times["container_started"], sources["container_started"] = (
            event_time(started),  # type: ignore[assignment]
            "Started event",
        )
    else:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if container is None or status.get("name") == container:
                running = (status.get("state") or {}).get("running") or {}
                if (t := api_seconds(running.get("startedAt"))) is not None:
                    times["container_started"] = t
                    sources["container_started"] = "containerStatuses.state.running.startedAt"
    if (t := _condition_time(pod, "Ready")) is not None:
        times["ready"], sources["ready"] = t, "Ready condition lastTransitionTime"
    for key in RESTART_EVENTS[2:]:
        if key not in times:
            raise ValueError(
                f"pod {pod['metadata']['name']}: no {key} time in its events or status "
                f"(events seen: {sorted({str(e.get('reason')) for e in events})})"
            )
    created = _first(events, "Created")
    extra = {
        "pod_created": api_seconds((pod.get("metadata") or {}).get("creationTimestamp")),
        "container_created": event_time(created) if created is not None else None,
    }
    return times, sources, extra, message


def phases(events: Mapping[str, float]) -> dict[str, float]:
    """Figure 14's phases and their total from the seven event times (seconds, to the µs):
    servelab.artifacts.restart_phases, which the analysis reads restart.json with too."""
    return {k: round(v, 6) for k, v in restart_phases(events).items()}


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _rep_from_path(out_json: Path) -> str | None:
    """`.../rep2/restart.json` or `.../restart2/restart.json` -> that folder name;
    `.../2.json` -> `rep2`; None when the path names no repetition."""
    for part in (out_json.parent.name, out_json.stem):
        if re.fullmatch(r"(rep|restart)\d+", part):
            return part
        if part.isdigit():
            return f"rep{int(part)}"
    return None


def restart_timeline(
    cluster: KubeCluster,
    deployment_id: str,
    manifest_path: str | os.PathLike[str],
    out_json: str | os.PathLike[str],
    *,
    rep: str | None = None,
    place: Callable[[Sequence[Mapping[str, Any]]], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Run one restart of a Ready deployment on `cluster` and write its record to `out_json`.

    `rep` defaults to what the path says (`.../rep2/restart.json`, `.../restart2/restart.json`
    or `.../2.json`). `place` pins the rendered objects to the node slot's node as they are
    applied again (the kubernetes backend's `place`; None: applied as rendered).
    """
    out_path = Path(out_json)
    rep = rep or _rep_from_path(out_path)
    if rep is None:
        raise ValueError(f"{out_path}: cannot tell the repetition from the path; pass rep=")
    objects = load_rendered(manifest_path)
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    if [d["metadata"]["name"] for d in deployments] != [deployment_id]:
        raise KubernetesBackendError(f"{manifest_path}: expected the Deployment {deployment_id}")
    labels = deployments[0]["metadata"].get("labels") or {}
    engine = labels.get("app.kubernetes.io/name")
    if place is not None:
        objects = place(objects)
    old = cluster.engine_pod(deployment_id)
    if old is None or not pod_ready(old):
        raise KubernetesBackendError(
            f"deployment {deployment_id}: no Ready engine pod to restart (deploy it first)"
        )
    old_name = old["metadata"]["name"]
    node_before = observe(cluster, deployment_id, pod=old, container=engine)

    # Delete the Deployment (so nothing recreates the pod), then the pod itself.
    cluster.delete_engine_deployment(deployment_id)
    meta = cluster.delete_pod(old_name).get("metadata") or {}
    deletion = api_seconds(meta.get("deletionTimestamp"))
    if deletion is None:
        raise KubernetesBackendError(f"pod {old_name}: the API did not report its deletion time")
    deleted = deletion - float(meta.get("deletionGracePeriodSeconds") or 0)
    terminated = cluster.wait_pod_deleted(old_name)
    cluster.wait_pods_gone(deployment_id)

    # Apply again and wait for the replacement to become Ready.
    reapplied: float | None = None
    for obj in objects:
        line, when = cluster.apply_object(obj)
        log.info("%s", line)
        if obj["kind"] == "Deployment" and when is not None:
            reapplied = when.timestamp()
    new = cluster.wait_ready(deployment_id, container=engine)
    new_name = new["metadata"]["name"]
    events = cluster.pod_events(new_name)
    times, sources, extra, pull_message = timeline_from_events(events, new, engine)
    times["deleted"], sources["deleted"] = deleted, "deletionTimestamp - deletionGracePeriodSeconds"
    times["terminated"], sources["terminated"] = (
        terminated,
        "Date header of the first 404 for the old pod",
    )
    ordered = {k: times[k] for k in RESTART_EVENTS}
    reversed_pair = restart_events_out_of_order(ordered)
    if reversed_pair is not None:
        a, b = reversed_pair
        raise KubernetesBackendError(
            f"restart of {deployment_id}: {b} ({_iso(ordered[b])}) precedes {a} "
            f"({_iso(ordered[a])}); clocks disagree"
        )
    node_after = observe(cluster, deployment_id, pod=new, container=engine)
    probe = cluster.settings.readiness_probe
    record = {
        "engine": engine,
        "rep": rep,
        "deployment_id": deployment_id,
        "backend": "kubernetes",
        "namespace": cluster.namespace,
        "events": ordered,
        "events_utc": {k: _iso(v) for k, v in ordered.items()},
        "extra_events": {"reapplied": reapplied, **extra},
        "phases_s": phases(ordered),
        "sources": {k: sources[k] for k in RESTART_EVENTS},
        "old_pod": {"name": old_name, "uid": old["metadata"].get("uid")},
        "new_pod": {"name": new_name, "uid": new["metadata"].get("uid")},
        "node_before": node_before,
        "node_after": node_after,
        "node_changed": detect_reclamation(_node_only(node_before), _node_only(node_after)),
        "image_pull_message": pull_message,
        "readiness_probe": {"initial_delay_s": probe.initial_delay_s, "period_s": probe.period_s},
    }
    write_json(out_path, record)
    return record


def _node_only(identity: Mapping[str, Any]) -> dict[str, Any]:
    """Node identity without the pod's part: a restart replaces the pod by design."""
    return {
        k: v for k, v in identity.items() if not k.startswith("pod") and k != "container_restarts"
    }
