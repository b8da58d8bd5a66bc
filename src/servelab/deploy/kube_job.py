"""The campaign Job's cluster operations, as the workstation does them (`servelab campaign
submit`, `status --cluster`, `logs`, `fetch`; docs/kubernetes.md, "The campaign as a Job").

It owns: applying the campaign's rendered objects (servelab.deploy.job_manifests), never two
Jobs on one volume; the Job's state and its pods; the campaign pod's log; and copying
`results/` out of the campaign volume.

The copy is `kubectl cp`'s: `tar` run through the exec API in a helper pod that mounts the
volume read-only (`render_fetch_pod`), its output streamed to a local file over the WebSocket
(binary frames, never held in memory), then unpacked into a staging folder beside the
destination and moved into it file by file (each file atomically). Only regular files and
folders under `results/` are accepted from the archive. While the campaign's pod runs, the helper
is placed on its node: the volume is ReadWriteOnce, attached to one node at a time.

Nothing here runs inside the Job, and the Job's Role does not allow it (creating pods, exec):
tests/unit/test_campaign_rbac.py derives the Role from every other module's API calls, and checks
that only the workstation's commands (servelab.campaign.job) import this one.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, cast

import yaml

from servelab.deploy.job_manifests import (
    CAMPAIGN_LABEL,
    CONTAINER,
    TARGETS_ANNOTATION,
    WORK_DIR,
    fetch_pod_name,
    render_fetch_pod,
)
from servelab.deploy.kube_cluster import (
    FATAL_WAITING,
    KubeCluster,
    KubernetesBackendError,
    api_message,
    redact,
    unless_not_found,
)
from servelab.grid.settings import KubernetesSettings

__all__ = [
    "TAR_COMMAND",
    "CampaignCluster",
    "CampaignPod",
    "CampaignState",
    "extract_results",
    "job_phase",
]

log = logging.getLogger(__name__)

# What the helper pod runs: results/ of the campaign volume, as a gzipped tar on stdout.
TAR_COMMAND = ("tar", "-czf", "-", "-C", WORK_DIR, "results")
FETCH_CONTAINER = "fetch"
_STDOUT, _STDERR, _ERROR = 1, 2, 3  # the exec channels (channel.k8s.io, v4 and v5)


@dataclass(frozen=True)
class CampaignPod:
    """One pod of the campaign Job, as the API shows it now."""

    name: str
    phase: str
    node: str | None
    created: str | None
    started: str | None
    exit_code: int | None
    reason: str
    deleting: bool


@dataclass(frozen=True)
class CampaignState:
    """The campaign Job now: `phase` is `not submitted`, `pending`, `running`, `succeeded` or
    `failed` (`reason`, `message`: the condition's); the counts are the Job's (`failed` counts
    pods lost, except to disruptions)."""

    name: str
    namespace: str
    phase: str
    reason: str = ""
    message: str = ""
    targets: str = ""
    started: str | None = None
    completed: str | None = None
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    backoff_limit: int | None = None
    image: str | None = None
    pods: tuple[CampaignPod, ...] = ()


def job_phase(job: Mapping[str, Any]) -> tuple[str, str, str]:
    """(phase, reason, message) of a Job (JSON): `succeeded` or `failed` from its terminal
    condition, else `active` (the caller tells pending from running by its pod)."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "succeeded", str(cond.get("reason") or ""), str(cond.get("message") or "")
        if cond.get("type") in ("Failed", "FailureTarget"):
            return "failed", str(cond.get("reason") or ""), str(cond.get("message") or "")
    return "active", "", ""


def _pod_summary(pod: Mapping[str, Any]) -> CampaignPod:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    containers = [c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER]
    state = (containers[0].get("state") or {}) if containers else {}
    running, terminated = state.get("running") or {}, state.get("terminated") or {}
    waiting = state.get("waiting") or {}
    return CampaignPod(
        name=str(meta.get("name")),
        phase=str(status.get("phase") or "Unknown"),
        node=(pod.get("spec") or {}).get("nodeName"),
        created=meta.get("creationTimestamp"),
        started=running.get("startedAt") or terminated.get("startedAt"),
        exit_code=terminated.get("exitCode"),
        reason=str(terminated.get("reason") or waiting.get("reason") or status.get("reason") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _job_image(job: Mapping[str, Any] | None) -> str | None:
    """The image the Job's snakemake container runs."""
    template = ((job or {}).get("spec") or {}).get("template") or {}
    for container in (template.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER:
            return str(container.get("image"))
    return None


def _checked_member(member: tarfile.TarInfo) -> tarfile.TarInfo:
    path = PurePosixPath(member.name)
    inside = bool(path.parts) and path.parts[0] == "results" and ".." not in path.parts
    if path.is_absolute() or not inside or not (member.isfile() or member.isdir()):
        raise KubernetesBackendError(
            f"campaign fetch: refused archive member {member.name!r} (only files and folders "
            "under results/)"
        )
    return member


def extract_results(archive: Path, dest: Path) -> list[Path]:
    """Unpack `results/` of a gzipped tar into `dest` (created if missing): each file moved into
    place atomically, files `dest` has and the archive lacks kept. Returns the files written."""
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".servelab-fetch-", dir=dest.parent))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [_checked_member(m) for m in tar.getmembers()]
            # the data filter as well where this Python has it (3.11.4 and later)
            extra: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(staging, members=members, **extra)  # members checked above
        root = staging / "results"
        written = []
        for path in sorted(root.rglob("*")) if root.is_dir() else []:
            if path.is_file():
                target = dest / path.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                path.replace(target)  # atomic: the same file system
                written.append(target)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _channel_frames(sock: Any, seconds_left: Callable[[], float]) -> Iterator[tuple[int, bytes]]:
    """(channel, data) of each message of an exec's WebSocket (channel.k8s.io: the first byte
    names the stream) until the server closes it; KubernetesBackendError when `seconds_left`
    runs out first."""
    from websocket import ABNF, WebSocketConnectionClosedException, WebSocketTimeoutException

    while True:
        left = seconds_left()
        if left <= 0:
            raise KubernetesBackendError("campaign fetch: the copy did not end in time")
        sock.settimeout(left)
        try:
            opcode, frame = sock.recv_data_frame(True)
        except WebSocketConnectionClosedException:
            return
        except WebSocketTimeoutException as exc:
            raise KubernetesBackendError("campaign fetch: the copy did not end in time") from exc
        if opcode == ABNF.OPCODE_CLOSE:
            return
        data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
        if opcode in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) and data:
            yield data[0], data[1:]


def _exit_code(status: bytes) -> int:
    """The exit code in an exec's final status (metav1.Status on the error channel)."""
    if not status.strip():
        raise KubernetesBackendError("campaign fetch: the exec ended without an exit status")
    body = json.loads(status.decode("utf-8", errors="replace"))
    if body.get("status") == "Success":
        return 0
    for cause in (body.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause["message"])
    raise KubernetesBackendError(f"campaign fetch: exec failed: {body.get('message')}")


class CampaignCluster:
    """The campaign Job of `settings` (`kubernetes.campaign_job`) in its namespace."""

    def __init__(
        self,
        api_client: Any,
        settings: Mapping[str, Any] | KubernetesSettings | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes import client  # lazy: see servelab.deploy.kube_cluster

        self.cluster = KubeCluster(api_client, settings, sleep=sleep, monotonic=monotonic)
        self.settings = self.cluster.settings
        self.namespace = self.cluster.namespace
        self.name = self.settings.campaign_job.name
        self.api_client = api_client
        self.core = self.cluster.core
        self.batch = client.BatchV1Api(api_client)
        self.rbac = client.RbacAuthorizationV1Api(api_client)
        self._sleep, self._monotonic = sleep, monotonic
        self._kw: dict[str, Any] = {"_request_timeout": self.settings.timeouts.request_s}

    def _json(self, obj: Any) -> dict[str, Any]:
        return cast("dict[str, Any]", self.api_client.sanitize_for_serialization(obj))

    def _polls(self, timeout_s: float) -> int:
        """The iteration bound of a wait: enough polls to cover the timeout, plus one."""
        return max(1, math.ceil(timeout_s / max(self.settings.timeouts.poll_s, 1e-3))) + 1

    # ------------------------------------------------------------------ submit

    def read_job(self) -> dict[str, Any] | None:
        """The campaign Job (JSON), or None when there is none."""
        job = unless_not_found(
            lambda: self.batch.read_namespaced_job(self.name, self.namespace, **self._kw)
        )
        return None if job is None else self._json(job)

    def submit(self, objects: list[dict[str, Any]], *, replace: bool = False) -> list[str]:
        """Apply the rendered campaign objects, the Job last; one line per object.

        A Job that is still active is never touched (two snakemakes must not share the volume);
        a finished one is deleted first only with `replace` (its volume and results stay).
        """
        lines = []
        current = self.read_job()
        if current is not None:
            phase = job_phase(current)[0]
            if phase == "active":
                raise KubernetesBackendError(
                    f"Job/{self.name} in namespace {self.namespace} is still active: one campaign "
                    "per volume (servelab campaign status --cluster, logs; kubectl delete job "
                    f"{self.name} to stop it)"
                )
            if not replace:
                raise KubernetesBackendError(
                    f"Job/{self.name} exists ({phase}); submit --replace deletes it and submits "
                    "again on the same volume (nothing finished is measured again)"
                )
            self._delete_job()
            lines.append(f"Job/{self.name} deleted ({phase})")
        lines += [self.apply_object(obj) for obj in objects]
        return lines

    def _delete_job(self) -> None:
        from kubernetes.client.exceptions import ApiException  # lazy

        self.batch.delete_namespaced_job(
            self.name, self.namespace, propagation_policy="Background", **self._kw
        )
        timeout = self.settings.timeouts.delete_s
        deadline = self._monotonic() + timeout
        for _ in range(self._polls(timeout)):
            try:
                self.batch.read_namespaced_job(self.name, self.namespace, **self._kw)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            if self._monotonic() >= deadline:
                break
            self._sleep(self.settings.timeouts.poll_s)
        raise KubernetesBackendError(f"Job/{self.name}: still there after {timeout:.0f} s")

    def apply_object(self, obj: Mapping[str, Any]) -> str:
        """Create one object; when it exists, replace it (roles, bindings, the configuration) or
        keep it (the ServiceAccount, the volume). A Job is only ever created."""
        from kubernetes.client.exceptions import ApiException  # lazy

        kind, name = str(obj["kind"]), str(obj["metadata"]["name"])
        ns = obj["metadata"].get("namespace", self.namespace)
        if ns != self.namespace:
            raise KubernetesBackendError(
                f"{kind}/{name}: rendered for namespace {ns!r}, not {self.namespace!r}"
            )
        create, read, replace = self._verbs(kind, name)
        try:
            create(dict(obj))
            return f"{kind}/{name} created"
        except ApiException as exc:
            if exc.status == 404:
                raise KubernetesBackendError(
                    f"{kind}/{name}: namespace {self.namespace!r} not found; create it first "
                    "(docs/kubernetes.md)"
                ) from exc
            if exc.status != 409 or kind == "Job":
                raise KubernetesBackendError(
                    f"{kind}/{name}: create failed: {api_message(exc)}"
                ) from exc
        if replace is None:
            return f"{kind}/{name} kept"
        current = self._json(read())
        body = {**obj, "metadata": {**obj["metadata"]}}
        body["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
        try:
            replace(body)
        except ApiException as exc:
            raise KubernetesBackendError(
                f"{kind}/{name}: replace failed: {api_message(exc)}"
            ) from exc
        return f"{kind}/{name} replaced"

    def _verbs(
        self, kind: str, name: str
    ) -> tuple[Callable[[Any], Any], Callable[[], Any], Callable[[Any], Any] | None]:
        """(create, read, replace) of a kind the campaign renders; replace None: kept as is."""
        core, rbac, ns, kw = self.core, self.rbac, self.namespace, self._kw
        verbs: dict[str, tuple[Callable[[Any], Any], Callable[[], Any], Any]] = {
            "ServiceAccount": (
                lambda b: core.create_namespaced_service_account(ns, b, **kw),
                lambda: core.read_namespaced_service_account(name, ns, **kw),
                None,
            ),
            "ClusterRole": (
                lambda b: rbac.create_cluster_role(b, **kw),
                lambda: rbac.read_cluster_role(name, **kw),
                lambda b: rbac.replace_cluster_role(name, b, **kw),
            ),
            "ClusterRoleBinding": (
                lambda b: rbac.create_cluster_role_binding(b, **kw),
                lambda: rbac.read_cluster_role_binding(name, **kw),
                lambda b: rbac.replace_cluster_role_binding(name, b, **kw),
            ),
            "Role": (
                lambda b: rbac.create_namespaced_role(ns, b, **kw),
                lambda: rbac.read_namespaced_role(name, ns, **kw),
                lambda b: rbac.replace_namespaced_role(name, ns, b, **kw),
            ),
            "RoleBinding": (
                lambda b: rbac.create_namespaced_role_binding(ns, b, **kw),
                lambda: rbac.read_namespaced_role_binding(name, ns, **kw),
                lambda b: rbac.replace_namespaced_role_binding(name, ns, b, **kw),
            ),
            "PersistentVolumeClaim": (
                lambda b: core.create_namespaced_persistent_volume_claim(ns, b, **kw),
                lambda: core.read_namespaced_persistent_volume_claim(name, ns, **kw),
                None,
            ),
            "ConfigMap": (
                lambda b: core.create_namespaced_config_map(ns, b, **kw),
                lambda: core.read_namespaced_config_map(name, ns, **kw),
                lambda b: core.replace_namespaced_config_map(name, ns, b, **kw),
            ),
            "Job": (
                lambda b: self.batch.create_namespaced_job(ns, b, **kw),
                lambda: self.batch.read_namespaced_job(name, ns, **kw),
                None,
            ),
        }
        if kind not in verbs:
            raise KubernetesBackendError(f"{kind}/{name}: not a kind of the campaign's objects")
        return verbs[kind]

    # ------------------------------------------------------------------ status

    def pods(self) -> list[dict[str, Any]]:
        """The campaign Job's pods (JSON), oldest first."""
        listed = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{CAMPAIGN_LABEL}={self.name}", **self._kw
        )
        pods = [self._json(p) for p in listed.items or []]
        return sorted(
            pods,
            key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]),
        )

    def state(self) -> CampaignState:
        """The campaign Job and its pods now."""
        job = self.read_job()
        if job is None:
            return CampaignState(self.name, self.namespace, "not submitted")
        phase, reason, message = job_phase(job)
        pods = tuple(_pod_summary(p) for p in self.pods())
        if phase == "active":
            running = any(p.phase == "Running" and not p.deleting for p in pods)
            phase = "running" if running else "pending"
        status, spec = job.get("status") or {}, job.get("spec") or {}
        return CampaignState(
            name=self.name,
            namespace=self.namespace,
            phase=phase,
            reason=reason,
            message=message,
            targets=str(((job["metadata"].get("annotations") or {}).get(TARGETS_ANNOTATION)) or ""),
            started=status.get("startTime"),
            completed=status.get("completionTime"),
            active=int(status.get("active") or 0),
            succeeded=int(status.get("succeeded") or 0),
            failed=int(status.get("failed") or 0),
            backoff_limit=spec.get("backoffLimit"),
            image=_job_image(job),
            pods=pods,
        )

    # ------------------------------------------------------------------ logs

    def newest_pod(self) -> dict[str, Any]:
        pods = self.pods()
        if not pods:
            raise KubernetesBackendError(
                f"Job/{self.name} in namespace {self.namespace} has no pod (servelab campaign "
                "status --cluster says why)"
            )
        return pods[-1]

    def log(self, *, tail_lines: int | None = None, pod_name: str | None = None) -> tuple[str, str]:
        """(pod name, its snakemake log, redacted) of the newest pod, or of `pod_name`."""
        name = pod_name or str(self.newest_pod()["metadata"]["name"])
        return name, self.cluster.pod_log(name, CONTAINER, tail_lines=tail_lines)

    def follow(self, write: Callable[[str], None], *, tail_lines: int | None = None) -> str:
        """Stream the newest pod's log to `write`, line by line (redacted), until the container
        ends or the connection closes; returns the pod's name."""
        name = str(self.newest_pod()["metadata"]["name"])
        kwargs: dict[str, Any] = {"container": CONTAINER, "follow": True, "_preload_content": False}
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        # with _preload_content=False the client returns the raw urllib3 response, not a str
        response: Any = self.core.read_namespaced_pod_log(name, self.namespace, **kwargs)
        pending = b""
        for chunk in response.stream(64 * 1024):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                write(redact(line.decode("utf-8", errors="replace")) + "\n")
        if pending:
            write(redact(pending.decode("utf-8", errors="replace")))
        return name

    # ------------------------------------------------------------------ fetch

    def fetch(self, dest: Path, *, image: str | None = None) -> list[Path]:
        """Copy `results/` of the campaign volume into `dest` (see the module docstring); the
        helper pod runs the Job's image (else `image`, else `campaign_job.image`) and is deleted
        whatever happens. Returns the files written."""
        chosen = _job_image(self.read_job()) or image or self.settings.campaign_job.image
        if not chosen:
            raise KubernetesBackendError(
                "campaign fetch: no image for the helper pod (no Job to take it from; give "
                "--image or kubernetes.campaign_job.image)"
            )
        running = [p for p in self.pods() if (p.get("status") or {}).get("phase") == "Running"]
        node = (running[-1].get("spec") or {}).get("nodeName") if running else None
        body = yaml.safe_load(render_fetch_pod(self.settings, chosen, node_name=node))
        name = fetch_pod_name(self.settings)
        if self.cluster.delete_pod(name):  # one left by an interrupted fetch
            self.cluster.wait_pod_deleted(name)
        self.core.create_namespaced_pod(self.namespace, body, **self._kw)
        try:
            self._wait_running(name)
            dest = Path(dest).resolve()
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".servelab-fetch-", dir=dest.parent) as tmp:
                archive = Path(tmp) / "results.tar.gz"
                self._exec_tar(name, archive)
                return extract_results(archive, dest)
        finally:
            self.cluster.delete_pod(name)

    def _wait_running(self, name: str) -> None:
        """Poll until the helper pod runs; fail at once on a state that does not recover."""
        timeout = self.settings.timeouts.ready_s
        deadline = self._monotonic() + timeout
        pod: dict[str, Any] = {}
        for _ in range(self._polls(timeout)):
            pod = self._json(self.core.read_namespaced_pod(name, self.namespace, **self._kw))
            summary, status = _pod_summary(pod), pod.get("status") or {}
            statuses = status.get("containerStatuses") or []
            waiting = ((statuses[0].get("state") or {}).get("waiting") or {}) if statuses else {}
            if summary.phase == "Running" and statuses and statuses[0].get("started"):
                return
            if summary.phase in ("Failed", "Succeeded") or waiting.get("reason") in FATAL_WAITING:
                raise KubernetesBackendError(
                    f"campaign fetch: helper pod {name} cannot run (phase {summary.phase}, "
                    f"{waiting.get('reason') or status.get('reason') or 'no reason given'})"
                )
            if self._monotonic() >= deadline:
                break
            self._sleep(self.settings.timeouts.poll_s)
        raise KubernetesBackendError(
            f"campaign fetch: helper pod {name} not running after {timeout:.0f} s "
            f"(phase {(pod.get('status') or {}).get('phase')})"
        )

    def _exec_tar(self, name: str, archive: Path) -> None:
        """Run TAR_COMMAND in the helper pod and stream its stdout into `archive`, frame by
        frame as the WebSocket delivers them (the client's own buffers would hold, and copy,
        the whole archive)."""
        from kubernetes.stream import stream  # lazy

        client = stream(
            self.core.connect_get_namespaced_pod_exec,
            name,
            self.namespace,
            command=list(TAR_COMMAND),
            container=FETCH_CONTAINER,
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
            binary=True,
            _preload_content=False,
        )
        deadline = self._monotonic() + self.settings.campaign_job.fetch_timeout_s
        errors, status = bytearray(), bytearray()
        try:
            with archive.open("wb") as out:
                for channel, data in _channel_frames(
                    client.sock, lambda: deadline - self._monotonic()
                ):
                    if channel == _STDOUT:
                        out.write(data)
                    elif channel == _STDERR:
                        errors += data
                    elif channel == _ERROR:
                        status += data
        finally:
            client.close()
        code = _exit_code(bytes(status))
        if code != 0:
            text = redact(bytes(errors).decode("utf-8", errors="replace")).strip()
            raise KubernetesBackendError(f"campaign fetch: tar exited {code}: {text}")
