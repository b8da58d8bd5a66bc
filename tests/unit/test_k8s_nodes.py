"""N GPU nodes on the kubernetes backend (issue 27), against the fake API server with three nodes:
each node slot labels a node of its own and its deployments stay on it; blocks of three slots run
at once; a reclamation of one node discards and repeats only that node's block; with one slot
nothing is labelled and the objects go as rendered.

The campaign's own functions run here (servelab.campaign.deploy.deploy, .blocks.execute_block,
on the slot servelab.campaign.deploy.node_for gives each deployment with `campaign.gpu_nodes: 3`),
each slot's jobs in a thread of their own; only the backend's connection (to the fake), the
dispatcher and the Prometheus pull are replaced (node identity is read through the real client).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from fakekube import FakeCluster, PodScript, backend_for, engine_log, running

import servelab.campaign.blocks as blocks_mod
import servelab.campaign.deploy as deploy_mod
import servelab.deploy.measure as measure_mod
from servelab.artifacts import REQUESTS_SCHEMA, SCRAPE_SCHEMA, write_json, write_parquet
from servelab.artifacts.runrecord import build_run_record
from servelab.campaign.blocks import execute_block
from servelab.campaign.deploy import confirm, gate, node_for, render_manifests
from servelab.deploy.backend import NodeSlot
from servelab.deploy.kube_cluster import DeployTimeout
from servelab.deploy.manifests import DCGM_MONITOR_NAME, render_for
from servelab.deploy.node import SLOT_LABEL, choose_node, on_other_slot, place
from servelab.grid.config import conditions, deployment_for, deployment_record, offered_load
from servelab.grid.identity import deployment_identity, operational_settings, run_identity

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_FAKEkubeNODESsentinel0123456789abcdef"
# Three deployments whose scripted logs pass the gate: one per slot.
TRIO = (("defaults", "vllm"), ("defaults", "sglang"), ("matched", "sglang"))
CONDITION = "rate-0.12"
REPS = ("rep1", "rep2")


@pytest.fixture(scope="module")
def study() -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["backend"] = "kubernetes"
    config["campaign"]["pause_between_runs_s"] = 0
    config["campaign"]["faults"] = []
    return config


def _cluster(nodes: int = 3) -> FakeCluster:
    return FakeCluster(
        {
            "vllm": PodScript(engine_log("vllm-0.6.3-defaults"), terminate_s=5),
            "sglang": PodScript(engine_log("sglang-0.4.1-l4"), terminate_s=32),
        },
        secrets={("servelab", "hf-token"): {"token": TOKEN}},
        tick_s=5.0,
        nodes=nodes,
    )


def _spec(study: dict, arm: str, engine: str) -> dict:
    return deployment_record(study, deployment_for(study, arm, engine, CONDITION))


def _manifest(study: dict, spec: dict, tmp: Path) -> Path:
    path = tmp / "results" / "manifests" / f"{spec['deployment_id']}.yaml"
    render_manifests(
        deployment=spec,
        namespace="servelab",
        kubernetes=study["kubernetes"],
        manifest_path=str(path),
    )
    return path


def _slot_of(cluster: FakeCluster, name: str) -> str | None:
    return cluster.node_named(name)["metadata"]["labels"].get(SLOT_LABEL)


def _deployed(cluster: FakeCluster, deployment_id: str) -> dict:
    return cluster.objects[("deployments", "servelab", deployment_id)]


# --------------------------------------------------------------------------- choosing a node


def _node(name: str, slot: int | None = None, *, ready: bool = True, rv: str = "7") -> dict:
    labels = {} if slot is None else {SLOT_LABEL: str(slot)}
    return {
        "metadata": {"name": name, "labels": labels, "resourceVersion": rv},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}]},
    }


def test_a_slot_keeps_its_node_else_takes_the_first_free_one_never_another_slots() -> None:
    slot1 = NodeSlot(1, 3)
    # Its labelled node, Ready: kept, nothing to label.
    kept = choose_node([_node("a"), _node("b", 1), _node("c", 0)], slot1)
    assert (kept.node, kept.label, kept.stale) == ("b", False, ())
    # No label anywhere: the first by name that is free; 0's node is never taken.
    fresh = choose_node([_node("c"), _node("a", 0), _node("b")], slot1)
    assert (fresh.node, fresh.label, fresh.resource_version) == ("b", True, "7")
    # Its node is not Ready (being replaced): a free node is labelled, the old one unlabelled.
    moved = choose_node([_node("a", 1, ready=False), _node("b", 0), _node("c")], slot1)
    assert (moved.node, moved.label, moved.stale) == ("c", True, (("a", "7"),))
    # A label of a slot beyond the count (a campaign with more nodes left it) is free to take.
    assert choose_node([_node("a", 0), _node("b", 5)], slot1).node == "b"
    # Nothing free: wait.
    assert choose_node([_node("a", 0), _node("b", 2), _node("c", ready=False)], slot1) is None
    terminating = _node("d")
    terminating["spec"]["taints"].append({"key": "cloud.google.com/impending-node-termination"})
    assert choose_node([terminating], slot1) is None


def test_apply_time_pinning_leaves_the_rendered_manifest_alone(study: dict) -> None:
    d = deployment_for(study, "defaults", "vllm", CONDITION)
    rendered = render_for(study, d)
    three = copy.deepcopy(study)
    three["campaign"]["gpu_nodes"] = 3
    assert render_for(three, d) == rendered  # N is not in the manifest: nothing re-renders
    objects = [yaml.safe_load(text) for text in rendered.values()]
    assert place(objects, NodeSlot(), "servelab-models") == objects
    placed = {o["kind"]: o for o in place(objects, NodeSlot(2, 3), "servelab-models")}
    pod = placed["Deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-l4",
        SLOT_LABEL: "2",
    }
    assert placed["Deployment"]["metadata"]["labels"][SLOT_LABEL] == "2"
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert (
        claims == ["servelab-models-node2"] == [placed["PersistentVolumeClaim"]["metadata"]["name"]]
    )
    assert placed["Service"] == {o["kind"]: o for o in objects}["Service"]
    # An engine on another slot of this campaign is left running; one pinned to none is not.
    assert on_other_slot(placed["Deployment"], NodeSlot(0, 3))
    assert not on_other_slot(placed["Deployment"], NodeSlot(2, 3))
    assert not on_other_slot(placed["Deployment"], NodeSlot(0, 2))  # slot 2 of 2 does not exist
    assert not on_other_slot({o["kind"]: o for o in objects}["Deployment"], NodeSlot(0, 3))
    assert not on_other_slot(placed["Deployment"], NodeSlot())


# --------------------------------------------------------------------------- deployments


def test_three_slots_three_nodes_each_deployment_stays_on_its_node(
    study: dict, tmp_path: Path
) -> None:
    specs = [_spec(study, arm, engine) for arm, engine in TRIO]
    cluster = _cluster()
    with running(cluster) as kube:
        backends = [backend_for(kube, node=NodeSlot(k, 3)) for k in range(3)]
        nodes = []
        for backend, spec in zip(backends, specs, strict=True):
            deployed = backend.deploy(
                spec,
                manifest_path=_manifest(study, spec, tmp_path),
                startup_log_path=tmp_path / spec["deployment_id"] / "startup.log",
            )
            confirm(spec, deployed)
            assert deployed.facts["node_slot"]["node"] == deployed.facts["node"]["name"]
            nodes.append(deployed.facts["node"]["name"])
        # Three nodes, each labelled for its slot; no deployment retired another.
        assert sorted(nodes) == sorted(cluster.node_names)
        assert [_slot_of(cluster, n) for n in nodes] == ["0", "1", "2"]
        assert {k[2] for k in cluster.objects if k[0] == "deployments"} == {
            s["deployment_id"] for s in specs
        }
        # Each slot's own weight claim (ReadWriteOnce: one node at a time), no shared one.
        claims = {k[2] for k in cluster.objects if k[0] == "persistentvolumeclaims"}
        assert claims == {f"servelab-models-node{k}" for k in range(3)}
        first = [b.node_identity(s["deployment_id"]) for b, s in zip(backends, specs, strict=True)]

        # Runs confirm the engine again and again: it stays where it is.
        for _ in range(3):
            for backend, spec, ident in zip(backends, specs, first, strict=True):
                pod = backend.ensure_deployed(spec, gate=gate)
                assert backend.node_identity(spec["deployment_id"], pod=pod) == ident

        # A fourth deployment on slot 0 retires slot 0's engine only and lands on slot 0's node.
        fourth = _spec(study, "matched", "vllm")
        backends[0].deploy(
            fourth,
            manifest_path=_manifest(study, fourth, tmp_path),
            startup_log_path=tmp_path / "fourth.log",
        )
        assert backends[0].node_identity(fourth["deployment_id"])["name"] == nodes[0]
        assert ("deployments", "servelab", specs[0]["deployment_id"]) not in cluster.objects
        for backend, spec, ident in zip(backends[1:], specs[1:], first[1:], strict=True):
            assert backend.node_identity(spec["deployment_id"]) == ident  # the same pod too
        # The rendered manifests on disk are the renderer's: the slot was added when applying.
        text = _manifest(study, specs[0], tmp_path).read_text()
        assert SLOT_LABEL not in text and "servelab-models-node" not in text
        # Labelling went through a merge patch under the node's resourceVersion.
        patches = [p for m, p in cluster.requests if m == "PATCH"]
        assert sorted(patches) == sorted(f"/api/v1/nodes/{n}" for n in nodes)


def test_slots_racing_for_free_nodes_take_one_each(study: dict) -> None:
    cluster = _cluster()
    with running(cluster) as kube:
        backends = [backend_for(kube, node=NodeSlot(k, 3)) for k in range(3)]
        # A stale resourceVersion is refused: the node changed since it was read.
        name = cluster.node_names[0]
        assert backends[0].cluster.label_node(name, SLOT_LABEL, "0", "1") is None
        assert _slot_of(cluster, name) is None
        start = threading.Barrier(3, timeout=30)
        got: dict[int, str] = {}

        def pin(k: int) -> None:
            start.wait()
            got[k] = backends[k].pin()

        threads = [threading.Thread(target=pin, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(got.values()) == sorted(cluster.node_names)
        assert {k: _slot_of(cluster, n) for k, n in got.items()} == {0: "0", 1: "1", 2: "2"}


def test_a_reclaimed_node_is_replaced_by_a_fresh_one_labelled_on_the_next_run(
    study: dict, tmp_path: Path
) -> None:
    specs = [_spec(study, arm, engine) for arm, engine in TRIO]
    cluster = _cluster(nodes=4)  # one spare node
    with running(cluster) as kube:
        backends = [backend_for(kube, node=NodeSlot(k, 3)) for k in range(3)]
        for backend, spec in zip(backends, specs, strict=True):
            confirm(
                spec,
                backend.deploy(
                    spec,
                    manifest_path=_manifest(study, spec, tmp_path),
                    startup_log_path=tmp_path / f"{spec['deployment_id']}.log",
                ),
            )
        before = [b.node_identity(s["deployment_id"]) for b, s in zip(backends, specs, strict=True)]
        victim = before[1]["name"]
        spare = next(n for n in cluster.node_names if _slot_of(cluster, n) is None)
        replacement = cluster.reclaim_node(victim, keep_name=False)
        # The replacement carries the pool's labels, not servelab's; the recreated pod waits.
        assert _slot_of(cluster, replacement) is None
        pod = backends[1].ensure_deployed(specs[1], gate=gate)  # labels a free node, gates
        after = backends[1].node_identity(specs[1]["deployment_id"], pod=pod)
        assert after["name"] == min(spare, replacement) and after["uid"] != before[1]["uid"]
        assert _slot_of(cluster, after["name"]) == "1"
        assert [_slot_of(cluster, n) for n in cluster.node_names].count("1") == 1
        # The other slots' engines and nodes never moved.
        for k in (0, 2):
            assert backends[k].node_identity(specs[k]["deployment_id"]) == before[k]


def test_a_shared_object_another_job_changed_meanwhile_is_read_again(
    study: dict, tmp_path: Path
) -> None:
    """The DCGM exporter's PodMonitor is one object every deployment applies: two slots'
    deploy jobs at once may both replace it, and the one whose read went stale (409 Conflict)
    reads it again instead of failing its deploy."""
    cluster = _cluster()
    replace, conflicts = cluster.replace, []

    def replace_after_another_job(resource: str, ns: str, name: str, body: dict) -> dict:
        if name == DCGM_MONITOR_NAME and not conflicts:
            conflicts.append(cluster.rv())  # another job replaced it since this one read it
            cluster.objects[(resource, ns, name)]["metadata"]["resourceVersion"] = conflicts[0]
        return replace(resource, ns, name, body)

    cluster.replace = replace_after_another_job  # type: ignore[method-assign]
    with running(cluster) as kube:
        for k, (arm, engine) in enumerate(TRIO[:2]):
            spec = _spec(study, arm, engine)
            backend_for(kube, node=NodeSlot(k, 3)).deploy(
                spec,
                manifest_path=_manifest(study, spec, tmp_path),
                startup_log_path=tmp_path / f"{k}.log",
            )
    assert len(conflicts) == 1
    puts = [p for m, p in cluster.requests if m == "PUT" and p.endswith(DCGM_MONITOR_NAME)]
    assert len(puts) == 2  # refused once (409), then replaced


def test_no_free_node_is_a_bounded_wait_that_says_what_it_saw(study: dict, tmp_path: Path) -> None:
    cluster = _cluster(nodes=1)
    with running(cluster) as kube:
        backend_for(kube, node=NodeSlot(0, 2)).pin()
        with pytest.raises(
            DeployTimeout,
            match=r"node slot node1: no node .* \(nodes: gke-\S+-k3xz held by slot 0\)",
        ):
            backend_for(kube, node=NodeSlot(1, 2), ready_s=0.05).pin()


def test_a_restart_on_a_slot_comes_back_on_its_node(study: dict, tmp_path: Path) -> None:
    spec = _spec(study, "matched", "sglang")
    cluster = _cluster()
    with running(cluster) as kube:
        backend = backend_for(kube, node=NodeSlot(2, 3))
        manifest = _manifest(study, spec, tmp_path)
        confirm(
            spec, backend.deploy(spec, manifest_path=manifest, startup_log_path=tmp_path / "s.log")
        )
        record = backend.restart_timeline(
            spec["deployment_id"], manifest, tmp_path / "rep1" / "restart.json"
        )
    assert record["node_changed"] is None
    assert _slot_of(cluster, record["node_after"]["name"]) == "2"
    assert record["node_after"]["pod_uid"] != record["node_before"]["pod_uid"]


def test_one_slot_labels_nothing_and_applies_the_objects_as_rendered(
    study: dict, tmp_path: Path
) -> None:
    spec = _spec(study, "defaults", "vllm")
    cluster = _cluster()
    manifest = _manifest(study, spec, tmp_path)
    with running(cluster) as kube:
        backend = backend_for(kube)  # NodeSlot(): the one node of a one-node campaign
        confirm(
            spec, backend.deploy(spec, manifest_path=manifest, startup_log_path=tmp_path / "s.log")
        )
        backend.ensure_deployed(spec, gate=gate)
    # Nodes are read (identity), never listed or labelled.
    assert ("GET", "/api/v1/nodes") not in cluster.requests
    assert not [m for m, _ in cluster.requests if m == "PATCH"]
    assert ("GET", f"/api/v1/nodes/{cluster.node_names[0]}") in cluster.requests
    assert all(SLOT_LABEL not in n["metadata"]["labels"] for n in cluster.node_list)
    rendered = {o["kind"]: o for o in yaml.safe_load_all(manifest.read_text())}
    applied = _deployed(cluster, spec["deployment_id"])
    assert applied["spec"]["template"] == rendered["Deployment"]["spec"]["template"]
    assert applied["metadata"]["labels"] == rendered["Deployment"]["metadata"]["labels"]
    assert ("persistentvolumeclaims", "servelab", "servelab-models") in cluster.objects


def test_the_fake_attaches_a_readwriteonce_claim_to_one_node_at_a_time(study: dict) -> None:
    """Why each slot has a weight claim of its own: two engines on two nodes sharing the one
    ReadWriteOnce claim, as rendered, and the second never starts."""
    cluster = _cluster(nodes=2)
    objects = []
    for arm, engine in TRIO[:2]:
        d = deployment_for(study, arm, engine, CONDITION)
        objects.append({o["kind"]: o for o in map(yaml.safe_load, render_for(study, d).values())})
    with cluster.lock:
        cluster.create("persistentvolumeclaims", "servelab", objects[0]["PersistentVolumeClaim"])
        for k, objs in enumerate(objects):
            dep = copy.deepcopy(objs["Deployment"])
            selector = dep["spec"]["template"]["spec"]["nodeSelector"]
            selector["kubernetes.io/hostname"] = cluster.node_names[k]
            cluster.create("deployments", "servelab", dep)
        for _ in range(60):
            cluster.tick()
    states = sorted(cluster.pods.values(), key=lambda s: s.created)
    assert states[0].ready is not None and states[1].node == cluster.node_names[1]
    assert states[1].started is None
    events = [e for k, e in cluster.objects.items() if k[0] == "events"]
    assert [e["reason"] for e in events if e["involvedObject"]["name"] == states[1].name] == [
        "Scheduled",
        "FailedAttachVolume",
    ]


# --------------------------------------------------------------------------- parallel blocks


@dataclass
class _Scenario:
    """What the three-slot campaign did: per slot, its deployment, block record and the runs'
    dispatches (wall-clock windows and node identities)."""

    results: Path
    cluster: FakeCluster
    config: dict  # the study's, with campaign.gpu_nodes: 3
    specs: list[dict]
    blocks: dict[int, dict] = field(default_factory=dict)
    dispatches: dict[int, list[dict]] = field(default_factory=dict)
    victim: str = ""
    errors: list[BaseException] = field(default_factory=list)


def _fake_dispatch(scenario: _Scenario, barrier: threading.Barrier):
    """The dispatcher, replaced: node identity read at the start and end through the real client;
    each slot's first run waits for the others' (so all three are inside at once), and slot 1's
    node is reclaimed while all three are running."""

    def dispatch(**kw: Any) -> tuple[pa.Table, dict, None]:
        k = node_for(scenario.config, kw["deployment_id"]).index
        first = not scenario.dispatches.get(k)
        began = time.time()
        start = dict(kw["node_identity_fn"]())
        if first:
            barrier.wait()  # all three runs have started
            if k == 1:
                scenario.victim = start["name"]
                scenario.cluster.reclaim_node(start["name"])
            barrier.wait()  # ... and the reclamation happened during every one of them
        end = dict(kw["node_identity_fn"]())
        ended = time.time()
        scenario.dispatches.setdefault(k, []).append(
            {"rep": kw["rep"], "start": start, "end": end, "window": (began, ended)}
        )
        rows = [
            {
                "run_id": f"{kw['arm']}/{kw['engine']}/{kw['condition']}/{kw['rep']}",
                "request_id": f"r{i}",
                "graph_id": i,
                "role": "worker",
                "warmup": False,
                "scheduled_s": float(i),
                "sent_s": float(i),
                "written_s": float(i) + 0.5,
                "chunk_times_s": [float(i) + 0.1],
                "chunk_tokens": [8],
                "prompt_tokens": 16,
                "output_tokens": 8,
                "max_tokens": 8,
                "status": "ok",
                "error": None,
            }
            for i in range(4)
        ]
        table = pa.Table.from_pylist(rows, REQUESTS_SCHEMA)
        record = build_run_record(
            arm=kw["arm"],
            engine=kw["engine"],
            condition=kw["condition"],
            rep=kw["rep"],
            seed=1,
            trace_sha256="0" * 64,
            backend=kw["backend"],
            deployment_id=kw["deployment_id"],
            resolved_config=kw["resolved_config"],
            start_unix_s=began,
            end_unix_s=ended,
            offered_load_rps=kw["offered_load_rps"],
            requests=table,
            success_threshold=kw["success_threshold"],
            attempt=kw["attempt"],
            node={"start": start, "end": end},
            extra=kw["extra"],
        )
        return table, record, None

    return dispatch


def _slot_job(scenario: _Scenario, k: int) -> None:
    """Slot k's jobs, as the deploy and run rules call them: deploy its deployment, then run its
    block (two repetitions), each on the deployment's node slot."""
    study, spec, results = scenario.config, scenario.specs[k], scenario.results
    node = node_for(study, spec["deployment_id"])
    assert (node.index, node.count) == (k, 3)
    deployment_dir = results / "deployments" / spec["deployment_id"]
    manifest = _manifest(study, spec, results.parent)
    deploy_mod.deploy(
        identity=deployment_identity(study, spec),
        kubernetes=study["kubernetes"],
        manifest_path=str(manifest),
        startup_log_path=str(deployment_dir / "startup.log"),
        resolved_path=str(deployment_dir / "resolved.json"),
        node=node,
    )
    arm, engine = TRIO[k]
    run = {
        "arm": arm,
        "engine": engine,
        "condition": CONDITION,
        "offered_load_rps": offered_load(conditions(study)[CONDITION], study["workload"]),
    }
    traces, manifests = [], []
    for rep in REPS:
        folder = results / "traces" / CONDITION / rep
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "trace.jsonl").write_text(f"{CONDITION} {rep}\n")
        write_json(folder / "manifest.json", {"seed": 1})
        traces.append(str(folder / "trace.jsonl"))
        manifests.append(str(folder / "manifest.json"))
    scenario.blocks[k] = execute_block(
        identity={
            "deployment": deployment_identity(study, spec),
            "run": run_identity(study, run),
            "reps": list(REPS),
        },
        operational=operational_settings(study),
        faults=[],
        results_dir=str(results),
        traces=traces,
        manifests=manifests,
        resolved_path=str(deployment_dir / "resolved.json"),
        block_json_path=str(results / "runs" / arm / engine / CONDITION / "block.json"),
        node=node,
    )


@pytest.fixture(scope="module")
def three_slot_campaign(
    study: dict, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Scenario]:
    """Three slots' deploy and run jobs at once, as Snakemake runs them with three node slots."""
    results = tmp_path_factory.mktemp("three-nodes") / "results"
    cluster = _cluster()
    three = copy.deepcopy(study)
    three["campaign"]["gpu_nodes"] = 3
    specs = [_spec(three, arm, engine) for arm, engine in TRIO]
    scenario = _Scenario(results, cluster, three, specs)
    barrier = threading.Barrier(3, timeout=120)
    with running(cluster) as kube, pytest.MonkeyPatch.context() as mp:

        def get_backend(name: str, *, node: NodeSlot | None = None, **_kw: Any) -> Any:
            """The registry's kubernetes backend, connected to the fake, on the slot given."""
            assert name == "kubernetes" and node is not None and node.count == 3
            return backend_for(kube, node=node)

        mp.setattr(deploy_mod, "get_backend", get_backend)
        mp.setattr(blocks_mod, "get_backend", get_backend)
        mp.setattr(measure_mod, "dispatch_run", _fake_dispatch(scenario, barrier))
        mp.setattr(
            measure_mod,
            "pull_scrape_files",
            lambda **kw: write_parquet(
                kw["scrape_path"], pa.Table.from_pylist([], SCRAPE_SCHEMA), SCRAPE_SCHEMA
            ),
        )

        def job(k: int) -> None:
            try:
                _slot_job(scenario, k)
            except BaseException as exc:  # reported by the tests
                scenario.errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=job, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert not scenario.errors, scenario.errors
    yield scenario


def test_blocks_of_three_slots_run_in_parallel_each_on_its_node(
    three_slot_campaign: _Scenario,
) -> None:
    s = three_slot_campaign
    firsts = [s.dispatches[k][0]["window"] for k in range(3)]
    # Every slot's first run began before any of them ended: three runs at once.
    assert max(w[0] for w in firsts) < min(w[1] for w in firsts)
    for k in range(3):
        # (the end of slot 1's interrupted run saw its recreated pod, not scheduled yet)
        names = {d["start"]["name"] for d in s.dispatches[k]} | {
            d["end"]["name"] for d in s.dispatches[k] if d["end"].get("name")
        }
        assert len(names) == 1, names  # every run of the slot on one node (by name)
        assert _slot_of(s.cluster, names.pop()) == str(k)
        block = s.blocks[k]
        assert {r["status"] for r in block["reps"].values()} == {"ok"}
    nodes = {s.dispatches[k][0]["start"]["name"] for k in range(3)}
    assert len(nodes) == 3


def test_a_reclaimed_node_discards_and_repeats_only_its_own_block(
    three_slot_campaign: _Scenario,
) -> None:
    s = three_slot_campaign
    arm, engine = TRIO[1]
    discarded = s.results / "discarded"
    assert sorted(p.relative_to(discarded).as_posix() for p in discarded.glob("*/*/*")) == [
        f"{arm}/{engine}/{CONDITION}"
    ]
    [generation] = (discarded / arm / engine / CONDITION).iterdir()
    reason = json.loads((generation / "reason.json").read_text())
    assert reason["interrupted_run"] == f"{arm}/{engine}/{CONDITION}/rep1"
    assert reason["repeated_reps"] == list(REPS)
    assert s.blocks[1]["discarded"] == [generation.name]
    assert s.blocks[0]["discarded"] == [] == s.blocks[2]["discarded"]
    # The victim's runs: the interrupted one on the old node, both repeats on the replacement
    # (the same name, as a managed instance group recreates it: a new uid), labelled again.
    runs = s.dispatches[1]
    assert [d["rep"] for d in runs] == ["rep1", "rep1", "rep2"]
    assert runs[0]["start"]["name"] == s.victim and runs[0]["end"] != runs[0]["start"]
    fresh = {d["start"]["uid"] for d in runs[1:]}
    assert len(fresh) == 1 and runs[0]["start"]["uid"] not in fresh
    assert all(d["start"] == d["end"] for d in runs[1:])
    # The other slots ran through the reclamation untouched: one node, one pod, both reps once.
    for k in (0, 2):
        assert [d["rep"] for d in s.dispatches[k]] == list(REPS)
        identities = [d[t] for d in s.dispatches[k] for t in ("start", "end")]
        assert all(i == identities[0] for i in identities)
        arm_k, engine_k = TRIO[k]
        for rep in REPS:
            record = json.loads(
                (s.results / "runs" / arm_k / engine_k / CONDITION / rep / "run.json").read_text()
            )
            assert record["status"] == "ok" and "reclaimed_reason" not in record
