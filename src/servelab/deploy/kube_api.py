"""Kubernetes API helpers shared by the backend (servelab.deploy.kubernetes) and the restart
experiment (servelab.deploy.restart): client construction, the API server's clocks, and the
handling of its errors.

The `kubernetes` client package is imported inside the functions that need it: importing it takes
about half a second, and the sim and local backends never do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "KubernetesBackendError",
    "api_message",
    "api_seconds",
    "event_time",
    "header_time",
    "make_api_client",
    "parse_api_time",
    "pod_ready",
    "unless_not_found",
]

_T = TypeVar("_T")


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
            return kconfig.new_client_from_config(config_file=path, context=context)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            kconfig.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return kconfig.new_client_from_config()
    except (kconfig.ConfigException, OSError) as exc:
        raise KubernetesBackendError(
            f"cannot configure the Kubernetes client ({exc}); set kubernetes.kubeconfig / "
            "kubernetes.context, or $KUBECONFIG"
        ) from exc
