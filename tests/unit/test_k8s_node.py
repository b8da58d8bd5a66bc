"""Node identity and reclamation detection on API objects (no cluster)."""

from __future__ import annotations

import copy

import pytest
from kubernetes.client import V1Node, V1Pod

from servelab.deploy.node import IDENTITY_KEYS, detect_reclamation, node_identity


def _node(**over: object) -> dict:
    node = {
        "metadata": {
            "name": "gke-servelab-gpu-pool-6a1f0c2e-k3xz",
            "uid": "0f1e2d3c-0000-4000-8000-000000000001",
            "labels": {
                "cloud.google.com/gke-spot": "true",
                "cloud.google.com/gke-accelerator": "nvidia-l4",
                "node.kubernetes.io/instance-type": "g2-standard-8",
                "topology.kubernetes.io/zone": "us-central1-a",
            },
            "annotations": {"container.googleapis.com/instance_id": "4611686018427387904"},
        },
        "spec": {
            "providerID": "gce://servelab-study/us-central1-a/gke-servelab-gpu-pool-6a1f0c2e-k3xz",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "nodeInfo": {
                "bootID": "b00t-0001",
                "machineID": "m",
                "systemUUID": "s",
                "kernelVersion": "6.6",
                "osImage": "cos",
                "containerRuntimeVersion": "containerd://1.7",
                "kubeletVersion": "v1.35.0",
                "kubeProxyVersion": "v1.35.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
            }
        },
    }
    for path, value in over.items():
        cur = node
        *parents, leaf = path.split("__")
        for part in parents:
            cur = cur[part]
        cur[leaf] = value
    return node


def _pod(uid: str = "p-1", restarts: int = 0) -> dict:
    return {
        "metadata": {"name": "defaults-vllm-a5052817-abcde-xyz12", "uid": uid},
        "spec": {"containers": [{"name": "vllm", "image": "i"}]},
        "status": {
            "containerStatuses": [
                {
                    "name": "vllm",
                    "image": "i",
                    "imageID": "x",
                    "ready": True,
                    "restartCount": restarts,
                }
            ]
        },
    }


def test_identity_reads_every_field_from_the_api_objects() -> None:
    ident = node_identity(_node(), _pod(), container="vllm")
    assert set(IDENTITY_KEYS) <= set(ident)
    assert ident["name"] == "gke-servelab-gpu-pool-6a1f0c2e-k3xz"
    assert ident["uid"] == "0f1e2d3c-0000-4000-8000-000000000001"
    assert ident["provider_id"].startswith("gce://servelab-study/")
    assert ident["instance_id"] == "4611686018427387904"
    assert ident["boot_id"] == "b00t-0001"
    assert (ident["spot"], ident["spot_label"]) == (True, "cloud.google.com/gke-spot")
    assert (ident["instance_type"], ident["zone"], ident["accelerator"]) == (
        "g2-standard-8",
        "us-central1-a",
        "nvidia-l4",
    )
    assert (ident["pod_uid"], ident["container_restarts"]) == ("p-1", 0)
    assert "terminating" not in ident and "node_gone" not in ident


def test_identity_is_the_same_from_client_models_and_from_json() -> None:
    as_models = node_identity(V1Node.from_dict(_node()), V1Pod.from_dict(_pod()), container="vllm")
    assert as_models == node_identity(_node(), _pod(), container="vllm")


@pytest.mark.parametrize(
    ("labels", "spot", "label"),
    [
        ({"cloud.google.com/gke-spot": "true"}, True, "cloud.google.com/gke-spot"),
        ({"cloud.google.com/gke-preemptible": "true"}, True, "cloud.google.com/gke-preemptible"),
        ({"cloud.google.com/gke-spot": "false"}, False, None),
        ({}, False, None),
    ],
)
def test_spot_label(labels: dict, spot: bool, label: str | None) -> None:
    ident = node_identity(_node(metadata__labels=labels))
    assert (ident["spot"], ident["spot_label"]) == (spot, label)


def test_an_unchanged_node_and_pod_is_not_a_reclamation() -> None:
    start = node_identity(_node(), _pod(), container="vllm")
    end = node_identity(copy.deepcopy(_node()), _pod(), container="vllm")
    assert start == end
    assert detect_reclamation(start, end) is None


def test_recreated_instance_with_the_same_name_is_detected() -> None:
    """A GCE managed instance group recreates a preempted Spot VM under the same name: name and
    providerID stay, the node object's uid, the instance id and the boot id change."""
    start = node_identity(_node(), _pod())
    replaced = _node(
        metadata__uid="0f1e2d3c-0000-4000-8000-000000000099",
        metadata__annotations={"container.googleapis.com/instance_id": "4611686018427395823"},
        status__nodeInfo={**_node()["status"]["nodeInfo"], "bootID": "b00t-0002"},
    )
    end = node_identity(replaced, _pod(uid="p-2"))
    assert end["name"] == start["name"] and end["provider_id"] == start["provider_id"]
    reason = detect_reclamation(start, end)
    assert reason is not None and reason.startswith("GPU node replaced")
    assert (
        "uid 0f1e2d3c-0000-4000-8000-000000000001 -> 0f1e2d3c-0000-4000-8000-000000000099" in reason
    )
    assert "boot_id b00t-0001 -> b00t-0002" in reason and "name" not in reason.split(": ", 1)[1]


def test_rebooted_node_alone_is_detected() -> None:
    start = node_identity(_node())
    end = node_identity(
        _node(status__nodeInfo={**_node()["status"]["nodeInfo"], "bootID": "b00t-9"})
    )
    assert (
        detect_reclamation(start, end)
        == "GPU node replaced during the run: boot_id b00t-0001 -> b00t-9"
    )


def test_a_different_node_is_detected_by_name_and_provider_id() -> None:
    start = node_identity(_node())
    other = "gke-servelab-gpu-pool-6a1f0c2e-0042"
    end = node_identity(
        _node(metadata__name=other, spec__providerID=f"gce://servelab-study/us-central1-a/{other}")
    )
    reason = detect_reclamation(start, end)
    assert f"name gke-servelab-gpu-pool-6a1f0c2e-k3xz -> {other}" in reason
    assert "provider_id" in reason


def test_node_gone_and_impending_termination() -> None:
    start = node_identity(_node(), _pod())
    gone = node_identity(None, None)
    assert gone["node_gone"] is True
    assert "no longer exists" in detect_reclamation(start, gone)
    tainted = _node()
    tainted["spec"]["taints"].append(
        {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
    )
    end = node_identity(tainted, _pod())
    assert end["terminating"] == "cloud.google.com/impending-node-termination"
    assert "is being reclaimed" in detect_reclamation(start, end)


def test_engine_pod_replaced_or_restarted_on_the_same_node() -> None:
    start = node_identity(_node(), _pod(uid="p-1"), container="vllm")
    assert detect_reclamation(start, node_identity(_node(), _pod(uid="p-2"), container="vllm")) == (
        "engine pod replaced during the run: pod_uid p-1 -> p-2"
    )
    restarted = node_identity(_node(), _pod(uid="p-1", restarts=1), container="vllm")
    assert (
        detect_reclamation(start, restarted)
        == "engine container restarted during the run: restartCount 0 -> 1"
    )


def test_only_fields_known_at_both_ends_are_compared() -> None:
    """Backends that record less (the simulator) still compare: unknown is not a change."""
    assert detect_reclamation({"name": "sim-gpu-0"}, {"name": "sim-gpu-0", "uid": "u"}) is None
    assert detect_reclamation({"name": "sim-gpu-0", "uid": None}, {"name": "sim-gpu-1"}) == (
        "GPU node replaced during the run: name sim-gpu-0 -> sim-gpu-1"
    )
