"""A fake Kubernetes API server on 127.0.0.1 (stdlib http.server, in a thread).

It serves ONLY the endpoints servelab calls (the kubernetes backend; `servelab campaign submit`,
`status`, `logs`, `fetch`):

| path | verbs |
|---|---|
| /apis/apps/v1/namespaces/{ns}/deployments[/{name}] | POST, GET (list, one), PUT, DELETE |
| /api/v1/namespaces/{ns}/services[/{name}] | POST, GET, PUT, DELETE |
| /api/v1/namespaces/{ns}/persistentvolumeclaims[/{name}] | POST, GET |
| /apis/monitoring.coreos.com/v1/namespaces/{ns}/podmonitors[/{name}] | POST, GET, PUT, DELETE |
| /api/v1/namespaces/{ns}/pods[/{name}] | POST, GET (list, one), DELETE |
| /api/v1/namespaces/{ns}/pods/{name}/log | GET (text/plain) |
| /api/v1/namespaces/{ns}/pods/{name}/exec | GET, upgraded to a WebSocket (v5 or v4.channel.k8s.io) |
| /api/v1/namespaces/{ns}/events | GET (list, fieldSelector) |
| /api/v1/namespaces/{ns}/serviceaccounts[/{name}] | POST, GET |
| /api/v1/namespaces/{ns}/configmaps[/{name}] | POST, GET, PUT |
| /api/v1/nodes[/{name}] | GET (list, labelSelector; one), PATCH (merge patch of metadata) |
| /apis/batch/v1/namespaces/{ns}/jobs[/{name}] | POST, GET (list, one), DELETE |
| /apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles, rolebindings[/{name}] | POST, GET, PUT |
| /apis/rbac.authorization.k8s.io/v1/clusterroles, clusterrolebindings[/{name}] | POST, GET, PUT |

`exec` runs only `tar -czf - -C DIR PATH...` over a claim's local folder (fakekube.batch): its
output goes out as binary WebSocket frames on the stdout channel, then the exit status on the
error channel, as the API server's exec does.

Anything else answers 404 with a metav1.Status, and every request is recorded in
`cluster.requests` so tests can assert what was (not) called, e.g. that no Secret was ever read.
The `Date` header carries the fake clock.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import struct
import threading
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .batch import exec_in_pod
from .cluster import CLUSTER, ApiError, FakeCluster

_NS = r"/namespaces/(?P<ns>[a-z0-9-]+)"
ROUTES = [
    (re.compile(rf"^/apis/apps/v1{_NS}/(?P<res>deployments)(?:/(?P<name>[^/]+))?$"), "apps/v1"),
    (
        re.compile(
            rf"^/apis/monitoring\.coreos\.com/v1{_NS}/(?P<res>podmonitors)(?:/(?P<name>[^/]+))?$"
        ),
        "monitoring.coreos.com/v1",
    ),
    (
        re.compile(
            rf"^/api/v1{_NS}/(?P<res>services|persistentvolumeclaims|pods|events|serviceaccounts|configmaps)(?:/(?P<name>[^/]+))?(?P<sub>/log|/exec)?$"
        ),
        "v1",
    ),
    (re.compile(r"^/api/v1/(?P<res>nodes)(?:/(?P<name>[^/]+))?$"), "v1"),
    (re.compile(rf"^/apis/batch/v1{_NS}/(?P<res>jobs)(?:/(?P<name>[^/]+))?$"), "batch/v1"),
    (
        re.compile(
            rf"^/apis/rbac\.authorization\.k8s\.io/v1{_NS}/(?P<res>roles|rolebindings)(?:/(?P<name>[^/]+))?$"
        ),
        "rbac.authorization.k8s.io/v1",
    ),
    (
        re.compile(
            r"^/apis/rbac\.authorization\.k8s\.io/v1/(?P<res>clusterroles|clusterrolebindings)(?:/(?P<name>[^/]+))?$"
        ),
        "rbac.authorization.k8s.io/v1",
    ),
]
ALLOWED = {
    "deployments": {"POST", "GET", "PUT", "DELETE"},
    "services": {"POST", "GET", "PUT", "DELETE"},
    "persistentvolumeclaims": {"POST", "GET"},
    "podmonitors": {"POST", "GET", "PUT", "DELETE"},
    "pods": {"POST", "GET", "DELETE"},
    "events": {"GET"},
    "nodes": {"GET", "PATCH"},
    "jobs": {"POST", "GET", "DELETE"},
    "serviceaccounts": {"POST", "GET"},
    "configmaps": {"POST", "GET", "PUT"},
    "roles": {"POST", "GET", "PUT"},
    "rolebindings": {"POST", "GET", "PUT"},
    "clusterroles": {"POST", "GET", "PUT"},
    "clusterrolebindings": {"POST", "GET", "PUT"},
}
LIST_KIND = {
    "deployments": "DeploymentList",
    "services": "ServiceList",
    "persistentvolumeclaims": "PersistentVolumeClaimList",
    "podmonitors": "PodMonitorList",
    "pods": "PodList",
    "events": "EventList",
    "jobs": "JobList",
    "serviceaccounts": "ServiceAccountList",
    "configmaps": "ConfigMapList",
    "roles": "RoleList",
    "rolebindings": "RoleBindingList",
    "clusterroles": "ClusterRoleList",
    "clusterrolebindings": "ClusterRoleBindingList",
    "nodes": "NodeList",
}
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
STDOUT, STDERR, ERROR = 1, 2, 3
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
FRAME_BYTES = 32 * 1024  # stdout goes out in frames of this size, as a real server splits it


def _frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked, final WebSocket frame (server to client, RFC 6455)."""
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, n])
    elif n < 1 << 16:
        head = bytes([0x80 | opcode, 126]) + struct.pack("!H", n)
    else:
        head = bytes([0x80 | opcode, 127]) + struct.pack("!Q", n)
    return head + payload


def _exit_status(command: list[str], code: int) -> dict[str, Any]:
    """What the error channel carries at the end of an exec (metav1.Status)."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command "
        f"{command}, exit code {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


class _Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # header and body are two writes: no 40 ms delayed-ACK stall

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def date_time_string(self, timestamp: float | None = None) -> str:
        return formatdate(self.cluster.now, usegmt=True)

    def _send(self, code: int, payload: Any, content_type: str = "application/json") -> None:
        body = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        cluster = self.cluster
        if method == "GET" and url.path.endswith("/exec"):
            self._exec(url.path, parse_qs(url.query))
            return
        with cluster.lock:
            cluster.requests.append((method, url.path))
            try:
                body = self._body() if method in ("POST", "PUT", "DELETE", "PATCH") else {}
                code, payload, ctype = self._route(method, url.path, query, body)
            except ApiError as err:
                code, payload, ctype = err.code, err.status(), "application/json"
            except (KeyError, ValueError, TypeError) as exc:
                code = 400
                payload = ApiError(
                    400, "BadRequest", f"fake server: {type(exc).__name__}: {exc}"
                ).status()
                ctype = "application/json"
        self._send(code, payload, ctype)

    def _exec(self, path: str, query: dict[str, list[str]]) -> None:
        """An exec: the WebSocket upgrade, then the command's stdout, stderr and exit status as
        channel-prefixed binary frames, then a close frame."""
        cluster = self.cluster
        match = re.match(rf"^/api/v1{_NS}/pods/(?P<name>[^/]+)/exec$", path)
        with cluster.lock:
            cluster.requests.append(("GET", path))
            try:
                if not match or "websocket" not in (self.headers.get("Upgrade") or "").lower():
                    raise ApiError(400, "BadRequest", "fake server: exec needs a WebSocket upgrade")
                command = query.get("command", [])
                container = (query.get("container") or [None])[-1]
                out, err, code = exec_in_pod(
                    cluster, match["ns"], match["name"], container, command
                )
            except ApiError as exc:
                self._send(exc.code, exc.status())
                return
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest())
        offered = [p.strip() for p in (self.headers.get("Sec-WebSocket-Protocol") or "").split(",")]
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        # the newest protocol offered, as a 1.30+ API server chooses (v5 adds a close signal
        # the client sends; the frames servelab reads are the same)
        chosen = next((p for p in PROTOCOLS if p in offered), None)
        if chosen:
            self.send_header("Sec-WebSocket-Protocol", chosen)
        self.end_headers()
        for start in range(0, len(out), FRAME_BYTES):
            self.wfile.write(_frame(0x2, bytes([STDOUT]) + out[start : start + FRAME_BYTES]))
        if err:
            self.wfile.write(_frame(0x2, bytes([STDERR]) + err))
        status = json.dumps(_exit_status(command, code)).encode()
        self.wfile.write(_frame(0x2, bytes([ERROR]) + status))
        self.wfile.write(_frame(0x8, struct.pack("!H", 1000)))
        self.close_connection = True

    def _route(
        self, method: str, path: str, query: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, Any, str]:
        c = self.cluster
        for pattern, api_version in ROUTES:
            m = pattern.match(path)
            if not m:
                continue
            res, name, ns = m["res"], m["name"], m.groupdict().get("ns") or CLUSTER
            if method not in ALLOWED[res]:
                raise ApiError(405, "MethodNotAllowed", f"{method} {res} is not served by the fake")
            if res == "nodes":
                return self._nodes(method, name, query, body)
            if res == "pods" and method == "GET":
                c.tick()  # polling pods is what moves the fake clock
            if m.groupdict().get("sub") == "/log":
                text = c.pod_log(ns, name, query.get("container"), query.get("previous") == "true")
                if "limitBytes" in query:
                    text = text.encode()[: int(query["limitBytes"])].decode(errors="ignore")
                if "tailLines" in query:
                    text = "".join(text.splitlines(keepends=True)[-int(query["tailLines"]) :])
                return 200, text, "text/plain"
            if method == "GET" and name is None:
                items = c.list(
                    res, ns, query.get("labelSelector", ""), query.get("fieldSelector", "")
                )
                return (
                    200,
                    {
                        "kind": LIST_KIND[res],
                        "apiVersion": api_version,
                        "metadata": {"resourceVersion": str(c._rv)},
                        "items": items,
                    },
                    "application/json",
                )
            if method == "GET":
                return 200, c.get(res, ns, name), "application/json"
            if method == "POST":
                if res == "podmonitors" and not c.crds:
                    raise ApiError(
                        404, "NotFound", "the server could not find the requested resource"
                    )
                if body.get("metadata", {}).get("namespace", ns) != ns:
                    raise ApiError(
                        400, "BadRequest", "the namespace of the object does not match the URL"
                    )
                if res == "pods":
                    return 201, c.create_pod(ns, body), "application/json"
                return 201, c.create(res, ns, body), "application/json"
            if method == "PUT":
                if body["metadata"]["name"] != name:
                    raise ApiError(
                        400, "BadRequest", "the name of the object does not match the URL"
                    )
                return 200, c.replace(res, ns, name, body), "application/json"
            if method == "DELETE":
                return 200, c.delete(res, ns, name), "application/json"
        raise ApiError(
            404, "NotFound", f"the server could not find the requested resource ({path})"
        )

    def _nodes(
        self, method: str, name: str | None, query: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, Any, str]:
        c = self.cluster
        if method == "PATCH":
            if name is None:
                raise ApiError(405, "MethodNotAllowed", "PATCH of the node collection")
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            return 200, c.patch_node(name, body, content_type), "application/json"
        if name is not None:
            return 200, c.node_named(name), "application/json"
        items = c.list_nodes(query.get("labelSelector", ""))
        listing = {
            "kind": "NodeList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(c._rv)},
            "items": items,
        }
        return 200, listing, "application/json"

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")


class FakeKube:
    """A running fake API server: `url`, `cluster`, `write_kubeconfig(path)`, `api_client()`."""

    def __init__(self, cluster: FakeCluster) -> None:
        handler = type("Handler", (_Handler,), {"cluster": cluster})
        self.cluster = cluster
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeKube:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def write_kubeconfig(self, path: str | Path, namespace: str = "servelab") -> Path:
        """A kubeconfig pointing at this server (a dummy bearer token: the fake checks none)."""
        import yaml

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-kube-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path = Path(path)
        path.write_text(yaml.safe_dump(config, sort_keys=True), encoding="utf-8")
        return path

    def api_client(self) -> Any:
        """A real kubernetes.client.ApiClient configured with Configuration(host=url)."""
        from kubernetes import client

        configuration = client.Configuration(host=self.url)
        configuration.retries = 0
        return client.ApiClient(configuration)


@contextlib.contextmanager
def running(cluster: FakeCluster) -> Iterator[FakeKube]:
    kube = FakeKube(cluster).start()
    try:
        yield kube
    finally:
        kube.stop()
