"""State of the fake cluster: objects, N GPU nodes (one by default), and scripted engine pod
lifecycles.

Only what servelab uses is modelled. Object shapes follow the Kubernetes API reference (v1.35):
apps/v1 Deployment, v1 Service / PersistentVolumeClaim / Pod / Node / Event / ServiceAccount /
ConfigMap, monitoring.coreos.com/v1 PodMonitor, batch/v1 Job, rbac.authorization.k8s.io/v1
Role / RoleBinding / ClusterRole / ClusterRoleBinding (stored, never enforced), and metav1 Status
for errors.

Time is a fake clock that advances by `tick_s` each time a client *polls* pods (list, get), so a
test's waits are deterministic and take milliseconds. Every pod transition is stamped with the
exact time its script says (not the tick at which it was noticed), so phase durations in a
restart record equal the scripted durations.

Nodes: `nodes` GKE Spot nodes of one GPU pool, each with one `nvidia.com/gpu`, the pool's labels
and its `nvidia.com/gpu` taint (GKE's), Ready. Node labels can be changed through PATCH (JSON merge
patch, with `metadata.resourceVersion` as a precondition when given, as the API server does).
`reclaim_node(name)` preempts one node: its pods vanish and the node object is replaced by a fresh
one (new uid, boot id and instance id) carrying only the pool's labels, never one a client set, as
GKE's managed instance group recreates a Spot VM.

The scheduler places a pod on a node that matches its `nodeSelector`, whose `NoSchedule` taints it
tolerates, that is Ready, and whose one GPU no other pod holds (a pod holds it from scheduling until
it is gone); among several, the first by name. A pod referencing a claim that does not exist is not
scheduled. A ReadWriteOnce claim attaches to one node at a time: a pod on another node waits in
ContainerCreating with a `FailedAttachVolume` (Multi-Attach) event until no pod on another node
uses it.

Pod lifecycle (per `PodScript`, durations in seconds): created -> scheduled (`schedule_s` after
creation, and never while another pod holds the node's one GPU) -> volumes attached -> image pull
(`pull_s`; None = image already on the node, only a `Pulled` event) -> container started
(`start_s`) -> Ready (`ready_s`; None = never). A deleted pod is gone `terminate_s` after the
request. A pod whose Secret is missing stays in CreateContainerConfigError. A Deployment without a
live pod gets a new one, as its ReplicaSet would.

Pods that request no GPU (the campaign Job's, the fetch helper's) run on the cluster's CPU node
(`CPU_NODE`, or the `nodeName` they name) and wait for no GPU; their script is looked up by
container name (`DEFAULT_SCRIPT` otherwise). A script with `exit_after_s` ends its container with
`exit_code`. The Job controller (fakekube.batch) gives a Job one pod at a time, replaces a pod
that is gone only once it has terminated (as `podReplacementPolicy: Failed` does), counts it as
failed, and fails the Job past `backoffLimit`. A PersistentVolumeClaim's content is a local folder
(`volumes`), which `exec` of `tar` reads.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

START = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC).timestamp()
GVR = {
    "deployments": ("apps", "Deployment"),
    "services": ("", "Service"),
    "persistentvolumeclaims": ("", "PersistentVolumeClaim"),
    "podmonitors": ("monitoring.coreos.com", "PodMonitor"),
    "pods": ("", "Pod"),
    "events": ("", "Event"),
    "jobs": ("batch", "Job"),
    "serviceaccounts": ("", "ServiceAccount"),
    "configmaps": ("", "ConfigMap"),
    "roles": ("rbac.authorization.k8s.io", "Role"),
    "rolebindings": ("rbac.authorization.k8s.io", "RoleBinding"),
    "clusterroles": ("rbac.authorization.k8s.io", "ClusterRole"),
    "clusterrolebindings": ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
}
# Cluster-scoped resources are stored under this namespace.
CLUSTER = ""
# The CPU pool's node, where pods that request no GPU run (no Node object is served for it).
CPU_NODE = "gke-servelab-default-pool-3c9e1d7a-q8w2"
# The GPU pool's nodes: the first keeps the name every single-node test knows.
GPU_POOL = "gke-servelab-gpu-pool-6a1f0c2e"
NODE_SUFFIXES = ("k3xz", "m7qd", "r2wv", "t9hc", "b5nf", "x8lg", "c4pj", "h6sz")
TERMINATION_TAINT = "cloud.google.com/impending-node-termination"


def rfc3339(t: float) -> str:
    """metav1.Time: whole seconds."""
    return datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro(t: float) -> str:
    """metav1.MicroTime."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    """Becomes a metav1.Status response."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


@dataclass
class PodScript:
    """How an engine's pods behave (seconds on the fake clock)."""

    log: str
    schedule_s: float = 1.0
    pull_s: float | None = 3.0
    start_s: float = 1.0
    ready_s: float | None = 120.0
    terminate_s: float = 5.0
    # The container ends this long after it started (None: it runs until deleted), with this code.
    exit_after_s: float | None = None
    exit_code: int = 0


# Pods whose container has no script of its own: on their node at once, ready when started.
DEFAULT_SCRIPT = PodScript("", schedule_s=1.0, pull_s=None, start_s=1.0, ready_s=0.0)


@dataclass
class _PodState:
    name: str
    engine: str
    deployment: str
    template_hash: str
    created: float
    scheduled: float | None = None
    pulling: float | None = None
    pulled: float | None = None
    started: float | None = None
    ready: float | None = None
    delete_requested: float | None = None
    gone: float | None = None
    blocked_secret: str | None = None
    done: set[str] = field(default_factory=set)
    node: str | None = None  # the node it is scheduled on
    attached: float | None = None  # when its volumes were attached (after scheduling)
    claims: tuple[str, ...] = ()  # the PersistentVolumeClaims it mounts
    gpu: bool = True  # requests the GPU: waits for a GPU node's one GPU
    job: str | None = None  # the Job that owns the pod
    finished: float | None = None  # the container exited (exit_code)
    exit_code: int | None = None
    counted: bool = False  # counted in its Job's status (succeeded or failed)


class FakeCluster:
    """Thread-safe state behind the fake API server."""

    def __init__(
        self,
        scripts: dict[str, PodScript],
        *,
        namespaces: tuple[str, ...] = ("servelab",),
        secrets: dict[tuple[str, str], dict[str, str]] | None = None,
        crds: bool = True,
        tick_s: float = 1.0,
        spot: bool = True,
        nodes: int = 1,
        hold: Callable[[FakeCluster], bool] | None = None,
        volumes: dict[str, Path] | None = None,
    ) -> None:
        self.lock = threading.RLock()
        # While hold(cluster) is true no pod is scheduled (a test's barrier: say, until every
        # deployment it expects at once exists).
        self.hold = hold
        self.scripts = scripts
        # claim name -> the local folder standing for its content (read by `exec` of tar)
        self.volumes = dict(volumes or {})
        self.namespaces = set(namespaces)
        # (namespace, name) -> {key: value}. Held to model a missing Secret; never served.
        self.secrets = dict(secrets or {})
        self.crds = crds
        self.tick_s = tick_s
        self.now = START
        self.requests: list[tuple[str, str]] = []
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pods: dict[str, _PodState] = {}
        self._rv = 1000
        self._uid = 0
        self._pod_counter = 0
        self._event_counter = 0
        # The GPU nodes, in creation order (a replacement takes its predecessor's place), and
        # since when each node's GPU has been free.
        self.node_list: list[dict[str, Any]] = []
        self.gpu_free_since: dict[str, float] = {}
        self._generation = 0
        for i in range(nodes):
            suffix = NODE_SUFFIXES[i] if i < len(NODE_SUFFIXES) else f"n{i:03d}"
            self.node_list.append(self._make_node(f"{GPU_POOL}-{suffix}", i, spot=spot))
            self.gpu_free_since[self.node_list[-1]["metadata"]["name"]] = START
        self._generation = nodes - 1

    # ------------------------------------------------------------------ basics

    def uid(self) -> str:
        self._uid += 1
        digest = hashlib.sha256(f"uid-{self._uid}".encode()).hexdigest()
        return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"

    def rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def tick(self) -> None:
        """Advance the clock one step and let controllers, scheduler and kubelet act."""
        self.now += self.tick_s
        self.reconcile()

    @property
    def node(self) -> dict[str, Any]:
        """The first GPU node (the only one of a single-node cluster)."""
        return self.node_list[0]

    @property
    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.node_list]

    def node_named(self, name: str | None) -> dict[str, Any]:
        """The node called `name` (None: the first); 404 when there is none."""
        for node in self.node_list:
            if name is None or node["metadata"]["name"] == name:
                return node
        raise ApiError(404, "NotFound", f'nodes "{name}" not found')

    def _make_node(self, name: str, generation: int, *, spot: bool) -> dict[str, Any]:
        instance = 4_611_686_018_427_387_904 + generation * 7919
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": self.uid(),
                "resourceVersion": self.rv(),
                "creationTimestamp": rfc3339(self.now),
                "labels": {
                    "cloud.google.com/gke-accelerator": "nvidia-l4",
                    "cloud.google.com/gke-nodepool": "gpu-pool",
                    "node.kubernetes.io/instance-type": "g2-standard-8",
                    "topology.kubernetes.io/zone": "us-central1-a",
                    "kubernetes.io/hostname": name,
                    **({"cloud.google.com/gke-spot": "true"} if spot else {}),
                },
                "annotations": {"container.googleapis.com/instance_id": str(instance)},
            },
            "spec": {
                "providerID": f"gce://servelab-study/us-central1-a/{name}",
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            },
            "status": {
                "capacity": {"cpu": "8", "memory": "32880756Ki", "nvidia.com/gpu": "1"},
                "allocatable": {"cpu": "7910m", "memory": "28455540Ki", "nvidia.com/gpu": "1"},
                "nodeInfo": {
                    "machineID": hashlib.md5(f"m{generation}".encode()).hexdigest(),
                    "systemUUID": hashlib.md5(f"s{generation}".encode()).hexdigest(),
                    "bootID": self.uid(),
                    "kernelVersion": "6.6.72+",
                    "osImage": "Container-Optimized OS from Google",
                    "containerRuntimeVersion": "containerd://1.7.24",
                    "kubeletVersion": "v1.35.0-gke.1000000",
                    "kubeProxyVersion": "v1.35.0-gke.1000000",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": rfc3339(self.now),
                        "lastTransitionTime": rfc3339(self.now),
                    }
                ],
            },
        }

    def reclaim_node(self, name: str | None = None, *, keep_name: bool = True) -> str:
        """The Spot VM of node `name` (None: the first) is preempted and its instance group
        recreates it; returns the replacement's name. With `keep_name` (what a GCE managed
        instance group does) the node keeps its name and providerID; its uid, boot id and
        instance id change, and it carries the pool's labels only (none a client added). Pods on
        it vanish at once; other nodes and their pods are untouched."""
        with self.lock:
            old = self.node_named(name)
            old_name = old["metadata"]["name"]
            self._generation += 1
            gen = self._generation
            new_name = old_name if keep_name else f"{GPU_POOL}-{gen:04d}"
            spot = "cloud.google.com/gke-spot" in old["metadata"]["labels"]
            for pod in self.pods.values():
                if pod.gone is None and pod.node == old_name:
                    pod.gone = self.now
                    self._remove_pod(pod)
            del self.gpu_free_since[old_name]
            self.gpu_free_since[new_name] = self.now
            self.node_list[self.node_list.index(old)] = self._make_node(new_name, gen, spot=spot)
            return new_name

    def taint_terminating(self, name: str | None = None) -> None:
        """GKE marks a Spot node being preempted with this taint."""
        with self.lock:
            self.node_named(name)["spec"]["taints"].append(
                {"key": TERMINATION_TAINT, "effect": "NoSchedule"}
            )

    def set_node_ready(self, name: str | None, ready: bool) -> None:
        """The node's kubelet stops (or resumes) posting Ready."""
        with self.lock:
            node = self.node_named(name)
            for cond in node["status"]["conditions"]:
                if cond["type"] == "Ready":
                    cond.update(
                        status="True" if ready else "Unknown",
                        reason="KubeletReady" if ready else "NodeStatusUnknown",
                        lastTransitionTime=rfc3339(self.now),
                    )
            node["metadata"]["resourceVersion"] = self.rv()

    def list_nodes(self, label_selector: str = "") -> list[dict[str, Any]]:
        wanted = _parse_selector(label_selector)
        return [
            copy.deepcopy(n)
            for n in self.node_list
            if all(n["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]

    def patch_node(self, name: str, body: dict[str, Any], content_type: str) -> dict[str, Any]:
        """PATCH a node: a JSON merge patch (RFC 7386) of its metadata. A `resourceVersion` in
        the patch is a precondition: 409 Conflict when the node has changed since."""
        if content_type not in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            raise ApiError(415, "UnsupportedMediaType", f"{content_type} (fake server)")
        node = self.node_named(name)
        if set(body) - {"metadata"}:
            raise ApiError(422, "Invalid", "the fake server patches node metadata only")
        meta = body.get("metadata") or {}
        given_rv = meta.get("resourceVersion")
        if given_rv is not None and given_rv != node["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )
        patch = {k: v for k, v in meta.items() if k != "resourceVersion"}
        node["metadata"] = _merge_patch(node["metadata"], patch)
        node["metadata"]["resourceVersion"] = self.rv()
        return copy.deepcopy(node)

    # ------------------------------------------------------------------ generic store

    def get(self, resource: str, ns: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((resource, ns, name))
        if obj is None:
            raise self._not_found(resource, name)
        return copy.deepcopy(obj)

    def _not_found(self, resource: str, name: str) -> ApiError:
        group = GVR[resource][0]
        what = f"{resource}.{group}" if group else resource
        return ApiError(404, "NotFound", f'{what} "{name}" not found')

    def list(
        self, resource: str, ns: str, label_selector: str = "", field_selector: str = ""
    ) -> list[dict[str, Any]]:
        wanted = _parse_selector(label_selector)
        fields = _parse_selector(field_selector)
        out = []
        for (res, ons, _), obj in sorted(self.objects.items()):
            if res != resource or ons != ns:
                continue
            labels = obj["metadata"].get("labels") or {}
            if any(labels.get(k) != v for k, v in wanted.items()):
                continue
            if any(_field(obj, k) != v for k, v in fields.items()):
                continue
            out.append(copy.deepcopy(obj))
        return out

    def create(self, resource: str, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        if ns != CLUSTER and ns not in self.namespaces:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
        if resource == "podmonitors" and not self.crds:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = body["metadata"]["name"]
        if (resource, ns, name) in self.objects:
            group = GVR[resource][0]
            what = f"{resource}.{group}" if group else resource
            raise ApiError(409, "AlreadyExists", f'{what} "{name}" already exists')
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        meta.update(
            namespace=ns,
            uid=self.uid(),
            resourceVersion=self.rv(),
            creationTimestamp=rfc3339(self.now),
        )
        if resource == "deployments":
            meta["generation"] = 1
            obj["status"] = {"observedGeneration": 1, "replicas": 0}
        if resource == "services":
            ip = f"10.96.{len(self.objects) % 250}.{(self._uid * 7) % 250 + 2}"
            obj["spec"]["clusterIP"], obj["spec"]["clusterIPs"] = ip, [ip]
            obj["spec"]["ipFamilies"], obj["spec"]["ipFamilyPolicy"] = ["IPv4"], "SingleStack"
            obj["status"] = {"loadBalancer": {}}
        if resource == "persistentvolumeclaims":
            obj["status"] = {"phase": "Pending"}
        if resource == "jobs":
            meta["generation"] = 1
            obj["status"] = {}
        self.objects[(resource, ns, name)] = obj
        self.reconcile()
        return copy.deepcopy(obj)

    def replace(self, resource: str, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        current = self.objects.get((resource, ns, name))
        if current is None:
            raise self._not_found(resource, name)
        given_rv = (body.get("metadata") or {}).get("resourceVersion")
        if given_rv and given_rv != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified',
            )
        if resource == "services" and body["spec"].get("clusterIP") not in (
            None,
            current["spec"]["clusterIP"],
        ):
            raise ApiError(
                422, "Invalid", f'Service "{name}" is invalid: spec.clusterIP: field is immutable'
            )
        obj = copy.deepcopy(body)
        keep = ("uid", "creationTimestamp", "namespace", "generation")
        obj["metadata"].update(
            {k: current["metadata"][k] for k in keep if k in current["metadata"]}
        )
        obj["metadata"]["resourceVersion"] = self.rv()
        if resource == "services":
            for key in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
                obj["spec"].setdefault(key, current["spec"][key])
        if resource == "deployments":
            changed = obj["spec"] != current["spec"]
            obj["metadata"]["generation"] = current["metadata"]["generation"] + int(changed)
            obj["status"] = current.get("status", {})
        self.objects[(resource, ns, name)] = obj
        self.reconcile()
        return copy.deepcopy(obj)

    def delete(self, resource: str, ns: str, name: str) -> dict[str, Any]:
        if (resource, ns, name) not in self.objects:
            raise self._not_found(resource, name)
        if resource == "pods":
            state = self.pods[name]
            if state.delete_requested is None:
                self._request_pod_deletion(state)
            return copy.deepcopy(self.objects[(resource, ns, name)])
        gone = self.objects.pop((resource, ns, name))
        if resource == "jobs":
            from .batch import delete_job  # the Job controller's garbage collection

            return delete_job(self, ns, gone)
        if resource != "deployments":
            return gone  # services and custom objects: the API returns the deleted object
        for state in self.pods.values():
            if state.deployment == name and state.delete_requested is None and state.gone is None:
                self._request_pod_deletion(state)  # the garbage collector, immediately
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": name,
                "group": "apps",
                "kind": "deployments",
                "uid": gone["metadata"]["uid"],
            },
        }

    # ------------------------------------------------------------------ pods

    def pod_log(self, ns: str, name: str, container: str | None, previous: bool) -> str:
        """The container's output so far: the script's log once the container has started."""
        self.get("pods", ns, name)  # 404 for an unknown pod
        state = self.pods[name]
        container = container or state.engine
        if previous:
            raise ApiError(
                400,
                "BadRequest",
                f'previous terminated container "{container}" in pod "{name}" not found',
            )
        if state.started is None:
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        lines = self.script(state).log.splitlines(keepends=True)
        return "".join(line for line in lines if not line.startswith("# source:"))

    def _request_pod_deletion(self, state: _PodState) -> None:
        obj = self.objects[("pods", _ns_of(self, state.name), state.name)]
        grace = int(obj["spec"].get("terminationGracePeriodSeconds", 30))
        state.delete_requested = self.now
        obj["metadata"]["deletionTimestamp"] = rfc3339(self.now + grace)
        obj["metadata"]["deletionGracePeriodSeconds"] = grace
        obj["metadata"]["resourceVersion"] = self.rv()
        if state.started is not None:
            self._event(state, "Killing", f"Stopping container {state.engine}", self.now)

    def _remove_pod(self, state: _PodState) -> None:
        for key in list(self.objects):
            if key[0] == "pods" and key[2] == state.name:
                del self.objects[key]

    def _create_pod(self, ns: str, deployment: dict[str, Any]) -> None:
        template = deployment["spec"]["template"]
        thash = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        rs_hash = "".join(
            alphabet[int(thash[i : i + 2], 16) % len(alphabet)] for i in range(0, 20, 2)
        )
        self._pod_counter += 1
        n = self._pod_counter * 104729
        suffix = "".join(alphabet[(n // len(alphabet) ** i) % len(alphabet)] for i in range(5))
        dname = deployment["metadata"]["name"]
        name = f"{dname}-{rs_hash}-{suffix}"
        spec = copy.deepcopy(template["spec"])
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "generateName": f"{dname}-{rs_hash}-",
                "namespace": ns,
                "uid": self.uid(),
                "resourceVersion": self.rv(),
                "creationTimestamp": rfc3339(self.now),
                "labels": {**template["metadata"]["labels"], "pod-template-hash": rs_hash},
                "annotations": dict(template["metadata"].get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": f"{dname}-{rs_hash}",
                        "uid": self.uid(),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**spec, "restartPolicy": "Always", "schedulerName": "default-scheduler"},
            "status": {"phase": "Pending", "qosClass": "Burstable"},
        }
        state = self.add_pod(ns, pod, owner_hash=thash)
        state.deployment, state.gpu = dname, True  # an engine: the GPU scheduler's
        for env in spec["containers"][0].get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if ref and (
                (ns, ref["name"]) not in self.secrets
                or ref["key"] not in self.secrets[(ns, ref["name"])]
            ):
                state.blocked_secret = ref["name"]

    def add_pod(
        self, ns: str, pod: dict[str, Any], *, owner_job: str | None = None, owner_hash: str = ""
    ) -> _PodState:
        """Store a pod (status Pending) and its lifecycle state: its first container names its
        script, its limits whether it needs a GPU, its volumes the claims it mounts."""
        container = pod["spec"]["containers"][0]
        limits = (container.get("resources") or {}).get("limits") or {}
        state = _PodState(
            pod["metadata"]["name"],
            container["name"],
            "",
            owner_hash,
            created=self.now,
            gpu=any(key.endswith("/gpu") for key in limits),
            job=owner_job,
        )
        state.claims = tuple(
            v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"].get("volumes") or []
            if v.get("persistentVolumeClaim")
        )
        pod.setdefault("status", {"phase": "Pending", "qosClass": "Burstable"})
        self.objects[("pods", ns, state.name)] = pod
        self.pods[state.name] = state
        return state

    def create_pod(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST /pods: a bare pod (servelab campaign fetch's helper)."""
        if ns not in self.namespaces:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
        name = body["metadata"]["name"]
        if ("pods", ns, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists')
        pod = copy.deepcopy(body)
        pod["metadata"].update(
            namespace=ns,
            uid=self.uid(),
            resourceVersion=self.rv(),
            creationTimestamp=rfc3339(self.now),
        )
        pod["spec"].setdefault("schedulerName", "default-scheduler")
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
        self.add_pod(ns, pod)
        self.reconcile()
        return copy.deepcopy(self.objects[("pods", ns, name)])

    def script(self, state: _PodState) -> PodScript:
        """The pod's script: its container's, else (a pod that is no engine) the default one."""
        if state.gpu:
            return self.scripts[state.engine]
        return self.scripts.get(state.engine, DEFAULT_SCRIPT)

    def _event(
        self, state: _PodState, reason: str, message: str, t: float, *, scheduler: bool = False
    ) -> None:
        self._event_counter += 1
        host = state.node or self.node["metadata"]["name"]
        ns = _ns_of(self, state.name)
        pod = self.objects.get(("pods", ns, state.name))
        name = f"{state.name}.{(0x181A2B3C4D5E6F70 + self._event_counter):x}"
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": self.uid(),
                "resourceVersion": self.rv(),
                "creationTimestamp": rfc3339(t),
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": state.name,
                "namespace": ns,
                "uid": pod["metadata"]["uid"] if pod else None,
            },
            "reason": reason,
            "message": message,
            "type": "Normal",
        }
        if scheduler:
            # The scheduler records through events.k8s.io/v1: core/v1 shows eventTime only.
            event.update(
                source={},
                eventTime=micro(t),
                firstTimestamp=None,
                lastTimestamp=None,
                reportingComponent="default-scheduler",
                reportingInstance="default-scheduler-gke",
                action="Binding",
            )
        else:
            event["involvedObject"]["fieldPath"] = f"spec.containers{{{state.engine}}}"
            event.update(
                source={"component": "kubelet", "host": host},
                firstTimestamp=rfc3339(t),
                lastTimestamp=rfc3339(t),
                count=1,
                eventTime=None,
                reportingComponent="kubelet",
                reportingInstance=host,
            )
        if reason in ("Failed", "FailedAttachVolume"):
            event["type"] = "Warning"
        self.objects[("events", ns, name)] = event

    # ------------------------------------------------------------------ controllers

    def reconcile(self) -> None:
        """Deployment controller, scheduler and kubelet, up to the current time."""
        for (res, ns, _name), dep in sorted(self.objects.items()):
            if res != "deployments":
                continue
            dname = dep["metadata"]["name"]
            thash = hashlib.sha256(
                json.dumps(dep["spec"]["template"], sort_keys=True).encode()
            ).hexdigest()
            current = [p for p in self.pods.values() if p.deployment == dname and p.gone is None]
            for state in current:
                if state.template_hash != thash and state.delete_requested is None:
                    self._request_pod_deletion(state)  # Recreate strategy: old pods go first
            old_left = any(p.template_hash != thash for p in current)
            active = [p for p in current if p.delete_requested is None]
            if not active and not old_left:
                self._create_pod(ns, dep)  # the ReplicaSet replaces a deleted or vanished pod
        from .batch import reconcile_jobs  # the Job controller

        reconcile_jobs(self)
        for state in sorted(self.pods.values(), key=lambda s: s.created):
            # a container that exited stays as it is, unless the pod is being deleted
            if state.gone is None and (state.finished is None or state.delete_requested):
                self._advance(state)
        for (res, _ns, _name), dep in self.objects.items():
            if res == "deployments":
                dname = dep["metadata"]["name"]
                pods = [p for p in self.pods.values() if p.deployment == dname and p.gone is None]
                ready = sum(1 for p in pods if p.ready is not None and p.ready <= self.now)
                dep["status"] = {
                    "observedGeneration": dep["metadata"]["generation"],
                    "replicas": len(pods),
                    "readyReplicas": ready,
                    "availableReplicas": ready,
                    "updatedReplicas": len(pods),
                }

    def _gpu_holder(self, state: _PodState, node: str) -> _PodState | None:
        for other in self.pods.values():
            if other is not state and other.gone is None and other.node == node:
                return other
        return None

    def _misfit(self, state: _PodState, spec: dict[str, Any], node: dict[str, Any]) -> str | None:
        """Why `node` cannot take the pod, in the scheduler's words (None: it can)."""
        labels = node["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        tolerated = {t.get("key") for t in spec.get("tolerations") or []}
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") == "NoSchedule" and taint["key"] not in tolerated:
                return f"node(s) had untolerated taint {{{taint['key']}: }}"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        if not ready or ready[0]["status"] != "True":
            return "node(s) had untolerated taint {node.kubernetes.io/unreachable: }"
        if self._gpu_holder(state, node["metadata"]["name"]) is not None:
            return "Insufficient nvidia.com/gpu"
        return None

    def _place(self, state: _PodState, pod: dict[str, Any]) -> str | None:
        """The node the scheduler binds the pod to now (None: none fits; said once, as a
        FailedScheduling event)."""
        ns = pod["metadata"]["namespace"]
        missing = [c for c in state.claims if ("persistentvolumeclaims", ns, c) not in self.objects]
        fits: list[str] = []
        why: dict[str, int] = {}
        if missing:
            total = len(self.node_list) + 1
            message = (
                f'0/{total} nodes are available: persistentvolumeclaim "{missing[0]}" not found.'
            )
        else:
            for node in self.node_list:
                reason = self._misfit(state, pod["spec"], node)
                if reason is None:
                    fits.append(node["metadata"]["name"])
                else:
                    why[reason] = why.get(reason, 0) + 1
            if fits:
                return sorted(fits)[0]
            # the cluster's CPU node matches no GPU selector
            selector = "node(s) didn't match Pod's node affinity/selector"
            why[selector] = why.get(selector, 0) + 1
            parts = ", ".join(f"{n} {reason}" for reason, n in sorted(why.items()))
            message = f"0/{len(self.node_list) + 1} nodes are available: {parts}."
        if "FailedScheduling" not in state.done:
            state.done.add("FailedScheduling")
            self._event(state, "FailedScheduling", message, self.now, scheduler=True)
        return None

    def _attach_blocker(self, state: _PodState) -> str | None:
        """A pod on another node using a ReadWriteOnce claim this pod mounts (None: none)."""
        ns = _ns_of(self, state.name)
        for claim in state.claims:
            pvc = self.objects.get(("persistentvolumeclaims", ns, claim)) or {}
            if "ReadWriteOnce" not in (pvc.get("spec") or {}).get("accessModes", []):
                continue
            for other in self.pods.values():
                if (
                    other is not state
                    and other.gone is None
                    and other.node not in (None, state.node)
                    and claim in other.claims
                ):
                    return other.name
        return None

    def _schedule(self, s: _PodState, pod: dict[str, Any], script: PodScript) -> bool:
        """Bind the pod to a node once one fits and its GPU is free; True once bound. A pod that
        requests no GPU goes to the node it names, else to the CPU node, at once."""
        if s.gpu and self.hold is not None and self.hold(self):
            return False
        node = self._place(s, pod) if s.gpu else str(pod["spec"].get("nodeName") or CPU_NODE)
        if node is None:
            return False
        due = s.created + script.schedule_s
        if s.gpu:
            due = max(due, self.gpu_free_since[node])
        if self.now < due:
            return False
        s.scheduled, s.node = due, node
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(due)}
        ]
        ns = pod["metadata"]["namespace"]
        self._event(
            s, "Scheduled", f"Successfully assigned {ns}/{s.name} to {node}", due, scheduler=True
        )
        return True

    def _attach(self, s: _PodState, pod: dict[str, Any]) -> bool:
        """Attach the pod's volumes once no pod on another node holds a ReadWriteOnce claim of
        them; True once attached (at scheduling when nothing was in the way)."""
        blocker = self._attach_blocker(s)
        if blocker is None:
            s.attached = s.scheduled if "FailedAttachVolume" not in s.done else self.now
            return True
        if "FailedAttachVolume" not in s.done:
            s.done.add("FailedAttachVolume")
            image = pod["spec"]["containers"][0]["image"]
            pod["status"]["containerStatuses"] = [
                _container_status(s.engine, image, ready=False, waiting=("ContainerCreating", None))
            ]
            self._event(
                s,
                "FailedAttachVolume",
                f"Multi-Attach error for volume {', '.join(s.claims)}: Volume is already used by "
                f"pod(s) {blocker}",
                self.now,
            )
        return False

    def _advance(self, s: _PodState) -> None:
        script = self.script(s)
        ns = _ns_of(self, s.name)
        pod = self.objects[("pods", ns, s.name)]
        # Termination first: a pod being deleted goes nowhere else.
        if s.delete_requested is not None:
            due = s.delete_requested + script.terminate_s
            if self.now >= due:
                s.gone = due
                if s.node in self.gpu_free_since:
                    self.gpu_free_since[s.node] = max(self.gpu_free_since[s.node], due)
                self._remove_pod(s)
            return
        if s.scheduled is None and not self._schedule(s, pod, script):
            return
        if s.attached is None and not self._attach(s, pod):
            return
        image = pod["spec"]["containers"][0]["image"]
        if s.blocked_secret is not None:
            if "blocked" not in s.done:
                s.done.add("blocked")
                pod["status"]["containerStatuses"] = [
                    _container_status(
                        s.engine,
                        image,
                        ready=False,
                        waiting=(
                            "CreateContainerConfigError",
                            f'secret "{s.blocked_secret}" not found',
                        ),
                    )
                ]
                self._event(
                    s, "Failed", f'Error: secret "{s.blocked_secret}" not found', s.attached
                )
            return
        if s.pulled is None:
            if script.pull_s is None:
                s.pulled = s.attached
                self._event(
                    s, "Pulled", f'Container image "{image}" already present on machine', s.pulled
                )
            else:
                if s.pulling is None:
                    s.pulling = s.attached
                    self._event(s, "Pulling", f'Pulling image "{image}"', s.pulling)
                    pod["status"]["containerStatuses"] = [
                        _container_status(
                            s.engine, image, ready=False, waiting=("ContainerCreating", None)
                        )
                    ]
                due = s.pulling + script.pull_s
                if self.now < due:
                    return
                s.pulled = due
                self._event(
                    s,
                    "Pulled",
                    f'Successfully pulled image "{image}" in {script.pull_s:.3f}s '
                    f"({script.pull_s:.3f}s including waiting). Image size: 10212345678 bytes.",
                    due,
                )
        if s.started is None:
            due = s.pulled + script.start_s
            if self.now < due:
                return
            s.started = due
            self._event(s, "Created", f"Created container: {s.engine}", due)
            self._event(s, "Started", f"Started container {s.engine}", due)
            pod["status"].update(
                phase="Running",
                startTime=rfc3339(s.created),
                hostIP="10.128.0.7",
                podIP="10.12.0.9",
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "True",
                        "lastTransitionTime": rfc3339(s.scheduled),
                    },
                    {
                        "type": "Initialized",
                        "status": "True",
                        "lastTransitionTime": rfc3339(s.scheduled),
                    },
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "ContainersNotReady",
                        "message": f"containers with unready status: [{s.engine}]",
                        "lastTransitionTime": rfc3339(s.scheduled),
                    },
                    {
                        "type": "ContainersReady",
                        "status": "False",
                        "reason": "ContainersNotReady",
                        "message": f"containers with unready status: [{s.engine}]",
                        "lastTransitionTime": rfc3339(s.scheduled),
                    },
                ],
                containerStatuses=[_container_status(s.engine, image, ready=False, running=due)],
            )
        if s.ready is None and script.ready_s is not None:
            due = s.started + script.ready_s
            if self.now < due:
                return
            s.ready = due
            for cond in pod["status"]["conditions"]:
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond.update(status="True", lastTransitionTime=rfc3339(due))
                    cond.pop("reason", None)
                    cond.pop("message", None)
            pod["status"]["containerStatuses"] = [
                _container_status(s.engine, image, ready=True, running=s.started)
            ]
        if s.finished is None and script.exit_after_s is not None and s.ready is not None:
            self._exit(s, pod, image, s.started + script.exit_after_s, script.exit_code)

    def _exit(self, s: _PodState, pod: dict[str, Any], image: str, when: float, code: int) -> None:
        """The container ends at `when` (once the clock is there): the pod is Succeeded (code 0)
        or Failed, and stays (a restartPolicy Never pod is not restarted)."""
        if self.now < when:
            return
        s.finished, s.exit_code = when, code
        status = _container_status(s.engine, image, ready=False)
        status["started"] = False
        status["state"] = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": rfc3339(s.started or when),
                "finishedAt": rfc3339(when),
            }
        }
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        pod["status"]["containerStatuses"] = [status]
        for cond in pod["status"].get("conditions") or []:
            if cond["type"] in ("Ready", "ContainersReady"):
                cond.update(status="False", reason="PodCompleted", lastTransitionTime=rfc3339(when))


def _container_status(
    name: str,
    image: str,
    *,
    ready: bool,
    running: float | None = None,
    waiting: tuple[str, str | None] | None = None,
) -> dict[str, Any]:
    state: dict[str, Any]
    if running is not None:
        state = {"running": {"startedAt": rfc3339(running)}}
    else:
        reason, message = waiting or ("ContainerCreating", None)
        state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    repo = image.split("@", 1)[0].rsplit(":", 1)[0]
    digest = image.split("@", 1)[1] if "@" in image else "sha256:" + "0" * 64
    return {
        "name": name,
        "image": image,
        "imageID": f"docker.io/{repo}@{digest}",
        "ready": ready,
        "started": running is not None,
        "restartCount": 0,
        "state": state,
        "lastState": {},
        **(
            {"containerID": f"containerd://{hashlib.sha256(name.encode()).hexdigest()}"}
            if running
            else {}
        ),
    }


def _ns_of(cluster: FakeCluster, pod_name: str) -> str:
    for res, ns, name in cluster.objects:
        if res == "pods" and name == pod_name:
            return ns
    return next(iter(sorted(cluster.namespaces)))


def _parse_selector(text: str) -> dict[str, str]:
    """Equality-based selectors only (`a=b,c=d`): all the backend sends."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.endswith("!"):
            raise ApiError(400, "BadRequest", f"unsupported selector {part!r} (fake server)")
        out[key] = value.lstrip("=")
    return out


def _field(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out
