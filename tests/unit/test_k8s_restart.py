"""The restart experiment on the fake cluster (Fig. 14), and the no-secret-anywhere check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fakekube import FakeCluster, PodScript, backend_for, engine_log, running

from servelab.analysis.restarts import read_restart_record
from servelab.artifacts import ArtifactError, restart_events_out_of_order, write_json
from servelab.campaign.deploy import confirm
from servelab.deploy.kube_cluster import KubernetesBackendError, redact
from servelab.deploy.manifests import render_for, write_rendered
from servelab.deploy.restart import RESTART_EVENTS, event_time, phases, timeline_from_events
from servelab.grid.config import deployment_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def _deploy(study: dict, tmp: Path, backend, engine: str) -> tuple[str, Path]:
    d = deployment_for(study, "matched", engine, "rate-0.12")
    rendered = tmp / "manifests" / "rendered" / d.id
    write_rendered(render_for(study, d), rendered)
    spec = {
        "deployment_id": d.id,
        "engine": engine,
        "expect_chunked_prefill": d.expect_chunked_prefill,
        "expect_chunk_size": d.expect_chunk_size,
    }
    deployed = backend.deploy(
        spec,
        manifest_path=rendered,
        startup_log_path=tmp / "results" / "deployments" / d.id / "startup.log",
    )
    confirm(spec, deployed)
    return d.id, rendered


TICK = 2.0  # fake seconds per poll; the scripted durations below are multiples of it

# The study's Fig. 14 shape: SGLang took 32 s to terminate, vLLM 5-6 s; pulls 1-9 s; the probe
# made initialisation 120 s.
SCRIPTS = {
    "vllm": dict(
        log="vllm-0.6.3-matched",
        terminate_s=6,
        pull_s=4.0,
        start_s=1.0,
        ready_s=120.0,
        schedule_s=1.0,
    ),
    "sglang": dict(
        log="sglang-0.4.1-l4",
        terminate_s=32,
        pull_s=None,
        start_s=2.0,
        ready_s=120.0,
        schedule_s=1.0,
    ),
}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_restart_timeline_records_the_scripted_phases(
    study: dict, tmp_path: Path, engine: str
) -> None:
    script = dict(SCRIPTS[engine])
    log = engine_log(script.pop("log"))
    cluster = FakeCluster(
        {engine: PodScript(log, **script)},
        secrets={("servelab", "hf-token"): {"token": "x" * 12}},
        tick_s=TICK,
    )
    with running(cluster) as kube:
        backend = backend_for(kube)
        did, rendered = _deploy(study, tmp_path, backend, engine)
        old_uid = backend.cluster.engine_pod(did)["metadata"]["uid"]
        out = tmp_path / "results" / "restarts" / engine / "rep2" / "restart.json"
        record = backend.restart_timeline(did, rendered, out)
        new_uid = backend.cluster.engine_pod(did)["metadata"]["uid"]
    assert json.loads(out.read_text()) == record
    assert (record["engine"], record["rep"], record["deployment_id"]) == (engine, "rep2", did)
    assert list(record["events"]) == list(RESTART_EVENTS)
    times = [record["events"][k] for k in RESTART_EVENTS]
    assert times == sorted(times)
    got = record["phases_s"]
    assert got["terminate"] == script["terminate_s"]
    assert got["image_pull"] == (script["pull_s"] or 0.0)
    assert got["initialise"] == script["ready_s"]
    # Scheduling waits for the re-apply (one poll after the old pod is gone) and schedule_s.
    assert got["schedule"] == pytest.approx(TICK + script["schedule_s"])
    assert got["unmeasured"] == pytest.approx(script["start_s"])  # pulled -> container started
    assert got["total"] == pytest.approx(sum(v for k, v in got.items() if k != "total"))
    assert record["old_pod"]["uid"] == old_uid != record["new_pod"]["uid"] == new_uid
    assert record["node_changed"] is None
    assert record["sources"]["scheduled"] == "Scheduled event"
    if script["pull_s"] is None:
        assert "already present on machine" in record["image_pull_message"]
        assert record["events"]["pull_started"] == record["events"]["pulled"]
    # The analysis reads the same file and computes the same phases.
    parsed = read_restart_record(out)
    assert (parsed.engine, parsed.rep) == (engine, "rep2")
    for name, value in parsed.phases.items():
        assert value == pytest.approx(got[name])
    assert parsed.total_s == pytest.approx(got["total"])


def test_restart_needs_a_ready_deployment(study: dict, tmp_path: Path) -> None:
    d = deployment_for(study, "matched", "vllm", "rate-0.12")
    rendered = tmp_path / d.id
    write_rendered(render_for(study, d), rendered)
    with running(FakeCluster({"vllm": PodScript("")})) as kube:
        with pytest.raises(KubernetesBackendError, match="no Ready engine pod to restart"):
            backend_for(kube).restart_timeline(
                d.id, rendered, tmp_path / "restarts/vllm/rep1/restart.json"
            )
        with pytest.raises(ValueError, match="cannot tell the repetition"):
            backend_for(kube).restart_timeline(d.id, rendered, tmp_path / "restart.json")


def test_event_times_follow_the_api_reference() -> None:
    scheduler = {
        "reason": "Scheduled",
        "eventTime": "2026-01-05T09:00:03.250000Z",
        "firstTimestamp": None,
    }
    kubelet = {
        "reason": "Pulled",
        "firstTimestamp": "2026-01-05T09:00:07Z",
        "lastTimestamp": "2026-01-05T09:00:09Z",
    }
    bare = {"reason": "Started", "metadata": {"creationTimestamp": "2026-01-05T09:00:10Z"}}
    base = 1767603600.0  # 2026-01-05T09:00:00Z
    assert event_time(scheduler) == base + 3.25
    assert event_time(kubelet) == base + 7
    assert event_time(bare) == base + 10
    assert event_time({"reason": "x"}) is None
    pod = {
        "metadata": {"name": "p"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-05T09:02:10Z"}
            ]
        },
    }
    times, sources, _, message = timeline_from_events([scheduler, kubelet, bare], pod, "vllm")
    assert times == {
        "scheduled": base + 3.25,
        "pulled": base + 7,
        "pull_started": base + 7,
        "container_started": base + 10,
        "ready": base + 130,
    }
    assert sources["pull_started"].startswith("no Pulling event")
    assert message is None
    with pytest.raises(ValueError, match="no ready time"):
        timeline_from_events(
            [scheduler, kubelet, bare], {"metadata": {"name": "p"}, "status": {}}, "vllm"
        )
    assert phases(
        {
            "deleted": 0,
            "terminated": 5,
            "scheduled": 6,
            "pull_started": 6,
            "pulled": 9,
            "container_started": 10,
            "ready": 130,
        }
    ) == {
        "terminate": 5.0,
        "schedule": 1.0,
        "image_pull": 3.0,
        "initialise": 120.0,
        "unmeasured": 1.0,
        "total": 130.0,
    }


def test_one_order_check_serves_the_experiment_and_the_analysis(tmp_path: Path) -> None:
    """restart.json's event order is checked by one function; the analysis names the pair."""
    events = {name: float(10 * i) for i, name in enumerate(RESTART_EVENTS)}
    assert restart_events_out_of_order(events) is None
    events["pulled"] = events["pull_started"] - 1.0
    assert restart_events_out_of_order(events) == ("pull_started", "pulled")
    record = tmp_path / "restart.json"
    record.write_text(json.dumps({"engine": "vllm", "rep": "rep1", "events": events}))
    with pytest.raises(ArtifactError, match=r"event 'pulled' .* precedes 'pull_started'"):
        read_restart_record(record)


def test_no_secret_value_appears_in_any_output(
    study: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sentinel token in our environment and in the cluster Secret; the engine even prints it
    (as a misbehaving image might). Nothing servelab writes may contain it."""
    sentinel = "hf_SENTINELtokenVALUEnever0inAnyFile42"
    monkeypatch.setenv("HF_TOKEN", sentinel)
    log = (
        engine_log("vllm-0.6.3-matched") + f"DEBUG 01-05 09:01:19 envs.py:1] HF_TOKEN={sentinel}\n"
    )
    log += "WARNING 01-05 09:01:19 hub.py:1] token hf_OTHERlookingTOKEN0123456789abcd rejected\n"
    cluster = FakeCluster(
        {"vllm": PodScript(log)},
        secrets={("servelab", "hf-token"): {"token": sentinel}},
        tick_s=5.0,
    )
    out_root = tmp_path
    with running(cluster) as kube:
        backend = backend_for(kube)
        d = deployment_for(study, "matched", "vllm", "rate-0.12")
        rendered = out_root / "manifests" / "rendered" / d.id
        write_rendered(render_for(study, d), rendered)
        spec = {
            "deployment_id": d.id,
            "engine": "vllm",
            "expect_chunked_prefill": True,
            "expect_chunk_size": 2048,
        }
        deployments = out_root / "results" / "deployments" / d.id
        deployed = backend.deploy(
            spec, manifest_path=rendered, startup_log_path=deployments / "startup.log"
        )
        write_json(deployments / "resolved.json", {**confirm(spec, deployed), **deployed.facts})
        backend.restart_timeline(
            d.id, rendered, out_root / "results" / "restarts" / "vllm" / "rep1" / "restart.json"
        )
    files = [p for p in out_root.rglob("*") if p.is_file()]
    assert len(files) >= 7  # 4 manifests, startup.log, resolved.json, restart.json
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert sentinel not in text, path
        assert "hf_OTHERlookingTOKEN" not in text, path
    startup = (deployments / "startup.log").read_text()
    assert "HF_TOKEN=[REDACTED]" in startup and "token hf_[REDACTED] rejected" in startup


def test_redact_leaves_ordinary_text_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_API_TOKEN", raising=False)
    text = "INFO max_num_batched_tokens=2048 hf_short model=hf_internal_testing\n"
    assert redact(text) == text
    monkeypatch.setenv("HF_TOKEN", "abc")  # too short to be a token: never blanket-replaced
    assert redact("abc abc") == "abc abc"


@pytest.mark.parametrize(
    ("path", "rep"),
    [
        ("results/restarts/vllm/rep3/restart.json", "rep3"),
        ("results/restarts/vllm/restart2/restart.json", "restart2"),
        ("results/restarts/sglang/2.json", "rep2"),
        ("results/restarts/sglang/restart.json", None),
    ],
)
def test_repetition_from_the_record_path(path: str, rep: str | None) -> None:
    from servelab.deploy.restart import _rep_from_path

    assert _rep_from_path(Path(path)) == rep
