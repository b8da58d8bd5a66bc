"""Cluster operations for servelab's engines, through the official `kubernetes` client: what the
kubernetes backend (servelab.deploy.kubernetes) and the restart experiment (servelab.deploy.restart)
do to a cluster, and nothing of what a deployment means.

It owns: client construction (`make_api_client`); the API verbs (create, replace, delete, every
call with a request timeout) and `apply` of rendered objects; the engine pods' lifecycle (the
engine pod of a deployment, deleting pods, retiring other engines, teardown) and every wait on it
(Ready, terminated, gone: each a loop bounded both in iterations and by a monotonic deadline, the
clock and sleep injectable so tests run in milliseconds; `wait_for` is that loop for any check);
the gated-pod annotation on a Deployment (which pod passed the gate: the gate itself is the
campaign's); reading, listing and labelling nodes (servelab.deploy.node decides which node a slot
takes); fetching pod logs (redacted of Hugging Face tokens) and events; the API server's clocks and
errors. Every API call servelab makes is in this module.

The `kubernetes` client package is imported inside the functions that call it (its ApiException,
its API classes): importing it takes about half a second, which the sim and local backends never
need.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, TypeVar, cast

from servelab.deploy.manifests import load_rendered
from servelab.grid.settings import KubernetesSettings

__all__ = [
    "DEPLOYMENT_LABEL",
    "ENGINE_SELECTOR",
    "GATED_ANNOTATION",
    "SERVED_ANNOTATION",
    "DeployTimeout",
    "KubeCluster",
    "KubernetesBackendError",
    "PodFailed",
    "api_message",
    "api_seconds",
    "event_time",
    "header_time",
    "make_api_client",
    "parse_api_time",
    "pod_ready",
    "redact",
    "unless_not_found",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
# `patch_node` sends a dict body as a JSON merge patch only when told: the client's default
# Content-Type for PATCH is application/json-patch+json (a list of operations).
MERGE_PATCH = "application/merge-patch+json"

ENGINE_SELECTOR = "app.kubernetes.io/part-of=servelab,app.kubernetes.io/component=engine"
DEPLOYMENT_LABEL = "servelab.dev/deployment"
# Set on the Deployment once a pod's start-up log passed the gate: the uid of that pod. A run
# re-reads the log only when the current pod is another one (kubelet rotates container logs, so
# the start-up lines of a long-running pod may no longer be readable).
GATED_ANNOTATION = "servelab.dev/gated-pod-uid"
# The traces the engine pod has been sent since it started, as JSON {"pod": uid, "traces": [sha256]}:
# its prefix cache may hold their prompts (servelab.deploy.prompt_cache).
SERVED_ANNOTATION = "servelab.dev/served-traces"
POD_MONITOR = ("monitoring.coreos.com", "v1", "podmonitors")
# Replacing an object another job changed meanwhile (409 Conflict): read it again, this often.
REPLACE_ATTEMPTS = 5
# Container states that do not recover by waiting: fail at once rather than at the timeout.
FATAL_WAITING = {"CreateContainerConfigError", "InvalidImageName", "CrashLoopBackOff"}
# Environment variables that may hold a Hugging Face token in *our* process.
TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_API_TOKEN")
_HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{20,}")


class KubernetesBackendError(RuntimeError):
    """The cluster did not do what a deployment needs; the message says what and where."""


def parse_api_time(value: Any) -> datetime | None:
    """An API timestamp (RFC 3339 string, as the client serialises it, or a datetime) in UTC."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        dt = value
    else:
        text = str(value).replace("Z", "+00:00")
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def api_seconds(value: Any) -> float | None:
    """An API timestamp as unix seconds (None when absent or unreadable)."""
    dt = parse_api_time(value)
    return None if dt is None else dt.timestamp()


def event_time(event: Mapping[str, Any]) -> float | None:
    """When an event (core/v1 JSON) happened, unix seconds: `eventTime` (events.k8s.io
    reporters such as the scheduler), else `firstTimestamp` (kubelet), else `lastTimestamp`, else
    the event object's creation time."""
    for value in (
        event.get("eventTime"),
        event.get("firstTimestamp"),
        event.get("lastTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        t = api_seconds(value)
        if t is not None:
            return t
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """True when the pod (JSON) has the condition Ready=True."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def header_time(headers: Any) -> datetime | None:
    """The API server's `Date` response header (its clock, 1 s resolution)."""
    if not headers:
        return None
    value = headers.get("Date") or headers.get("date")
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).astimezone(UTC)
    except (TypeError, ValueError):
        return None


def api_message(exc: Any) -> str:
    """An ApiException as `<status> <reason>: <message>` from the Status object in its body."""
    try:
        body = json.loads(exc.body or "{}")
        return f"{exc.status} {body.get('reason', '')}: {body.get('message', exc.reason)}"
    except (TypeError, ValueError):
        return f"{exc.status} {exc.reason}"


def unless_not_found(call: Callable[[], _T]) -> _T | None:
    """`call()`, or None when the API answers 404 (the object is gone); other errors propagate."""
    from kubernetes.client.exceptions import ApiException  # lazy: see the module docstring

    try:
        return call()
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None


def make_api_client(kubeconfig: str | None, context: str | None) -> Any:
    """A `kubernetes.client.ApiClient`: from `kubeconfig`/`context` when given; else in-cluster
    when running in a pod; else $KUBECONFIG or ~/.kube/config."""
    from kubernetes import client  # lazy: see the module docstring
    from kubernetes import config as kconfig

    try:
        if kubeconfig or context:
            path = str(Path(kubeconfig).expanduser()) if kubeconfig else None
            # kubernetes.config's loaders are unannotated (the client's models are typed)
            return kconfig.new_client_from_config(config_file=path, context=context)  # type: ignore[no-untyped-call]
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            kconfig.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        return kconfig.new_client_from_config()  # type: ignore[no-untyped-call]
    except (kconfig.ConfigException, OSError) as exc:
        raise KubernetesBackendError(
            f"cannot configure the Kubernetes client ({exc}); set kubernetes.kubeconfig / "
            "kubernetes.context, or $KUBECONFIG"
        ) from exc


class DeployTimeout(KubernetesBackendError, TimeoutError):
    """No Ready engine pod within the timeout."""


class PodFailed(KubernetesBackendError):
    """The engine pod is in a state that waiting will not fix."""


def redact(text: str, extra_secrets: tuple[str, ...] = ()) -> str:
    """Remove anything that looks like a Hugging Face token, and the literal values of the token
    variables of this process's environment, from `text` (logs we write)."""
    secrets = [os.environ.get(name, "") for name in TOKEN_ENV] + list(extra_secrets)
    for value in sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True):
        text = text.replace(value, "[REDACTED]")
    return _HF_TOKEN_RE.sub("hf_[REDACTED]", text)


def _container_status(pod: Mapping[str, Any], container: str | None) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if container is None or status.get("name") == container:
            return cast("dict[str, Any]", status)
    return {}


def _describe_pod(pod: Mapping[str, Any] | None, container: str | None) -> str:
    if not pod:
        return "no pod"
    status = pod.get("status") or {}
    parts = [f"pod {pod['metadata']['name']} phase {status.get('phase')}"]
    cs = _container_status(pod, container)
    for state_name, state in (cs.get("state") or {}).items():
        if state:
            detail = state.get("reason") or ""
            message = state.get("message") or ""
            parts.append(f"container {state_name} {detail} {message}".strip())
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True" and cond.get("message"):
            parts.append(f"{cond['type']}: {cond['message']}")
    return "; ".join(parts)


class KubeCluster:
    """One namespace of a cluster, as servelab's engines use it.

    `api_client` is a `kubernetes.client.ApiClient`; `settings` the config's `kubernetes:`
    section, typed or as a mapping (partial is fine: the KubernetesSettings defaults fill the
    rest): its namespace and timeouts are used here.
    """

    def __init__(
        self,
        api_client: Any,
        settings: Mapping[str, Any] | KubernetesSettings | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes import client  # lazy: see the module docstring

        self.settings = KubernetesSettings.from_section(settings)
        self.namespace = self.settings.namespace
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self._sleep = sleep
        self._monotonic = monotonic
        timeouts = self.settings.timeouts
        self.poll_s = timeouts.poll_s
        self.ready_timeout_s = timeouts.ready_s
        self.delete_timeout_s = timeouts.delete_s
        self.request_timeout_s = timeouts.request_s

    # ------------------------------------------------------------------ helpers

    def _json(self, obj: Any) -> dict[str, Any]:
        """A client model as the JSON dict the API server sent (camelCase keys)."""
        if obj is None:
            return {}
        if isinstance(obj, Mapping):
            return dict(obj)
        return cast("dict[str, Any]", self.api_client.sanitize_for_serialization(obj))

    def _kw(self) -> dict[str, Any]:
        return {"_request_timeout": self.request_timeout_s}

    def _polls(self, timeout_s: float) -> int:
        """The iteration bound of a wait loop: enough polls to cover the timeout, plus one."""
        return max(1, math.ceil(timeout_s / max(self.poll_s, 1e-3))) + 1

    # ------------------------------------------------------------------ apply

    def apply(self, manifest_path: str | os.PathLike[str], *, dry_run: bool = False) -> list[str]:
        """Create or replace every object of a rendered deployment (file or directory).

        Returns one line per object, e.g. `Deployment/defaults-vllm-1234abcd created`. With
        `dry_run` the API server validates and admits each object without persisting it
        (`dryRun=All`).
        """
        objects = load_rendered(manifest_path)
        return [self.apply_object(obj, dry_run=dry_run)[0] for obj in objects]

    def apply_object(
        self, obj: Mapping[str, Any], *, dry_run: bool = False
    ) -> tuple[str, datetime | None]:
        from kubernetes.client.exceptions import ApiException  # lazy: see the module docstring

        kind, name = obj["kind"], obj["metadata"]["name"]
        ns = obj["metadata"].get("namespace", self.namespace)
        if ns != self.namespace:
            raise KubernetesBackendError(
                f"{kind}/{name}: rendered for namespace {ns!r} but the backend uses "
                f"{self.namespace!r} (kubernetes.namespace)"
            )
        create, read, replace = self._verbs(kind, name, dry_run=dry_run)
        suffix = " (dry run)" if dry_run else ""
        if kind == "PersistentVolumeClaim":
            # The weight volume outlives deployments: created once, never replaced.
            try:
                read()
                return f"{kind}/{name} kept", None
            except ApiException as exc:
                if exc.status != 404:
                    raise KubernetesBackendError(
                        f"{kind}/{name}: read failed: {api_message(exc)}"
                    ) from exc
        try:
            _, _, headers = create(dict(obj))
            return f"{kind}/{name} created{suffix}", header_time(headers)
        except ApiException as exc:
            if exc.status == 404 and kind == "PodMonitor":
                log.warning(
                    "PodMonitor/%s not applied: the monitoring.coreos.com CRD is not installed "
                    "(install kube-prometheus-stack); relying on prometheus.io annotations",
                    name,
                )
                return f"{kind}/{name} skipped (no PodMonitor CRD)", None
            if exc.status == 404:
                raise KubernetesBackendError(
                    f"{kind}/{name}: namespace {self.namespace!r} not found; create it and the "
                    "Hugging Face token Secret first (docs/kubernetes.md)"
                ) from exc
            if exc.status != 409:
                raise KubernetesBackendError(
                    f"{kind}/{name}: create failed: {api_message(exc)}"
                ) from exc
        if replace is None:
            return f"{kind}/{name} kept", None
        # It exists: replace it, keeping what the server allocated. An object several jobs apply
        # (the DCGM PodMonitor, with several node slots) may change between the read and the
        # replace: 409 Conflict, read again (optimistic concurrency).
        conflict = ""
        for _ in range(REPLACE_ATTEMPTS):
            try:
                current = self._json(read())
                _, _, headers = replace(_prepare_replace(obj, current))
                return f"{kind}/{name} replaced{suffix}", header_time(headers)
            except ApiException as exc:
                if exc.status != 409:
                    raise KubernetesBackendError(
                        f"{kind}/{name}: replace failed: {api_message(exc)}"
                    ) from exc
                conflict = api_message(exc)
        raise KubernetesBackendError(
            f"{kind}/{name}: replace failed {REPLACE_ATTEMPTS} times: {conflict}"
        )

    def _verbs(
        self, kind: str, name: str, *, dry_run: bool = False
    ) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any] | None]:
        """(create, read, replace) for a kind; replace is None for kinds never replaced."""
        ns, kw = self.namespace, {**self._kw(), **({"dry_run": "All"} if dry_run else {})}
        rkw = self._kw()
        if kind == "Deployment":
            return (
                lambda b: self.apps.create_namespaced_deployment_with_http_info(ns, b, **kw),
                lambda: self.apps.read_namespaced_deployment(name, ns, **rkw),
                lambda b: self.apps.replace_namespaced_deployment_with_http_info(name, ns, b, **kw),
            )
        if kind == "Service":
            return (
                lambda b: self.core.create_namespaced_service_with_http_info(ns, b, **kw),
                lambda: self.core.read_namespaced_service(name, ns, **rkw),
                lambda b: self.core.replace_namespaced_service_with_http_info(name, ns, b, **kw),
            )
        if kind == "PersistentVolumeClaim":
            return (
                lambda b: self.core.create_namespaced_persistent_volume_claim_with_http_info(
                    ns, b, **kw
                ),
                lambda: self.core.read_namespaced_persistent_volume_claim(name, ns, **rkw),
                None,
            )
        if kind == "PodMonitor":
            group, version, plural = POD_MONITOR
            return (
                lambda b: self.custom.create_namespaced_custom_object_with_http_info(
                    group, version, ns, plural, b, **kw
                ),
                lambda: self.custom.get_namespaced_custom_object(
                    group, version, ns, plural, name, **rkw
                ),
                lambda b: self.custom.replace_namespaced_custom_object_with_http_info(
                    group, version, ns, plural, name, b, **kw
                ),
            )
        raise KubernetesBackendError(f"{kind}/{name}: kind not supported by the kubernetes backend")

    # ------------------------------------------------------------------ pods and waiting

    def engine_pods(self, deployment_id: str) -> list[dict[str, Any]]:
        """Pods of the deployment that are not being deleted, newest first."""
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{DEPLOYMENT_LABEL}={deployment_id}", **self._kw()
        )
        items = [self._json(p) for p in pods.items or []]
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        return sorted(
            live, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True
        )

    def engine_pod(self, deployment_id: str) -> dict[str, Any] | None:
        """The engine pod: the newest Ready one, else the newest; None when there is none."""
        pods = self.engine_pods(deployment_id)
        ready = [p for p in pods if pod_ready(p)]
        none: list[dict[str, Any] | None] = [None]
        return (ready or pods or none)[0]

    def wait_ready(
        self, deployment_id: str, *, container: str | None = None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Poll until the deployment has a Ready pod; return it (JSON dict).

        Raises PodFailed at once on a state that does not recover and DeployTimeout after
        `timeout_s` (default kubernetes.timeouts.ready_s).
        """
        timeout = self.ready_timeout_s if timeout_s is None else float(timeout_s)
        deadline = self._monotonic() + timeout
        pod: dict[str, Any] | None = None
        for _ in range(self._polls(timeout)):
            pod = self.engine_pod(deployment_id)
            if pod is not None:
                if pod_ready(pod):
                    return pod
                self._raise_if_fatal(deployment_id, pod, container)
            if self._monotonic() >= deadline:
                break
            self._sleep(self.poll_s)
        events = self._recent_events(pod["metadata"]["name"]) if pod else []
        raise DeployTimeout(
            f"deployment {deployment_id}: no Ready engine pod after {timeout:.0f} s "
            f"({_describe_pod(pod, container)})"
            + (f"; recent events: {'; '.join(events)}" if events else "")
        )

    def _raise_if_fatal(
        self, deployment_id: str, pod: Mapping[str, Any], container: str | None
    ) -> None:
        status = pod.get("status") or {}
        cs = _container_status(pod, container)
        waiting = (cs.get("state") or {}).get("waiting") or {}
        name = pod["metadata"]["name"]
        if status.get("phase") == "Failed" or waiting.get("reason") in FATAL_WAITING:
            tail = ""
            if waiting.get("reason") == "CrashLoopBackOff":
                previous = self.pod_log(name, container, previous=True, tail_lines=20)
                tail = f"; last lines of the previous container:\n{previous}" if previous else ""
            raise PodFailed(
                f"deployment {deployment_id}: engine pod cannot start ({_describe_pod(pod, container)})"
                + tail
            )

    def _recent_events(self, pod_name: str, limit: int = 5) -> list[str]:
        try:
            events = self.pod_events(pod_name)
        except Exception:  # diagnostics only: never mask the real error
            return []
        return [f"{e.get('reason')}: {e.get('message')}" for e in events[-limit:]]

    def pod_events(self, pod_name: str) -> list[dict[str, Any]]:
        """Events whose involvedObject is the pod, oldest first (by event time)."""
        listed = self.core.list_namespaced_event(
            self.namespace,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod_name}",
            **self._kw(),
        )
        events = [self._json(e) for e in listed.items or []]
        return sorted(events, key=lambda e: (event_time(e) or 0.0, e["metadata"].get("name", "")))

    def pod_log(
        self,
        pod_name: str,
        container: str | None,
        *,
        previous: bool = False,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str:
        """The container's log (redacted), or "" when the API has none to give."""
        from kubernetes.client.exceptions import ApiException  # lazy: see the module docstring

        kwargs: dict[str, Any] = {"container": container, "_preload_content": False, **self._kw()}
        if previous:
            kwargs["previous"] = True
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        if limit_bytes is not None:
            kwargs["limit_bytes"] = limit_bytes
        try:
            response = self.core.read_namespaced_pod_log(pod_name, self.namespace, **kwargs)
        except ApiException as exc:
            if previous or exc.status in (400, 404):
                return ""
            raise
        data = response.data if hasattr(response, "data") else response
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)
        return redact(text)

    def wait_for(
        self,
        check: Callable[[], _T | None],
        *,
        timeout_s: float | None = None,
        describe: Callable[[], str],
    ) -> _T:
        """Poll `check` until it returns something (not None) and return it; DeployTimeout
        after `timeout_s` (default kubernetes.timeouts.ready_s), with `describe()` saying what
        was waited for."""
        timeout = self.ready_timeout_s if timeout_s is None else float(timeout_s)
        deadline = self._monotonic() + timeout
        for _ in range(self._polls(timeout)):
            found = check()
            if found is not None:
                return found
            if self._monotonic() >= deadline:
                break
            self._sleep(self.poll_s)
        raise DeployTimeout(f"{describe()} (after {timeout:.0f} s)")

    def list_nodes(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """The nodes (JSON) carrying every label of `selector`, by name."""
        listed = self.core.list_node(
            label_selector=",".join(f"{k}={v}" for k, v in sorted(selector.items())),
            **self._kw(),
        )
        nodes = [self._json(n) for n in listed.items or []]
        return sorted(nodes, key=lambda n: str(n["metadata"]["name"]))

    def label_node(
        self, name: str, key: str, value: str | None, resource_version: str | None
    ) -> dict[str, Any] | None:
        """Set the node's label `key` to `value` (None: remove it), a JSON merge patch under
        the precondition of `resource_version` when given. Returns the node as patched, or None
        when it changed since (409) or no longer exists (404)."""
        from kubernetes.client.exceptions import ApiException  # lazy: see the module docstring

        meta: dict[str, Any] = {"labels": {key: value}}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        try:
            node = self.core.patch_node(
                name, {"metadata": meta}, _content_type=MERGE_PATCH, **self._kw()
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            raise KubernetesBackendError(
                f"Node/{name}: label {key} not set: {api_message(exc)}"
            ) from exc
        return self._json(node)

    def read_node(self, node_name: str | None) -> dict[str, Any] | None:
        """The node (JSON), or None when it is not named or no longer exists."""
        if not node_name:
            return None
        node = unless_not_found(lambda: self.core.read_node(node_name, **self._kw()))
        return None if node is None else self._json(node)

    # ------------------------------------------------------------------ deleting

    def delete_pod(self, name: str) -> dict[str, Any]:
        """Delete a pod; returns it as the API server answered (with its deletion time), or {}
        when it was already gone."""
        from kubernetes.client.exceptions import ApiException  # lazy: see the module docstring

        try:
            return self._json(self.core.delete_namespaced_pod(name, self.namespace, **self._kw()))
        except ApiException as exc:
            if exc.status != 404:
                raise KubernetesBackendError(
                    f"Pod/{name}: delete failed: {api_message(exc)}"
                ) from exc
            return {}

    def delete_engine_deployment(self, deployment_id: str) -> None:
        """Delete the engine Deployment only (its pods stay until deleted; nothing recreates
        them). Already gone is fine."""
        unless_not_found(
            lambda: self.apps.delete_namespaced_deployment(
                deployment_id, self.namespace, propagation_policy="Background", **self._kw()
            )
        )

    def wait_pod_deleted(self, name: str) -> float:
        """Poll until the pod no longer exists; returns when, by the API server's clock (the
        `Date` header of the first 404, this machine's clock if it sent none)."""
        from kubernetes.client.exceptions import ApiException  # lazy: see the module docstring

        deadline = self._monotonic() + self.delete_timeout_s
        for _ in range(self._polls(self.delete_timeout_s)):
            try:
                self.core.read_namespaced_pod(name, self.namespace, **self._kw())
            except ApiException as exc:
                if exc.status != 404:
                    raise
                when = header_time(exc.headers)
                return when.timestamp() if when else datetime.now(UTC).timestamp()
            if self._monotonic() >= deadline:
                break
            self._sleep(self.poll_s)
        raise KubernetesBackendError(
            f"pod {name}: still terminating after {self.delete_timeout_s:.0f} s"
        )

    # ------------------------------------------------------------------ the gated pod

    def read_deployment(self, deployment_id: str) -> dict[str, Any] | None:
        """The engine Deployment (JSON), or None when it does not exist."""
        current = unless_not_found(
            lambda: self.apps.read_namespaced_deployment(
                deployment_id, self.namespace, **self._kw()
            )
        )
        return None if current is None else self._json(current)

    def gated_pod(self, deployment_id: str) -> str | None:
        """The uid of the pod recorded on the Deployment as having passed the gate (None: none)."""
        current = self.read_deployment(deployment_id) or {"metadata": {}}
        gated = (current["metadata"].get("annotations") or {}).get(GATED_ANNOTATION)
        return None if gated is None else str(gated)

    def mark_gated(self, deployment_id: str, pod_uid: str) -> None:
        """Record on the Deployment which pod passed the gate (metadata only: no rollout)."""
        self._annotate(deployment_id, GATED_ANNOTATION, pod_uid, "the gated pod")

    def served_traces(self, deployment_id: str, pod_uid: str) -> list[str]:
        """The sha256 of every trace the pod `pod_uid` has been sent, as recorded on the
        Deployment (`mark_served`); a record of another pod (one since replaced) is empty."""
        current = self.read_deployment(deployment_id) or {"metadata": {}}
        text = (current["metadata"].get("annotations") or {}).get(SERVED_ANNOTATION)
        if not text:
            return []
        try:
            record = json.loads(text)
            return [str(t) for t in record["traces"]] if record["pod"] == pod_uid else []
        except (ValueError, KeyError, TypeError) as exc:
            raise KubernetesBackendError(
                f"Deployment/{deployment_id}: annotation {SERVED_ANNOTATION} is not "
                f'{{"pod": uid, "traces": [...]}}: {text[:200]!r}'
            ) from exc

    def mark_served(self, deployment_id: str, pod_uid: str, trace_sha256: str) -> None:
        """Record on the Deployment that the pod `pod_uid` has been sent this trace."""
        traces = self.served_traces(deployment_id, pod_uid)
        if trace_sha256 not in traces:
            traces.append(trace_sha256)
        record = json.dumps({"pod": pod_uid, "traces": traces}, separators=(",", ":"))
        self._annotate(deployment_id, SERVED_ANNOTATION, record, "the traces its pod served")

    def _annotate(self, deployment_id: str, key: str, value: str, what: str) -> None:
        """Set one annotation of the Deployment (metadata only: no rollout)."""
        from kubernetes.client.exceptions import ApiException  # lazy: see the module docstring

        for _ in range(3):  # optimistic concurrency: retry on a conflicting update
            current = self._json(
                self.apps.read_namespaced_deployment(deployment_id, self.namespace, **self._kw())
            )
            meta = current["metadata"]
            meta["annotations"] = {**(meta.get("annotations") or {}), key: value}
            try:
                self.apps.replace_namespaced_deployment(
                    deployment_id,
                    self.namespace,
                    current,  # type: ignore[arg-type]  # the client sends a JSON dict body as it is
                    **self._kw(),
                )
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        raise KubernetesBackendError(f"Deployment/{deployment_id}: could not record {what}")

    # ------------------------------------------------------------------ teardown

    def teardown(self, deployment_id: str, *, wait: bool = True) -> list[str]:
        """Delete the deployment's PodMonitor, Service and Deployment (not the weight volume);
        with `wait`, until its pods are gone. Returns what was deleted."""
        from kubernetes.client.exceptions import ApiException  # lazy: see the module docstring

        ns, kw = self.namespace, self._kw()
        group, version, plural = POD_MONITOR
        steps: list[tuple[str, Callable[[], Any]]] = [
            (
                f"PodMonitor/{deployment_id}",
                lambda: self.custom.delete_namespaced_custom_object(
                    group, version, ns, plural, deployment_id, **kw
                ),
            ),
            (
                f"Service/{deployment_id}",
                lambda: self.core.delete_namespaced_service(deployment_id, ns, **kw),
            ),
            (
                f"Deployment/{deployment_id}",
                lambda: self.apps.delete_namespaced_deployment(
                    deployment_id, ns, propagation_policy="Background", **kw
                ),
            ),
        ]
        deleted = []
        for what, call in steps:
            try:
                call()
                deleted.append(what)
            except ApiException as exc:
                if exc.status != 404:
                    raise KubernetesBackendError(
                        f"{what}: delete failed: {api_message(exc)}"
                    ) from exc
        if wait:
            self.wait_pods_gone(deployment_id)
        return deleted

    def wait_pods_gone(self, deployment_id: str, *, timeout_s: float | None = None) -> None:
        """Poll until no pod of the deployment exists (terminating ones included)."""
        timeout = self.delete_timeout_s if timeout_s is None else float(timeout_s)
        deadline = self._monotonic() + timeout
        for _ in range(self._polls(timeout)):
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{DEPLOYMENT_LABEL}={deployment_id}", **self._kw()
            )
            if not pods.items:
                return
            if self._monotonic() >= deadline:
                break
            self._sleep(self.poll_s)
        raise DeployTimeout(f"deployment {deployment_id}: pods still present after {timeout:.0f} s")

    def current_deployment(self) -> str | None:
        """The servelab engine Deployment of the namespace (None when there is none)."""
        listed = self.apps.list_namespaced_deployment(
            self.namespace, label_selector=ENGINE_SELECTOR, **self._kw()
        )
        names = sorted(self._json(d)["metadata"]["name"] for d in listed.items or [])
        if len(names) > 1:
            raise KubernetesBackendError(
                f"namespace {self.namespace}: several engine deployments {names}; name one"
            )
        return names[0] if names else None

    def retire_others(
        self, keep: str, *, spare: Callable[[Mapping[str, Any]], bool] | None = None
    ) -> list[str]:
        """Tear down every other servelab engine Deployment in the namespace (one engine per
        GPU), but those `spare` says to leave (engines on other nodes)."""
        listed = self.apps.list_namespaced_deployment(
            self.namespace, label_selector=ENGINE_SELECTOR, **self._kw()
        )
        engines = [self._json(d) for d in listed.items or []]
        left = {d["metadata"]["name"] for d in engines if spare is not None and spare(d)}
        others = sorted({d["metadata"]["name"] for d in engines} - {keep} - left)
        retired = []
        for other in others:
            retired.extend(self.teardown(other, wait=True))
        return retired


def _prepare_replace(body: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """The rendered object with the server's resourceVersion (optimistic concurrency) and, for a
    Service, the cluster IPs it allocated (immutable fields)."""
    out = {**body, "metadata": {**body["metadata"]}}
    rv = (current.get("metadata") or {}).get("resourceVersion")
    if rv:
        out["metadata"]["resourceVersion"] = rv
    if body.get("kind") == "Service":
        spec = dict(out.get("spec") or {})
        for key in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
            if key in (current.get("spec") or {}) and key not in spec:
                spec[key] = current["spec"][key]
        out["spec"] = spec
    return out
