"""The kubernetes backend driven through the real `kubernetes` client against the fake API server
(tests/fakekube): a normal deployment, a pod that never becomes ready, a log with the wrong
configuration, a node replaced mid-run, and teardown. The backend gates nothing itself: its start-up
logs go through the campaign's gate (servelab.campaign.deploy.confirm, .gate), as the campaign
sends them."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import yaml
from fakekube import FakeCluster, PodScript, backend_for, engine_log, running

from servelab.artifacts import file_sha256
from servelab.campaign.deploy import confirm, gate
from servelab.deploy import RunRequest, prompt_cache
from servelab.deploy.kube_cluster import DeployTimeout, KubernetesBackendError, PodFailed
from servelab.deploy.kubernetes import KubernetesBackend
from servelab.deploy.manifests import render_for, write_rendered
from servelab.deploy.node import detect_reclamation
from servelab.engines import ResolvedConfigMismatch
from servelab.engines.registry import engine_spec
from servelab.grid.config import deployment_for

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_FAKEkubeSENTINELtoken0123456789abcdef"


@pytest.fixture(scope="module")
def study() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def _spec(study: dict, arm: str, engine: str, condition: str) -> dict:
    """What the workflow passes as `deployment` (workflow/rules/common.smk deployment_params)."""
    d = deployment_for(study, arm, engine, condition)
    return {
        "deployment_id": d.id,
        "arm": arm,
        "engine": engine,
        "flags": list(d.flags),
        "image": study["engines"][engine]["image"],
        "port": study["engines"][engine]["port"],
        "expect_chunked_prefill": d.expect_chunked_prefill,
        "expect_chunk_size": d.expect_chunk_size,
    }


def _render(study: dict, tmp: Path, arm: str, engine: str, condition: str) -> tuple[dict, Path]:
    d = deployment_for(study, arm, engine, condition)
    out = tmp / "manifests" / "rendered" / d.id
    write_rendered(render_for(study, d), out)
    return _spec(study, arm, engine, condition), out


def _cluster(
    vllm_log: str = "vllm-0.6.3-defaults", sglang_log: str = "sglang-0.4.1-l4", **kw
) -> FakeCluster:
    scripts = kw.pop("scripts", None) or {
        "vllm": PodScript(engine_log(vllm_log), terminate_s=5),
        "sglang": PodScript(engine_log(sglang_log), terminate_s=32),
    }
    kw.setdefault("secrets", {("servelab", "hf-token"): {"token": TOKEN}})
    kw.setdefault("tick_s", 5.0)
    return FakeCluster(scripts, **kw)


def test_normal_deployment_writes_log_and_resolved_configuration(
    study: dict, tmp_path: Path
) -> None:
    spec, rendered = _render(study, tmp_path, "defaults", "vllm", "rate-0.12")
    cluster = _cluster()
    with running(cluster) as kube:
        backend = backend_for(kube)
        log_path = tmp_path / "results/deployments" / spec["deployment_id"] / "startup.log"
        deployed = backend.deploy(spec, manifest_path=rendered, startup_log_path=log_path)
        # The log is the engine's own output, unchanged (it holds no secret), and is returned.
        lines = engine_log("vllm-0.6.3-defaults").splitlines(True)
        served = "".join(line for line in lines if not line.startswith("# source:"))
        assert log_path.read_text() == served == deployed.startup_log
        resolved = confirm(spec, deployed)
        assert (resolved["engine"], resolved["version"], resolved["chunked_prefill"]) == (
            "vllm",
            "dev",
            False,
        )
        assert "chunked_prefill_enabled=False" in resolved["evidence"]["chunked_prefill"]
        facts = deployed.facts
        assert facts["namespace"] == "servelab"
        assert facts["node"]["name"] == cluster.node["metadata"]["name"]
        assert facts["node"]["spot"] is True and facts["node"]["pod_uid"] == facts["pod"]["uid"]
        # What reached the API server is what was rendered.
        dep = cluster.objects[("deployments", "servelab", spec["deployment_id"])]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert container["args"] == ["--host=0.0.0.0", "--port=8000", *spec["flags"]]
        assert {k[0] for k in cluster.objects if k[0] != "events"} == {
            "deployments",
            "services",
            "persistentvolumeclaims",
            "podmonitors",
            "pods",
        }
        # Deploying again is idempotent: objects replaced, the volume kept, the same pod stays.
        pod_before = backend.cluster.engine_pod(spec["deployment_id"])["metadata"]["uid"]
        assert backend.cluster.apply(rendered) == [
            "PersistentVolumeClaim/servelab-models kept",
            f"Service/{spec['deployment_id']} replaced",
            f"Deployment/{spec['deployment_id']} replaced",
            f"PodMonitor/{spec['deployment_id']} replaced",
            "PodMonitor/servelab-dcgm-exporter replaced",
        ]
        assert backend.cluster.engine_pod(spec["deployment_id"])["metadata"]["uid"] == pod_before
        # Deploying (not just applying) again starts a fresh engine whose whole log is gated.
        backend.deploy(spec, manifest_path=rendered, startup_log_path=log_path)
        fresh = backend.cluster.engine_pod(spec["deployment_id"])
        assert fresh["metadata"]["uid"] != pod_before
        assert cluster.pods[fresh["metadata"]["name"]].started is not None
        assert log_path.read_text() == served
        # We never read the token Secret.
        assert not [path for _, path in cluster.requests if "secret" in path]


def test_connects_through_a_generated_kubeconfig(study: dict, tmp_path: Path) -> None:
    spec, rendered = _render(study, tmp_path, "defaults", "sglang", "rate-0.12")
    with running(_cluster()) as kube:
        path = kube.write_kubeconfig(tmp_path / "kubeconfig")
        backend = KubernetesBackend.from_settings(
            {
                "kubeconfig": str(path),
                "context": "fake",
                "timeouts": {"poll_s": 0.001, "ready_s": 60},
            },
            sleep=lambda _s: None,
        )
        deployed = backend.deploy(spec, manifest_path=rendered, startup_log_path=tmp_path / "s.log")
        record = confirm(spec, deployed)
        assert (record["chunked_prefill"], record["chunk_size"]) == (True, 2048)
    with pytest.raises(KubernetesBackendError, match="cannot configure the Kubernetes client"):
        KubernetesBackend.from_settings({"kubeconfig": str(tmp_path / "absent"), "context": "nope"})


def test_only_one_engine_on_the_gpu(study: dict, tmp_path: Path) -> None:
    first, first_dir = _render(study, tmp_path, "defaults", "vllm", "rate-0.12")
    second, second_dir = _render(study, tmp_path, "defaults", "sglang", "rate-0.12")
    cluster = _cluster()
    with running(cluster) as kube:
        backend = backend_for(kube)
        backend.deploy(first, manifest_path=first_dir, startup_log_path=tmp_path / "1.log")
        backend.deploy(second, manifest_path=second_dir, startup_log_path=tmp_path / "2.log")
        names = {k[2] for k in cluster.objects if k[0] == "deployments"}
        assert names == {second["deployment_id"]}
        assert ("services", "servelab", first["deployment_id"]) not in cluster.objects
        assert ("persistentvolumeclaims", "servelab", "servelab-models") in cluster.objects
        assert all(
            p.deployment == second["deployment_id"] for p in cluster.pods.values() if p.gone is None
        )


def test_pod_that_never_becomes_ready_times_out(study: dict, tmp_path: Path) -> None:
    spec, rendered = _render(study, tmp_path, "defaults", "vllm", "rate-0.12")
    scripts = {"vllm": PodScript(engine_log("vllm-0.6.3-defaults"), ready_s=None)}
    cluster = _cluster(scripts=scripts)
    with running(cluster) as kube:
        backend = backend_for(kube, ready_s=0.5)
        started = time.monotonic()
        with pytest.raises(DeployTimeout) as info:
            backend.deploy(spec, manifest_path=rendered, startup_log_path=tmp_path / "s.log")
        assert time.monotonic() - started < 10
    message = str(info.value)
    assert f"deployment {spec['deployment_id']}: no Ready engine pod after 0 s" in message
    assert "phase Running" in message and "containers with unready status: [vllm]" in message
    assert "recent events:" in message and "Started: Started container vllm" in message
    polls = sum(1 for m, p in cluster.requests if m == "GET" and p.endswith("/pods"))
    assert 1 < polls <= 502  # bounded: ceil(0.5 / 0.001) + 1
    assert not (tmp_path / "s.log").exists()


def test_missing_secret_fails_fast(study: dict, tmp_path: Path) -> None:
    spec, rendered = _render(study, tmp_path, "defaults", "vllm", "rate-0.12")
    missing = pytest.raises(
        PodFailed, match='CreateContainerConfigError secret "hf-token" not found'
    )
    with running(_cluster(secrets={})) as kube, missing:
        backend_for(kube).deploy(spec, manifest_path=rendered, startup_log_path=tmp_path / "s.log")


@pytest.mark.parametrize(
    ("arm", "engine", "condition", "logs", "quoted"),
    [
        # The matched arm asks vLLM for chunked prefill; the log shows it off.
        (
            "matched",
            "vllm",
            "rate-0.28",
            {"vllm_log": "vllm-0.6.3-defaults"},
            "chunked_prefill_enabled=False",
        ),
        # SGLang on a >= 25 GB GPU resolves 8192, not the 2048 the study expects.
        (
            "defaults",
            "sglang",
            "rate-0.12",
            {"sglang_log": "sglang-0.4.1-chunk8192"},
            "chunked_prefill_size=8192",
        ),
    ],
)
def test_gate_refuses_a_log_with_the_wrong_configuration(
    study: dict, tmp_path: Path, arm: str, engine: str, condition: str, logs: dict, quoted: str
) -> None:
    spec, rendered = _render(study, tmp_path, arm, engine, condition)
    cluster = _cluster(**logs)
    log_path = tmp_path / "startup.log"
    with running(cluster) as kube, pytest.raises(ResolvedConfigMismatch) as info:
        deployed = backend_for(kube).deploy(spec, manifest_path=rendered, startup_log_path=log_path)
        confirm(spec, deployed)
    assert quoted in str(info.value) and "start-up log line" in str(info.value)
    assert log_path.is_file() and quoted in log_path.read_text()  # the evidence is kept
    assert (tmp_path / "startup.refused.log").read_text() == log_path.read_text()
    # Nothing deleted silently: the refused deployment is still there for inspection.
    assert ("deployments", "servelab", spec["deployment_id"]) in cluster.objects
    assert not [m for m, _ in cluster.requests if m == "DELETE"]


@pytest.mark.parametrize("keep_name", [True, False])
def test_node_replaced_mid_run_is_detected(study: dict, tmp_path: Path, keep_name: bool) -> None:
    spec, rendered = _render(study, tmp_path, "matched", "sglang", "rate-0.12")
    cluster = _cluster()
    with running(cluster) as kube:
        backend = backend_for(kube)
        backend.deploy(spec, manifest_path=rendered, startup_log_path=tmp_path / "s.log")
        start = backend.node_identity(spec["deployment_id"])
        assert detect_reclamation(start, backend.node_identity(spec["deployment_id"])) is None
        cluster.reclaim_node(keep_name=keep_name)
        # The Deployment brings the engine back on the replacement node; it is gated again.
        pod = backend.ensure_deployed(spec, gate=gate)
        end = backend.node_identity(spec["deployment_id"], pod=pod)
    reason = detect_reclamation(start, end)
    assert reason is not None and reason.startswith("GPU node replaced during the run")
    assert f"uid {start['uid']} -> {end['uid']}" in reason and "instance_id" in reason
    assert ("name " in reason) == (not keep_name) and ("provider_id" in reason) == (not keep_name)
    assert end["pod_uid"] != start["pod_uid"]


def test_impending_termination_is_detected(study: dict, tmp_path: Path) -> None:
    spec, rendered = _render(study, tmp_path, "defaults", "vllm", "rate-0.12")
    cluster = _cluster()
    with running(cluster) as kube:
        backend = backend_for(kube)
        backend.deploy(spec, manifest_path=rendered, startup_log_path=tmp_path / "s.log")
        start = backend.node_identity(spec["deployment_id"])
        cluster.taint_terminating()
        end = backend.node_identity(spec["deployment_id"])
    assert "is being reclaimed" in detect_reclamation(start, end)


def test_ensure_deployed_brings_back_a_retired_deployment(study: dict, tmp_path: Path) -> None:
    vllm, vllm_dir = _render(study, tmp_path, "defaults", "vllm", "rate-0.12")
    sglang, sglang_dir = _render(study, tmp_path, "defaults", "sglang", "rate-0.12")
    cluster = _cluster()
    with running(cluster) as kube:
        backend = backend_for(kube)
        backend.deploy(vllm, manifest_path=vllm_dir, startup_log_path=tmp_path / "1.log")
        backend.deploy(sglang, manifest_path=sglang_dir, startup_log_path=tmp_path / "2.log")
        pod = backend.ensure_deployed(vllm, gate=gate)  # rendered again from the spec alone
        assert pod["metadata"]["labels"]["servelab.dev/deployment"] == vllm["deployment_id"]
        assert {k[2] for k in cluster.objects if k[0] == "deployments"} == {vllm["deployment_id"]}


def test_teardown_keeps_only_the_shared_objects(study: dict, tmp_path: Path) -> None:
    """Teardown removes the deployment's own objects; the weight volume and the DCGM exporter's
    PodMonitor, which every deployment shares, stay."""
    spec, rendered = _render(study, tmp_path, "defaults", "vllm", "rate-0.12")
    cluster = _cluster()
    with running(cluster) as kube:
        backend = backend_for(kube)
        backend.deploy(spec, manifest_path=rendered, startup_log_path=tmp_path / "s.log")
        deleted = backend.teardown(spec["deployment_id"])
        assert deleted == [
            f"{k}/{spec['deployment_id']}" for k in ("PodMonitor", "Service", "Deployment")
        ]
        left = {(k[0], k[2]) for k in cluster.objects if k[0] != "events"}
        assert left == {
            ("persistentvolumeclaims", "servelab-models"),
            ("podmonitors", "servelab-dcgm-exporter"),
        }
        assert backend.teardown(spec["deployment_id"]) == []  # nothing left: not an error
        assert backend.node_identity(spec["deployment_id"])["pod_gone"] is True


def test_cluster_without_the_podmonitor_crd_or_the_namespace(study: dict, tmp_path: Path) -> None:
    spec, rendered = _render(study, tmp_path, "defaults", "vllm", "rate-0.12")
    with running(_cluster(crds=False)) as kube:
        lines = backend_for(kube).cluster.apply(rendered)
        assert lines[-2:] == [
            f"PodMonitor/{spec['deployment_id']} skipped (no PodMonitor CRD)",
            "PodMonitor/servelab-dcgm-exporter skipped (no PodMonitor CRD)",
        ]
    no_namespace = pytest.raises(
        KubernetesBackendError, match="namespace 'servelab' not found; create it"
    )
    with running(_cluster(namespaces=("default",))) as kube, no_namespace:
        backend_for(kube).cluster.apply(rendered)


def _fake_measurement(
    monkeypatch: pytest.MonkeyPatch, cluster: FakeCluster, seen: dict, *, reclaim: bool = False
) -> None:
    """Replace the dispatcher and the Prometheus pull where the live measurement step calls them
    (servelab.deploy.measure) with recorders: `seen` gets their arguments and the identities."""
    import pyarrow as pa

    import servelab.deploy.measure as measure_mod
    from servelab.artifacts import REQUESTS_SCHEMA, SCRAPE_SCHEMA, write_parquet
    from servelab.artifacts.runrecord import build_run_record

    def fake_dispatch(**kw):
        seen["dispatch"] = kw
        start = dict(kw["node_identity_fn"]())
        if reclaim:
            cluster.reclaim_node()
        end = dict(kw["node_identity_fn"]())
        seen["identities"] = (start, end)
        seen.setdefault("pods", []).append(start["pod_uid"])
        table = pa.Table.from_pylist([], REQUESTS_SCHEMA)
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
            start_unix_s=100.0,
            end_unix_s=160.0,
            offered_load_rps=kw["offered_load_rps"],
            requests=table,
            success_threshold=0.95,
            attempt=kw["attempt"],
            node={"start": start, "end": end},
            extra=kw["extra"],
        )
        return table, record, None

    def fake_pull(**kw):
        seen["pull"] = kw
        write_parquet(kw["scrape_path"], pa.Table.from_pylist([], SCRAPE_SCHEMA), SCRAPE_SCHEMA)

    monkeypatch.setattr(measure_mod, "dispatch_run", fake_dispatch)
    monkeypatch.setattr(measure_mod, "pull_scrape_files", fake_pull)


def _run_request(
    study: dict, tmp_path: Path, spec: dict, *, trace: Path, attempt: int = 1
) -> RunRequest:
    from servelab.grid.settings import DispatchSettings, TelemetrySettings

    run_dir = tmp_path / "results/runs/defaults/vllm/rate-0.12/rep1"
    return RunRequest(
        arm="defaults",
        engine="vllm",
        condition="rate-0.12",
        rep="rep1",
        deployment=spec,
        resolved_config={"chunked_prefill": False, "chunk_size": None},
        trace_path=str(trace),
        manifest_path="m",
        offered_load_rps=0.72,
        dispatch=DispatchSettings.from_section(study["dispatch"]),
        telemetry=TelemetrySettings.from_section(study["telemetry"]),
        success_threshold=0.95,
        attempt=attempt,
        requests_path=str(run_dir / "requests.parquet"),
        scrape_path=str(run_dir / "scrape.parquet"),
        run_json_path=str(run_dir / "run.json"),
        deployment_dir=str(tmp_path / "results/deployments" / spec["deployment_id"]),
        faults=[{"run": "defaults/vllm/rate-0.12/rep1", "kind": "fail"}],
        gate=gate,
    )


@pytest.mark.parametrize("reclaim", [False, True])
def test_run_glues_dispatch_node_identity_and_telemetry(
    study: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reclaim: bool
) -> None:
    """run() with the dispatcher and the Prometheus pull replaced by recorders: the engine is
    confirmed, node identity is read at start and end, a change marks the run interrupted."""
    spec = _spec(study, "defaults", "vllm", "rate-0.12")  # run() renders it itself
    cluster = _cluster()
    seen: dict = {}
    _fake_measurement(monkeypatch, cluster, seen, reclaim=reclaim)
    trace = tmp_path / "trace.parquet"
    trace.write_bytes(b"a trace")
    request = _run_request(study, tmp_path, spec, trace=trace)
    run_dir = Path(request.run_json_path).parent
    with running(cluster) as kube:
        backend = backend_for(kube)
        record = backend.run(request)  # not deployed yet: ensure_deployed brings it up and gates it
    assert (
        seen["dispatch"]["base_url"]
        == f"http://{spec['deployment_id']}.servelab.svc.cluster.local:8000"
    )
    assert seen["dispatch"]["extra"]["kubernetes"]["pod"].startswith(spec["deployment_id"])
    assert seen["pull"]["selector"] == {
        "namespace": "servelab",
        "servelab_dev_deployment": spec["deployment_id"],
    }
    assert seen["pull"]["prometheus_url"] == study["telemetry"]["prometheus_url"]
    # the engine GPU's DCGM series: selected by the node the engine pod was on at the start
    node = seen["identities"][0]["name"]
    assert node and seen["pull"]["gpu_selector"] == {"node": node}
    assert record["kubernetes"]["gpu_metrics_selector"] == {"node": node}
    assert json.loads((run_dir / "run.json").read_text()) == record
    assert (run_dir / "requests.parquet").is_file() and (run_dir / "scrape.parquet").is_file()
    # the node watch during the run: every kubernetes.node_watch_s, the same test as at the end
    assert seen["dispatch"]["node_watch_s"] == study["kubernetes"]["node_watch_s"] == 15
    watch_reason = seen["dispatch"]["node_change"](*seen["identities"])
    if reclaim:
        assert record["status"] == "interrupted"
        assert record["reclaimed_reason"].startswith("engine pod replaced during the run")
        assert watch_reason == record["reclaimed_reason"]
    else:
        assert "reclaimed_reason" not in record and record["node"]["start"] == record["node"]["end"]
        assert watch_reason is None
    gone = seen["dispatch"]["node_change"](seen["identities"][0], {"pod_gone": True})
    assert gone == "the engine pod was gone during the run"


def _two_traces(tmp_path: Path) -> tuple[Path, Path]:
    """Two repetitions' trace files, which differ (the backend tells traces by their SHA-256)."""
    first, second = tmp_path / "rep1.parquet", tmp_path / "rep2.parquet"
    first.write_bytes(b"the first repetition's trace")
    second.write_bytes(b"the second repetition's trace")
    return first, second


def test_a_pod_that_served_the_trace_is_restarted_before_the_run(
    study: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry sends the same prompts again: a pod that was sent the run's trace is deleted
    first, and the run goes to its gated replacement (a cold prefix cache, as on the local
    backend). A pod replaced since (a reclamation) starts with no trace served."""
    spec = _spec(study, "defaults", "vllm", "rate-0.12")
    cluster = _cluster()
    seen: dict = {}
    _fake_measurement(monkeypatch, cluster, seen)
    first, second = _two_traces(tmp_path)
    deployment_id = spec["deployment_id"]
    with running(cluster) as kube:
        backend = backend_for(kube)
        backend.run(_run_request(study, tmp_path, spec, trace=first))
        backend.run(_run_request(study, tmp_path, spec, trace=second))  # another trace: same pod
        assert seen["pods"][0] == seen["pods"][1]
        backend.run(_run_request(study, tmp_path, spec, trace=first, attempt=2))  # a retry
        pod = backend.cluster.engine_pod(deployment_id)["metadata"]["uid"]
        assert seen["pods"][2] == pod != seen["pods"][1]
        assert backend.cluster.gated_pod(deployment_id) == pod  # the new pod passed the gate
        assert backend.cluster.served_traces(deployment_id, pod) == [file_sha256(first)]
        assert backend.cluster.served_traces(deployment_id, seen["pods"][1]) == []
        cluster.reclaim_node()  # the Deployment recreates the pod elsewhere: its cache is empty
        backend.run(_run_request(study, tmp_path, spec, trace=second, attempt=2))
        assert seen["pods"][3] != pod
        assert len(set(seen["pods"])) == 3  # the reclamation was the only restart


def test_an_engine_whose_requests_cost_more_with_history_gets_a_fresh_pod_for_every_trace(
    study: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine with a history cost (llama-server's host prompt cache, EngineSpec.history_cost)
    is measured on a pod that has served nothing: the pod is replaced before every trace after
    its first, not only before a retry."""
    spec = _spec(study, "defaults", "vllm", "rate-0.12")
    costly = dataclasses.replace(engine_spec("vllm"), history_cost="a test's history cost")
    monkeypatch.setattr(
        prompt_cache, "engine_spec", lambda name: costly if name == "vllm" else engine_spec(name)
    )
    cluster = _cluster()
    seen: dict = {}
    _fake_measurement(monkeypatch, cluster, seen)
    first, second = _two_traces(tmp_path)
    with running(cluster) as kube:
        backend = backend_for(kube)
        backend.run(_run_request(study, tmp_path, spec, trace=first))
        backend.run(_run_request(study, tmp_path, spec, trace=second))
        pod = backend.cluster.engine_pod(spec["deployment_id"])["metadata"]["uid"]
        assert seen["pods"][1] == pod != seen["pods"][0]  # another trace: a fresh pod
        assert backend.cluster.gated_pod(spec["deployment_id"]) == pod
        assert backend.cluster.served_traces(spec["deployment_id"], pod) == [file_sha256(second)]


def test_a_gated_pod_is_not_read_again_but_a_new_pod_is(study: dict, tmp_path: Path) -> None:
    """Runs re-check the engine: the start-up log of the pod that passed the gate is not read
    again (kubelet rotates logs), a pod recreated after a reclamation is."""
    spec, rendered = _render(study, tmp_path, "matched", "vllm", "rate-0.28")
    cluster = _cluster(vllm_log="vllm-0.6.3-matched")

    def log_reads() -> int:
        return sum(1 for _, path in cluster.requests if path.endswith("/log"))

    with running(cluster) as kube:
        backend = backend_for(kube)
        confirm(
            spec, backend.deploy(spec, manifest_path=rendered, startup_log_path=tmp_path / "s.log")
        )
        gated = backend.cluster.engine_pod(spec["deployment_id"])["metadata"]["uid"]
        dep = cluster.objects[("deployments", "servelab", spec["deployment_id"])]
        assert dep["metadata"]["annotations"]["servelab.dev/gated-pod-uid"] == gated
        assert dep["metadata"]["generation"] == 1  # an annotation is not a rollout
        reads = log_reads()
        backend.ensure_deployed(spec, gate=gate)
        assert log_reads() == reads
        cluster.reclaim_node()
        pod = backend.ensure_deployed(spec, gate=gate)
        assert pod["metadata"]["uid"] != gated and log_reads() == reads + 1
        # The new pod is gated too (the next test shows a refusal).
        annotations = cluster.objects[("deployments", "servelab", spec["deployment_id"])][
            "metadata"
        ]["annotations"]
        assert annotations["servelab.dev/gated-pod-uid"] == pod["metadata"]["uid"]
        # Without a deployment id: the namespace's one engine deployment.
        assert backend.node_identity()["pod_uid"] == pod["metadata"]["uid"]


def test_a_recreated_pod_with_another_configuration_is_refused(study: dict, tmp_path: Path) -> None:
    spec, rendered = _render(study, tmp_path, "matched", "vllm", "rate-0.28")
    cluster = _cluster(vllm_log="vllm-0.6.3-matched")
    with running(cluster) as kube:
        backend = backend_for(kube)
        confirm(
            spec, backend.deploy(spec, manifest_path=rendered, startup_log_path=tmp_path / "s.log")
        )
        cluster.scripts["vllm"].log = engine_log("vllm-0.6.3-defaults")
        cluster.reclaim_node()
        with pytest.raises(ResolvedConfigMismatch, match="chunked_prefill_enabled=False"):
            backend.ensure_deployed(spec, gate=gate)


def test_a_recreated_pod_is_confirmed_by_the_gate_it_is_given(study: dict, tmp_path: Path) -> None:
    """The backend gates nothing of its own: a pod recreated after a reclamation is handed, with
    its start-up log, to the gate the campaign passes in; a gate that refuses fails the run's
    confirmation, and the refused pod is not recorded as gated. With no gate, it is not run."""
    spec, rendered = _render(study, tmp_path, "matched", "vllm", "rate-0.28")
    cluster = _cluster(vllm_log="vllm-0.6.3-matched")
    seen: list[tuple[dict, str]] = []

    class Refused(Exception):
        pass

    def refusing(deployment, startup_log):
        seen.append((dict(deployment), startup_log))
        raise Refused("no")

    with running(cluster) as kube:
        backend = backend_for(kube)
        confirm(
            spec, backend.deploy(spec, manifest_path=rendered, startup_log_path=tmp_path / "s.log")
        )
        backend.ensure_deployed(spec, gate=refusing)  # the gated pod: the gate is not asked
        assert seen == []
        cluster.reclaim_node()
        with pytest.raises(KubernetesBackendError, match="no gate was given"):
            backend.ensure_deployed(spec, gate=None)
        with pytest.raises(Refused):
            backend.ensure_deployed(spec, gate=refusing)
        pod = backend.cluster.engine_pod(spec["deployment_id"])
        assert backend.cluster.gated_pod(spec["deployment_id"]) != pod["metadata"]["uid"]
    [(deployment, startup_log)] = seen
    assert deployment == spec
    assert "chunked_prefill_enabled=True" in startup_log  # the recreated pod's own log


def test_servelab_deploy_imports_no_gate() -> None:
    """Only the campaign gates: no module of servelab.deploy imports the gate or the parser's
    gate-side functions (an ast scan of every import, wherever it stands)."""
    import ast

    import servelab.deploy

    gate_names = {"check_resolved", "servelab.engines.gate", "servelab.campaign"}
    offenders = []
    for path in sorted(Path(servelab.deploy.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = {f"{node.module}.{a.name}" for a in node.names} | {node.module or ""}
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            if any(n in gate_names or n.startswith("servelab.campaign") for n in names):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
