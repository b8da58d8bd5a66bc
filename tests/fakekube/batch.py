"""The fake cluster's Job controller and `exec` (of `tar` only): what `servelab campaign submit`,
`status`, `logs` and `fetch` meet (servelab.deploy.kube_job).

The controller follows the batch/v1 Job API of Kubernetes 1.35 as servelab's Job uses it: one
pod at a time (completions 1, parallelism 1); a pod that is gone or failed counts as failed and is
replaced only once it has terminated (`podReplacementPolicy: Failed`); past `backoffLimit` the Job
fails (FailureTarget, then Failed, reason BackoffLimitExceeded); a pod that exits 0 completes it
(SuccessCriteriaMet, then Complete). Disruption conditions (`podFailurePolicy`) are not modelled:
every lost pod counts.
"""

from __future__ import annotations

import copy
import io
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cluster import ApiError, rfc3339

if TYPE_CHECKING:
    from .cluster import FakeCluster, _PodState

_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def job_pods(cluster: FakeCluster, job_name: str) -> list[_PodState]:
    return [p for p in cluster.pods.values() if p.job == job_name]


def _condition(kind: str, now: float, reason: str = "", message: str = "") -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": kind,
        "status": "True",
        "lastProbeTime": rfc3339(now),
        "lastTransitionTime": rfc3339(now),
    }
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def _finished(job: dict[str, Any]) -> bool:
    return any(
        c["type"] in ("Complete", "Failed") and c["status"] == "True"
        for c in job["status"].get("conditions") or []
    )


def _count(job: dict[str, Any], pods: list[_PodState]) -> None:
    """Each terminated pod once: succeeded when it exited 0, else failed (a pod deleted or
    vanished with its node counts when it is gone)."""
    status = job["status"]
    for pod in pods:
        if pod.counted:
            continue
        if pod.finished is not None and pod.exit_code == 0:
            status["succeeded"] = status.get("succeeded", 0) + 1
        elif pod.finished is not None or pod.gone is not None:
            status["failed"] = status.get("failed", 0) + 1
        else:
            continue
        pod.counted = True


def _create_pod(cluster: FakeCluster, ns: str, job: dict[str, Any]) -> None:
    template = job["spec"]["template"]
    name = job["metadata"]["name"]
    uid = job["metadata"]["uid"]
    cluster._pod_counter += 1
    n = cluster._pod_counter * 104729
    suffix = "".join(_ALPHABET[(n // len(_ALPHABET) ** i) % len(_ALPHABET)] for i in range(5))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{suffix}",
            "generateName": f"{name}-",
            "namespace": ns,
            "uid": cluster.uid(),
            "resourceVersion": cluster.rv(),
            "creationTimestamp": rfc3339(cluster.now),
            "labels": {
                **(template["metadata"].get("labels") or {}),
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {**copy.deepcopy(template["spec"]), "schedulerName": "default-scheduler"},
    }
    cluster.add_pod(ns, pod, owner_job=name)
    job["status"].setdefault("startTime", rfc3339(cluster.now))


def _reconcile_job(cluster: FakeCluster, ns: str, job: dict[str, Any]) -> None:
    status = job.setdefault("status", {})
    pods = job_pods(cluster, job["metadata"]["name"])
    _count(job, pods)
    if not _finished(job):
        if status.get("succeeded", 0) >= 1:
            status["conditions"] = [
                _condition("SuccessCriteriaMet", cluster.now, "CompletionsReached"),
                _condition("Complete", cluster.now, "CompletionsReached"),
            ]
            status["completionTime"] = rfc3339(cluster.now)
        elif status.get("failed", 0) > int(job["spec"].get("backoffLimit", 6)):
            message = "Job has reached the specified backoff limit"
            status["conditions"] = [
                _condition("FailureTarget", cluster.now, "BackoffLimitExceeded", message),
                _condition("Failed", cluster.now, "BackoffLimitExceeded", message),
            ]
        elif not [p for p in pods if p.gone is None and p.finished is None]:
            _create_pod(cluster, ns, job)
            pods = job_pods(cluster, job["metadata"]["name"])
    live = [p for p in pods if p.gone is None and p.finished is None]
    status["active"] = sum(1 for p in live if p.delete_requested is None)
    status["ready"] = sum(1 for p in live if p.ready is not None and p.delete_requested is None)
    status["terminating"] = sum(1 for p in live if p.delete_requested is not None)
    status.setdefault("uncountedTerminatedPods", {})


def reconcile_jobs(cluster: FakeCluster) -> None:
    for (res, ns, _name), job in sorted(cluster.objects.items()):
        if res == "jobs":
            _reconcile_job(cluster, ns, job)


def delete_job(cluster: FakeCluster, ns: str, job: dict[str, Any]) -> dict[str, Any]:
    """DELETE of a Job: its pods are deleted with it (background propagation)."""
    for pod in job_pods(cluster, job["metadata"]["name"]):
        pod.job = None  # orphaned: the deleted Job no longer counts them
        if pod.gone is None and pod.delete_requested is None:
            cluster._request_pod_deletion(pod)
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": job["metadata"]["name"], "group": "batch", "kind": "jobs"},
    }


# ----------------------------------------------------------------------------- exec


def _volume_folder(cluster: FakeCluster, pod: dict[str, Any], container: str, path: str) -> Path:
    """The local folder standing for `path` in the container: through its volume mount and the
    claim's content (cluster.volumes)."""
    spec = pod["spec"]
    mounts = next(c for c in spec["containers"] if c["name"] == container).get("volumeMounts")
    for mount in mounts or []:
        root = mount["mountPath"].rstrip("/")
        if path == root or path.startswith(root + "/"):
            volume = next(v for v in spec.get("volumes") or [] if v["name"] == mount["name"])
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim in cluster.volumes:
                return cluster.volumes[claim] / path[len(root) :].lstrip("/")
    raise ApiError(400, "BadRequest", f"fake exec: {path} is on no volume the fake holds")


def exec_in_pod(
    cluster: FakeCluster, ns: str, name: str, container: str | None, command: list[str]
) -> tuple[bytes, bytes, int]:
    """Run `command` in the pod's container: (stdout, stderr, exit code). Only `tar -czf - -C
    DIR PATH...` runs (what servelab campaign fetch sends); anything else exits 127."""
    pod = cluster.get("pods", ns, name)
    state = cluster.pods[name]
    container = container or state.engine
    if state.started is None or state.finished is not None or state.gone is not None:
        raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is not running')
    if len(command) < 6 or command[:4] != ["tar", "-czf", "-", "-C"]:
        return b"", f"fake exec: not run: {command}\n".encode(), 127
    base = _volume_folder(cluster, pod, container, command[4])
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for member in command[5:]:
            source = base / member
            if not source.exists():
                message = f"tar: {member}: Cannot stat: No such file or directory\n"
                return b"", message.encode(), 2
            tar.add(source, arcname=member)
    return buffer.getvalue(), b"", 0
