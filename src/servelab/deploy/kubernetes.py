"""The kubernetes backend: bring an engine up on a GPU node with the official `kubernetes` client.

What a deployment goes through (study §3.3, §5.4, Appendix A.7 step 2):

1. `apply`: create each rendered object, or replace it when it exists (the model-weight volume is
   created once and kept). Engine Deployments of *other* servelab deployments in the namespace are
   torn down first: one engine on the GPU at a time. A pod the deployment already had is deleted,
   so every deploy starts a fresh engine whose start-up log is complete.
2. `wait_ready`: a bounded poll until the engine pod is Ready (readiness probe on /health),
   failing fast on states that never recover (missing Secret, invalid image, crash loop) and
   raising DeployTimeout, with the pod's state and recent events, when the timeout passes.
3. The engine container's start-up log is captured (any Hugging Face token value is redacted),
   parsed with `servelab.engines.parse_startup_log` and gated with `check_resolved`: a deployment
   that resolved a chunked-prefill setting other than its arm expects raises
   `ResolvedConfigMismatch` quoting the log line. Nothing is deleted on a mismatch: the log is
   kept (also as startup.refused.log, which Snakemake does not remove with the failed job's
   outputs) and the Deployment is left running for inspection (the next deployment retires it).
   The uid of the pod that passed is recorded on the Deployment (servelab.dev/gated-pod-uid), so
   a run re-reads the start-up log only of a pod that has not passed yet (one recreated after a
   reclamation, say).
4. Node identity (`servelab.deploy.node`) is recorded at run start and end; `detect_reclamation`
   names what changed when the Spot node was reclaimed under a run.
5. `teardown` deletes the Deployment, Service and PodMonitor (never the weight volume).

Every wait is a loop bounded both in iterations and by a monotonic deadline, and every API call
carries a request timeout. The clock and sleep are injectable so tests run in milliseconds. The
`kubernetes` client package is imported inside the methods that call it (its ApiException, its
API classes): importing it takes about half a second, which the sim and local backends never need.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from servelab.artifacts import write_json, write_text
from servelab.deploy.backend import RunRequest
from servelab.deploy.kube_api import (
    KubernetesBackendError,
    api_message,
    event_time,
    header_time,
    make_api_client,
    parse_api_time,
    pod_ready,
    unless_not_found,
)
from servelab.deploy.manifests import load_rendered, render_deployment
from servelab.deploy.measure import LiveTarget, measure_live
from servelab.deploy.node import detect_reclamation, node_identity
from servelab.deploy.restart import restart_timeline
from servelab.dispatch import DispatchResult
from servelab.engines import check_resolved, parse_startup_log
from servelab.grid.settings import KubernetesSettings

__all__ = [
    "DeployTimeout",
    "KubernetesBackend",
    "KubernetesBackendError",
    "PodFailed",
    "parse_api_time",
    "redact",
]

log = logging.getLogger(__name__)

ENGINE_SELECTOR = "app.kubernetes.io/part-of=servelab,app.kubernetes.io/component=engine"
DEPLOYMENT_LABEL = "servelab.dev/deployment"
# Set on the Deployment once a pod's start-up log passed the gate: the uid of that pod. A run
# re-reads the log only when the current pod is another one (kubelet rotates container logs, so
# the start-up lines of a long-running pod may no longer be readable).
GATED_ANNOTATION = "servelab.dev/gated-pod-uid"
POD_MONITOR = ("monitoring.coreos.com", "v1", "podmonitors")
# Container states that do not recover by waiting: fail at once rather than at the timeout.
FATAL_WAITING = {"CreateContainerConfigError", "InvalidImageName", "CrashLoopBackOff"}
# Environment variables that may hold a Hugging Face token in *our* process.
TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_API_TOKEN")
_HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{20,}")
STARTUP_LOG_LIMIT_BYTES = 32 * 1024 * 1024
# Written beside startup.log when the gate refuses a deployment (not a workflow output, so it
# survives the failed job).
REFUSED_LOG = "startup.refused.log"


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
            return status
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


class KubernetesBackend:
    """Deploy, watch and tear down engines with the official Kubernetes client.

    `api_client` is a `kubernetes.client.ApiClient`; `settings` is the config's `kubernetes:`
    section, typed or as a mapping (partial is fine: the KubernetesSettings defaults fill the
    rest). Build one with `from_settings`.
    """

    name = "kubernetes"

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

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_settings(
        cls, settings: Mapping[str, Any] | KubernetesSettings | None = None, **kwargs: Any
    ) -> KubernetesBackend:
        """Connect as the settings say: `kubeconfig`/`context` when given; else in-cluster when
        running in a pod; else $KUBECONFIG or ~/.kube/config."""
        s = KubernetesSettings.from_section(settings)
        return cls(make_api_client(s.kubeconfig, s.context), s, **kwargs)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> KubernetesBackend:
        """From a whole servelab config (its `kubernetes:` section)."""
        return cls.from_settings(config.get("kubernetes"), **kwargs)

    # ------------------------------------------------------------------ helpers

    def _json(self, obj: Any) -> dict[str, Any]:
        """A client model as the JSON dict the API server sent (camelCase keys)."""
        if obj is None:
            return {}
        if isinstance(obj, Mapping):
            return dict(obj)
        return self.api_client.sanitize_for_serialization(obj)

    def _kw(self) -> dict[str, Any]:
        return {"_request_timeout": self.request_timeout_s}

    def _polls(self, timeout_s: float) -> int:
        """The iteration bound of a wait loop: enough polls to cover the timeout, plus one."""
        return max(1, math.ceil(timeout_s / max(self.poll_s, 1e-3))) + 1

    def engine_url(self, deployment_id: str, port: int) -> str:
        """Where the dispatcher reaches the engine (kubernetes.engine_url, a format string with
        {service}, {namespace} and {port}: in-cluster DNS by default, or a port-forward)."""
        return self.settings.engine_url_for(deployment_id, port)

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
        # It exists: replace it, keeping what the server allocated.
        try:
            current = self._json(read())
            _, _, headers = replace(_prepare_replace(obj, current))
            return f"{kind}/{name} replaced{suffix}", header_time(headers)
        except ApiException as exc:
            raise KubernetesBackendError(
                f"{kind}/{name}: replace failed: {api_message(exc)}"
            ) from exc

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
        return (ready or pods or [None])[0]

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

    def read_node(self, node_name: str | None) -> dict[str, Any] | None:
        """The node (JSON), or None when it is not named or no longer exists."""
        if not node_name:
            return None
        node = unless_not_found(lambda: self.core.read_node(node_name, **self._kw()))
        return None if node is None else self._json(node)

    # ------------------------------------------------------------------ deploy and gate

    def deploy(
        self,
        deployment: Mapping[str, Any],
        *,
        manifest_path: str | os.PathLike[str],
        startup_log_path: str | os.PathLike[str],
        resolved_json_path: str | os.PathLike[str] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Bring the deployment up, write its start-up log, gate what it resolved.

        `deployment` holds at least `deployment_id` and `engine`; with `expect_chunked_prefill`
        (and `expect_chunk_size`) the gate runs here and a mismatch raises
        `servelab.engines.ResolvedConfigMismatch` after the log is written. With
        `resolved_json_path` the resolved configuration, node and pod are written there (only
        when the gate passed). Returns that record.
        """
        deployment_id = str(deployment["deployment_id"])
        engine = str(deployment["engine"])
        objects = load_rendered(manifest_path)
        names = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"}
        if names != {deployment_id}:
            raise KubernetesBackendError(
                f"{manifest_path}: expected the Deployment {deployment_id}, found {sorted(names)}"
            )
        retired = self.retire_others(deployment_id)
        for line in retired:
            log.warning("one engine at a time: retired %s before deploying %s", line, deployment_id)
        running_before = [p["metadata"]["name"] for p in self.engine_pods(deployment_id)]
        for line in (self.apply_object(o)[0] for o in objects):
            log.info("%s", line)
        # A deploy always starts a fresh engine: a clean cache, and a start-up log that is whole
        # (kubelet rotates the logs of a long-running pod, and the gate needs their first lines).
        self._delete_pods(running_before)
        pod = self.wait_ready(deployment_id, container=engine, timeout_s=timeout_s)
        record = self._confirm(deployment, pod, startup_log_path, resolved_json_path)
        if "expect_chunked_prefill" in deployment:
            self._mark_gated(deployment_id, pod["metadata"]["uid"])
        return record

    def _delete_pods(self, names: list[str]) -> None:
        for name in names:
            log.info("restarting the engine: deleting pod %s", name)
            self.delete_pod(name)

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

    def _mark_gated(self, deployment_id: str, pod_uid: str) -> None:
        """Record on the Deployment which pod passed the gate (metadata only: no rollout)."""
        from kubernetes.client.exceptions import ApiException  # lazy: see the module docstring

        for _ in range(3):  # optimistic concurrency: retry on a conflicting update
            current = self._json(
                self.apps.read_namespaced_deployment(deployment_id, self.namespace, **self._kw())
            )
            meta = current["metadata"]
            meta["annotations"] = {**(meta.get("annotations") or {}), GATED_ANNOTATION: pod_uid}
            try:
                self.apps.replace_namespaced_deployment(
                    deployment_id, self.namespace, current, **self._kw()
                )
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        raise KubernetesBackendError(f"Deployment/{deployment_id}: could not record the gated pod")

    def _confirm(
        self,
        deployment: Mapping[str, Any],
        pod: Mapping[str, Any],
        startup_log_path: str | os.PathLike[str] | None,
        resolved_json_path: str | os.PathLike[str] | None,
    ) -> dict[str, Any]:
        """Capture the Ready pod's start-up log, parse it, gate it, record node and pod."""
        deployment_id, engine = str(deployment["deployment_id"]), str(deployment["engine"])
        pod_name = pod["metadata"]["name"]
        text = self.pod_log(pod_name, engine, limit_bytes=STARTUP_LOG_LIMIT_BYTES)
        if startup_log_path is not None:
            write_text(startup_log_path, text)
        parsed = parse_startup_log(text, engine=engine)
        node = self.node_identity(deployment_id, pod=pod)
        if "expect_chunked_prefill" in deployment:
            try:
                check_resolved(
                    parsed,
                    expect_chunked_prefill=bool(deployment["expect_chunked_prefill"]),
                    expect_chunk_size=deployment.get("expect_chunk_size"),
                )
            except Exception as exc:
                kept = ""
                if startup_log_path is not None:
                    # Snakemake deletes a failed job's outputs: keep the evidence beside them.
                    evidence = Path(startup_log_path).with_name(REFUSED_LOG)
                    write_text(evidence, text)
                    kept = f"; its start-up log is kept as {evidence}"
                log.error(
                    "deployment %s (pod %s) refused by the resolved-configuration gate; it is left "
                    "running for inspection (the next deployment, or teardown, removes it)%s: %s",
                    deployment_id,
                    pod_name,
                    kept,
                    exc,
                )
                raise
        if startup_log_path is not None:
            Path(startup_log_path).with_name(REFUSED_LOG).unlink(missing_ok=True)  # passed now
        record = {
            **_parsed_dict(parsed),
            "deployment_id": deployment_id,
            "backend": self.name,
            "namespace": self.namespace,
            "pod": {"name": pod_name, "uid": pod["metadata"].get("uid")},
            "node": node,
        }
        if resolved_json_path is not None:
            write_json(resolved_json_path, record)
        return record

    def ensure_deployed(
        self, deployment: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Make sure the deployment is up and its current pod passes the gate; returns the pod.

        For runs: after a Spot reclamation the Deployment recreates the pod on the new node, and
        the new pod's start-up log is gated again (a pod already gated, per the Deployment's
        servelab.dev/gated-pod-uid annotation, is not read again). When the Deployment is missing
        (retired by another deployment), it is rendered from `deployment` (deployment_id, engine,
        image, port, flags) and applied again.
        """
        deployment_id, engine = str(deployment["deployment_id"]), str(deployment["engine"])
        present = unless_not_found(
            lambda: self.apps.read_namespaced_deployment(
                deployment_id, self.namespace, **self._kw()
            )
        )
        if present is None:
            log.warning("deployment %s is not in the cluster: deploying it again", deployment_id)
            rendered = render_deployment(
                deployment_id=deployment_id,
                engine=engine,
                image=str(deployment["image"]),
                port=int(deployment["port"]),
                flags=list(deployment["flags"]),
                namespace=self.namespace,
                k8s_settings=self.settings.as_dict(),
            )
            for line in self.retire_others(deployment_id):
                log.warning("one engine at a time: retired %s", line)
            for text in rendered.values():
                self.apply_object(yaml.safe_load(text))
        pod = self.wait_ready(deployment_id, container=engine, timeout_s=timeout_s)
        current = self._json(
            self.apps.read_namespaced_deployment(deployment_id, self.namespace, **self._kw())
        )
        gated = (current["metadata"].get("annotations") or {}).get(GATED_ANNOTATION)
        if gated != pod["metadata"]["uid"]:
            log.info(
                "deployment %s: pod %s not gated yet: reading its start-up log",
                deployment_id,
                pod["metadata"]["name"],
            )
            self._confirm(deployment, pod, None, None)
            self._mark_gated(deployment_id, pod["metadata"]["uid"])
        return pod

    # ------------------------------------------------------------------ node identity

    def node_identity(
        self,
        deployment_id: str | None = None,
        *,
        pod: Mapping[str, Any] | None = None,
        container: str | None = None,
    ) -> dict[str, Any]:
        """Identity of the engine pod and its node now (see servelab.deploy.node).

        `deployment_id` None means the one servelab engine deployment of the namespace. With no
        engine pod at all the result has `pod_gone: true` and no node fields.
        """
        if deployment_id is None:
            deployment_id = self.current_deployment()
        if pod is None and deployment_id is not None:
            pod = self.engine_pod(deployment_id)
        if pod is None:
            ident = node_identity(None)
            ident.pop("node_gone", None)
            ident["pod_gone"] = True
            return ident
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = self.read_node(node_name)
        if container is None:
            container = (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/name")
        ident = node_identity(node, pod, container=container)
        if node is None and not node_name:
            ident.pop("node_gone", None)  # not scheduled yet: nothing is gone
        return ident

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

    def retire_others(self, keep: str) -> list[str]:
        """Tear down every other servelab engine Deployment in the namespace (one GPU)."""
        listed = self.apps.list_namespaced_deployment(
            self.namespace, label_selector=ENGINE_SELECTOR, **self._kw()
        )
        others = sorted({self._json(d)["metadata"]["name"] for d in listed.items or []} - {keep})
        retired = []
        for other in others:
            retired.extend(self.teardown(other, wait=True))
        return retired

    # ------------------------------------------------------------------ restart experiment

    def restart_timeline(
        self,
        deployment_id: str,
        manifest_path: str | os.PathLike[str],
        out_json: str | os.PathLike[str],
        *,
        rep: str | None = None,
    ) -> dict[str, Any]:
        """Delete the engine pod, wait for it to terminate, re-apply, record the event timeline.

        See servelab.deploy.restart for the record format (docs/kubernetes.md).
        """
        return restart_timeline(self, deployment_id, manifest_path, out_json, rep=rep)

    # ------------------------------------------------------------------ runs

    def metrics_selector(self, deployment_id: str) -> dict[str, str]:
        """Prometheus label matchers of the deployment's series (kubernetes.metrics_selector)."""
        return self.settings.metrics_selector_for(deployment_id)

    def run(self, request: RunRequest) -> dict[str, Any]:
        """One measured run against the deployed engine (the servelab.deploy.Backend protocol).

        The engine is confirmed first (`ensure_deployed`: redeployed if it was retired, and its
        current pod's start-up log gated again, so a pod recreated after a reclamation is checked
        too). The dispatcher (servelab.dispatch.run.dispatch_run) reads node identity before the
        first request and after the last; when they differ the run is `interrupted` with a
        `reclaimed_reason`, which makes the campaign discard and repeat the condition. Then the
        run's Prometheus window (telemetry.prometheus_url) is pulled into scrape.parquet and
        run.json is written last. During the run node identity is read every
        `kubernetes.node_watch_s` seconds (default 15) and a change stops the run at once, so a
        reclaimed node does not keep it going (in-flight requests recorded as interrupted).
        """
        deployment = dict(request.deployment)
        deployment_id, engine = str(deployment["deployment_id"]), str(deployment["engine"])
        if request.faults:
            log.warning(
                "run %s: fault injection is for the sim and local backends; ignored on kubernetes: %s",
                request.run_id,
                request.faults,
            )
        pod = self.ensure_deployed(deployment)
        base_url = self.engine_url(deployment_id, int(deployment["port"]))
        prometheus_url = request.telemetry.prometheus_url

        def reclamation(record: Mapping[str, Any], result: DispatchResult) -> str | None:
            return _reclamation(record.get("node") or {})

        return measure_live(
            request,
            LiveTarget(
                backend=self.name,
                base_url=base_url,
                node_identity=lambda: self.node_identity(deployment_id, container=engine),
                prometheus_url=prometheus_url,
                metrics_selector=self.metrics_selector(deployment_id),
                # two scrape intervals after the end, so the run's last samples are in
                scrape_settle_s=2 * self.settings.pod_monitor.interval_s + 1.0,
                reclamation=reclamation,
                extra={
                    "kubernetes": {
                        "namespace": self.namespace,
                        "pod": pod["metadata"]["name"],
                        "engine_url": base_url,
                        "prometheus_url": prometheus_url,
                    }
                },
                node_watch_s=self.settings.node_watch_s,
                node_change=_node_change,
            ),
        )


def _reclamation(node: Mapping[str, Any], when: str = "at the end of the run") -> str | None:
    """Why the run's node/pod changed, from the record's node.start / node.end (None if not)."""
    start, end = node.get("start"), node.get("end")
    if not isinstance(start, Mapping) or not isinstance(end, Mapping):
        return None
    if "error" in end:
        return f"node identity unreadable {when} ({end['error']})"
    if end.get("pod_gone"):
        return f"the engine pod was gone {when}"
    return detect_reclamation(start, end)


def _node_change(start: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """The node watch's test during a run (servelab.dispatch.run.node_watch)."""
    return _reclamation({"start": start, "end": now}, when="during the run")


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


def _parsed_dict(parsed: Any) -> dict[str, Any]:
    """The engines parser's result as a plain dict (its own JSON form when it has one)."""
    if hasattr(parsed, "to_json"):
        return dict(json.loads(parsed.to_json()))
    if dataclasses.is_dataclass(parsed) and not isinstance(parsed, type):
        return dataclasses.asdict(parsed)
    if isinstance(parsed, Mapping):
        return dict(parsed)
    raise TypeError(f"cannot record a parse result of type {type(parsed).__name__}")
