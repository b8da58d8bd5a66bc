"""Node identity, Spot reclamation detection and node-slot pinning (study §3.2, §5.4).

This module owns what a node and an engine pod *are* across a run: reading their identity
(`node_identity` from API objects; `observe` from the cluster, servelab.deploy.kube_cluster) and
telling a reclamation from it (`detect_reclamation`; `reclamation` and `node_change`, the tests the
kubernetes backend gives a run at its end and during it). A run observes its own engine pod and
that pod's node only, so a reclamation concerns the runs on the reclaimed node and no other.

It also owns which node a node slot (servelab.deploy.NodeSlot, config `campaign.gpu_nodes`)
measures on. With more than one slot, slot k's node carries the label `servelab.dev/node-slot=k`,
which servelab sets (`pin_node`, `choose_node`), and the deployment's objects are pinned to it when
they are applied, never when they are rendered (`place`): its pod template gets the label as a
nodeSelector, and its weight claim is the slot's own (a ReadWriteOnce volume attaches to one node
at a time). With one slot nothing is labelled and nothing placed: the objects go as rendered.

A run records the identity of the GPU node and of the engine pod at its start and at its end.
`detect_reclamation(start, end)` compares the two and names what changed. On GKE a reclaimed Spot
VM is usually recreated by its managed instance group *under the same instance name*, so the node
name and `spec.providerID` (`gce://project/zone/instance-name`) can survive a reclamation; the node
object's `metadata.uid`, the GCE instance id (node annotation `container.googleapis.com/instance_id`)
and the kernel boot id (`status.nodeInfo.bootID`) do not. All of them are compared.

The identity dict holds stable identifiers only (no observation timestamps), so two observations of
an unchanged node and pod compare equal. Keys (None when the API object does not show them):

| key | from |
|---|---|
| `name` | node `metadata.name` |
| `uid` | node `metadata.uid` |
| `provider_id` | node `spec.providerID` |
| `instance_id` | node annotation `container.googleapis.com/instance_id` (GKE) |
| `boot_id` | node `status.nodeInfo.bootID` |
| `spot` | true when the Spot/preemptible label is `"true"` |
| `spot_label` | which label said so: `cloud.google.com/gke-spot` or `cloud.google.com/gke-preemptible` |
| `instance_type` | node label `node.kubernetes.io/instance-type` |
| `zone` | node label `topology.kubernetes.io/zone` |
| `accelerator` | node label `cloud.google.com/gke-accelerator` |
| `pod_name`, `pod_uid` | the engine pod's `metadata` |
| `container_restarts` | the engine container's `restartCount` |

Two further keys appear only when something is wrong at observation time, so they also make start
and end differ: `node_gone` (the node object no longer exists) and `terminating` (the node carries
GKE's `cloud.google.com/impending-node-termination` taint, set when a Spot VM is being preempted).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from servelab.deploy.backend import NodeSlot

if TYPE_CHECKING:
    from servelab.deploy.kube_cluster import KubeCluster

__all__ = [
    "IDENTITY_KEYS",
    "SLOT_LABEL",
    "SPOT_LABELS",
    "TERMINATION_TAINTS",
    "SlotChoice",
    "choose_node",
    "detect_reclamation",
    "eligible",
    "label_slot",
    "node_change",
    "node_identity",
    "observe",
    "on_other_slot",
    "pin_node",
    "place",
    "reclamation",
]

log = logging.getLogger(__name__)

# The node label servelab sets on slot k's node (value "k"), and the nodeSelector it adds to an
# engine pod of slot k when applying; also set on the slot's Deployment and weight claim.
SLOT_LABEL = "servelab.dev/node-slot"

SPOT_LABELS = ("cloud.google.com/gke-spot", "cloud.google.com/gke-preemptible")
INSTANCE_ID_ANNOTATION = "container.googleapis.com/instance_id"
TERMINATION_TAINTS = ("cloud.google.com/impending-node-termination",)

# Compared in this order; the first difference is named first in the reason.
NODE_KEYS = ("uid", "instance_id", "boot_id", "provider_id", "name")
POD_KEYS = ("pod_uid", "pod_name")
IDENTITY_KEYS = (
    "name",
    "uid",
    "provider_id",
    "instance_id",
    "boot_id",
    "spot",
    "spot_label",
    "instance_type",
    "zone",
    "accelerator",
    "pod_name",
    "pod_uid",
    "container_restarts",
)


def _as_dict(obj: Any) -> dict[str, Any]:
    """An API object as the JSON-shaped dict the API server sends (camelCase keys)."""
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "to_dict"):
        # kubernetes client models: serialise by alias so keys match the API reference (imported
        # here: the client takes half a second to import, and only its models need it).
        from kubernetes.client import ApiClient

        # the client's serialiser is unannotated (returns the JSON-shaped dict for a model)
        as_json: dict[str, Any] = ApiClient().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return as_json
    raise TypeError(f"expected a Kubernetes API object or a mapping, got {type(obj).__name__}")


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def node_identity(node: Any, pod: Any = None, *, container: str | None = None) -> dict[str, Any]:
    """The identity of `node` (a V1Node or its JSON dict) and, if given, of the engine `pod`.

    `container` names the engine container whose restart count is recorded (default: the first).
    A `node` of None means the node object no longer exists: the result says `node_gone`.
    """
    ident: dict[str, Any] = dict.fromkeys(IDENTITY_KEYS)
    n = _as_dict(node)
    if not n:
        ident["node_gone"] = True
    else:
        labels = _get(n, "metadata", "labels") or {}
        annotations = _get(n, "metadata", "annotations") or {}
        ident["name"] = _get(n, "metadata", "name")
        ident["uid"] = _get(n, "metadata", "uid")
        ident["provider_id"] = _get(n, "spec", "providerID")
        ident["instance_id"] = annotations.get(INSTANCE_ID_ANNOTATION)
        ident["boot_id"] = _get(n, "status", "nodeInfo", "bootID")
        ident["spot"] = False
        for label in SPOT_LABELS:
            if str(labels.get(label, "")).lower() == "true":
                ident["spot"], ident["spot_label"] = True, label
                break
        ident["instance_type"] = labels.get("node.kubernetes.io/instance-type")
        ident["zone"] = labels.get("topology.kubernetes.io/zone")
        ident["accelerator"] = labels.get("cloud.google.com/gke-accelerator")
        taints = _get(n, "spec", "taints") or []
        terminating = sorted(
            {t.get("key") for t in taints if t.get("key") in TERMINATION_TAINTS} - {None}
        )
        if terminating:
            ident["terminating"] = terminating[0]
    p = _as_dict(pod)
    if p:
        ident["pod_name"] = _get(p, "metadata", "name")
        ident["pod_uid"] = _get(p, "metadata", "uid")
        statuses = _get(p, "status", "containerStatuses") or []
        chosen = [s for s in statuses if container is None or s.get("name") == container]
        if chosen:
            ident["container_restarts"] = int(chosen[0].get("restartCount") or 0)
    return ident


def detect_reclamation(start: Mapping[str, Any], end: Mapping[str, Any]) -> str | None:
    """Why the node or engine pod under a run changed between `start` and `end`, or None.

    Only keys known at both observations are compared, so identities from backends that record
    fewer fields (the simulator) still compare. Reasons name the field and both values.
    """
    if end.get("node_gone"):
        return f"GPU node {start.get('name')!r} no longer exists at the end of the run (reclaimed)"
    if end.get("terminating") and not start.get("terminating"):
        return (
            f"GPU node {end.get('name')!r} is being reclaimed "
            f"(taint {end['terminating']} appeared during the run)"
        )
    changes = []
    for key in NODE_KEYS:
        a, b = start.get(key), end.get(key)
        if a is not None and b is not None and a != b:
            changes.append(f"{key} {a} -> {b}")
    if changes:
        return "GPU node replaced during the run: " + ", ".join(changes)
    for key in POD_KEYS:
        a, b = start.get(key), end.get(key)
        if a is not None and b is not None and a != b:
            return f"engine pod replaced during the run: {key} {a} -> {b}"
    a, b = start.get("container_restarts"), end.get("container_restarts")
    if a is not None and b is not None and b != a:
        return f"engine container restarted during the run: restartCount {a} -> {b}"
    return None


def observe(
    cluster: KubeCluster,
    deployment_id: str | None = None,
    *,
    pod: Mapping[str, Any] | None = None,
    container: str | None = None,
) -> dict[str, Any]:
    """Identity of the engine pod and its node now, read from the cluster.

    `deployment_id` None means the one servelab engine deployment of the namespace. With no
    engine pod at all the result has `pod_gone: true` and no node fields.
    """
    if deployment_id is None:
        deployment_id = cluster.current_deployment()
    if pod is None and deployment_id is not None:
        pod = cluster.engine_pod(deployment_id)
    if pod is None:
        ident = node_identity(None)
        ident.pop("node_gone", None)
        ident["pod_gone"] = True
        return ident
    node_name = (pod.get("spec") or {}).get("nodeName")
    node = cluster.read_node(node_name)
    if container is None:
        container = (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/name")
    ident = node_identity(node, pod, container=container)
    if node is None and not node_name:
        ident.pop("node_gone", None)  # not scheduled yet: nothing is gone
    return ident


def reclamation(node: Mapping[str, Any], when: str = "at the end of the run") -> str | None:
    """Why the run's node/pod changed, from the record's node.start / node.end (None if not)."""
    start, end = node.get("start"), node.get("end")
    if not isinstance(start, Mapping) or not isinstance(end, Mapping):
        return None
    if "error" in end:
        return f"node identity unreadable {when} ({end['error']})"
    if end.get("pod_gone"):
        return f"the engine pod was gone {when}"
    return detect_reclamation(start, end)


def node_change(start: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """The node watch's test during a run (servelab.dispatch.run.node_watch)."""
    return reclamation({"start": start, "end": now}, when="during the run")


# --------------------------------------------------------------------------- node slots


def label_slot(obj: Mapping[str, Any]) -> int | None:
    """The slot an object's `servelab.dev/node-slot` label names (None: no label, or not a
    slot number)."""
    value = (_get(obj, "metadata", "labels") or {}).get(SLOT_LABEL)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def eligible(node: Mapping[str, Any]) -> bool:
    """A node an engine can be pinned to: Ready, schedulable (not cordoned) and not being
    reclaimed (no termination taint). The GPU selector is the listing's."""
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in _get(node, "status", "conditions") or []
    )
    taints = {t.get("key") for t in _get(node, "spec", "taints") or []}
    return ready and not _get(node, "spec", "unschedulable") and not taints & {*TERMINATION_TAINTS}


@dataclass(frozen=True)
class SlotChoice:
    """Where a slot goes: `node` (to be labelled first when `label`, under the precondition of
    its `resource_version`), and the other nodes carrying the slot's label, to be unlabelled
    (name, resourceVersion), so that one node at a time holds a slot."""

    node: str
    label: bool
    resource_version: str | None
    stale: tuple[tuple[str, str | None], ...] = ()


def _name(node: Mapping[str, Any]) -> str:
    return str(_get(node, "metadata", "name"))


def _rv(node: Mapping[str, Any]) -> str | None:
    rv = _get(node, "metadata", "resourceVersion")
    return None if rv is None else str(rv)


def _taken(node: Mapping[str, Any], count: int) -> bool:
    """The node carries the label of a slot of a campaign of `count` slots."""
    k = label_slot(node)
    return k is not None and 0 <= k < count


def choose_node(nodes: Sequence[Mapping[str, Any]], slot: NodeSlot) -> SlotChoice | None:
    """The node slot `slot` measures on, among the GPU nodes `nodes`: the eligible one that
    carries its label; else the first eligible node by name that carries no slot's label (or the
    label of a slot beyond `slot.count`, left by a campaign with more nodes), to be labelled.
    A node with another slot's label is never taken. None: no node can hold the slot now (a
    reclaimed node not replaced yet, say)."""
    holders = sorted((n for n in nodes if label_slot(n) == slot.index), key=_name)
    kept = [n for n in holders if eligible(n)]
    if kept:
        chosen, label = kept[0], False
    else:
        free = [n for n in nodes if eligible(n) and not _taken(n, slot.count)]
        if not free:
            return None
        chosen, label = min(free, key=_name), True
    stale = tuple((_name(n), _rv(n)) for n in holders if _name(n) != _name(chosen))
    return SlotChoice(_name(chosen), label, _rv(chosen), stale)


def pin_node(cluster: KubeCluster, slot: NodeSlot, *, timeout_s: float | None = None) -> str:
    """The name of the node slot `slot` measures on, labelled `servelab.dev/node-slot=<index>`
    (`choose_node` among the nodes matching kubernetes.node_selector). Labelling is a merge
    patch under the node's resourceVersion, so two jobs racing for one free node cannot both
    take it: the loser looks again. Waits (bounded by `timeout_s`, default
    kubernetes.timeouts.ready_s) while no node can hold the slot: after a reclamation the
    replacement node comes up without servelab's label, and is labelled once it is Ready."""
    selector = dict(cluster.settings.node_selector)

    def attempt() -> str | None:
        choice = choose_node(cluster.list_nodes(selector), slot)
        if choice is None or not _take(cluster, choice, slot):
            return None  # nothing free yet, or another job labelled it first: look again
        for name, rv in choice.stale:
            if cluster.label_node(name, SLOT_LABEL, None, rv) is not None:
                log.warning("node slot %s: label removed from node %s (not Ready)", slot.name, name)
        return choice.node

    def waiting() -> str:
        seen = "; ".join(_state(n, slot.count) for n in cluster.list_nodes(selector))
        return (
            f"node slot {slot.name}: no node matching {selector} can hold it "
            f"(nodes: {seen or 'none'})"
        )

    return cluster.wait_for(attempt, timeout_s=timeout_s, describe=waiting)


def _take(cluster: KubeCluster, choice: SlotChoice, slot: NodeSlot) -> bool:
    """Label the chosen node for the slot when it is not yet; False when it changed since it was
    read (409: another job may have taken it)."""
    if not choice.label:
        return True
    value = str(slot.index)
    if cluster.label_node(choice.node, SLOT_LABEL, value, choice.resource_version) is None:
        return False
    log.info("node slot %s: labelled node %s %s=%s", slot.name, choice.node, SLOT_LABEL, value)
    return True


def _state(node: Mapping[str, Any], count: int) -> str:
    """A node as a slot sees it, for messages: `<name> held by slot k`, `<name> free`, and
    whether it is eligible."""
    held = f"held by slot {label_slot(node)}" if _taken(node, count) else "free"
    usable = "" if eligible(node) else ", not Ready, cordoned or being reclaimed"
    return f"{_name(node)} {held}{usable}"


def on_other_slot(deployment: Mapping[str, Any], slot: NodeSlot) -> bool:
    """True when an engine Deployment is pinned to another slot of this campaign's `slot.count`
    (it runs on another node: leave it). An unpinned one, or one pinned to a slot beyond the
    count, holds a GPU no slot accounts for: not on another slot. With one slot, never."""
    return (
        slot.count > 1 and _taken(deployment, slot.count) and label_slot(deployment) != slot.index
    )


def place(
    objects: Sequence[Mapping[str, Any]], slot: NodeSlot, claim_name: str
) -> list[dict[str, Any]]:
    """The rendered objects as slot `slot` applies them. One slot: unchanged. Several: the
    Deployment carries the slot's label and its pod template selects the slot's node by it
    (`nodeSelector`, beside the GPU selector); the weight claim `claim_name` becomes the slot's
    own, `<claim_name>-node<k>` (GKE's `standard-rwo` disks attach ReadWriteOnce: one node at a
    time), in the Deployment's volumes and as the PersistentVolumeClaim object."""
    if slot.count == 1:
        return [dict(o) for o in objects]
    value, claim = str(slot.index), f"{claim_name}-{slot.name}"
    out = []
    for obj in objects:
        placed = copy.deepcopy(dict(obj))
        meta = placed["metadata"]
        if placed["kind"] == "Deployment":
            meta["labels"] = {**(meta.get("labels") or {}), SLOT_LABEL: value}
            pod_spec = placed["spec"]["template"]["spec"]
            pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), SLOT_LABEL: value}
            for volume in pod_spec.get("volumes") or []:
                pvc = volume.get("persistentVolumeClaim") or {}
                if pvc.get("claimName") == claim_name:
                    pvc["claimName"] = claim
        elif placed["kind"] == "PersistentVolumeClaim" and meta["name"] == claim_name:
            meta["name"] = claim
            meta["labels"] = {**(meta.get("labels") or {}), SLOT_LABEL: value}
        out.append(placed)
    return out
