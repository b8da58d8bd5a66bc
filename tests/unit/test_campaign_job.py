"""`servelab campaign submit`, `status --cluster`, `logs` and `fetch` against the fake API server
(tests/fakekube: its Job controller and its exec of `tar` over a WebSocket, fakekube.batch),
through the real `kubernetes` client and the command line.

What the fake cannot show is said where it matters: it stores RBAC objects without enforcing
them (test_campaign_rbac.py checks the rules against the code and the backend's traffic), and it
models every lost pod as failed (a real Job ignores disruptions, as its podFailurePolicy says).
That a replacement pod running the same command on the same volume redoes nothing is the
workflow's own property: tests/orchestration/test_campaign_job_resume.py runs the Job's rendered
command, kills it, and runs it again on the same folders.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakekube import FakeCluster, PodScript, running

import servelab.deploy.kube_job as kube_job
from servelab.cli import main
from servelab.deploy.job_manifests import CAMPAIGN_FILES, CAMPAIGN_LABEL, IN_CLUSTER_OVERLAY
from servelab.deploy.kube_cluster import KubernetesBackendError
from servelab.deploy.kube_job import extract_results

IMAGE = "registry.example/servelab/servelab:0.1.0@sha256:" + "ab" * 32
TOKEN = "hf_CAMPAIGNlogSENTINELtoken0123456789"
LOG = (
    "Using profile profiles/default for setting default command line arguments.\n"
    "Building DAG of jobs...\n"
    f"job deploy: the engine's log said {TOKEN}\n"
    "5 of 40 steps (12%) done\n"
)


def campaign_cluster(volume: Path, **script: Any) -> FakeCluster:
    scripts = {"snakemake": PodScript(LOG, pull_s=None, ready_s=0.0, **script)}
    return FakeCluster(scripts, volumes={"servelab-campaign": volume}, tick_s=5.0)


def configfile(tmp_path: Path, kube: Any) -> str:
    """A campaign's configuration: the kubernetes backend, in-cluster URLs, the image; how this
    machine reaches the (fake) cluster, and waits that take no time."""
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    path = tmp_path / "kubernetes.yaml"
    path.write_text(
        "# the campaign's overrides\n"
        "backend: kubernetes\n"
        "telemetry:\n  step_s: 5\n"
        "  prometheus_url: http://kube-prometheus-stack-prometheus.monitoring.svc.cluster.local:9090\n"
        "kubernetes:\n"
        f"  kubeconfig: {kubeconfig}\n"
        "  timeouts: {ready_s: 900, delete_s: 300, poll_s: 0.001, request_s: 10}\n"
        f"  campaign_job: {{image: '{IMAGE}'}}\n"
    )
    return str(path)


def servelab(*args: str) -> int:
    return main(["campaign", *args])


def write_results(volume: Path) -> dict[str, bytes]:
    files = {
        "results/runs/defaults/vllm/rate-0.12/rep1/run.json": b'{"status": "ok"}\n',
        "results/runs/defaults/vllm/rate-0.12/rep1/requests.parquet": os.urandom(300_000),
        "results/table5.csv": b"metric,value\n",
    }
    for name, data in files.items():
        (volume / name).parent.mkdir(parents=True, exist_ok=True)
        (volume / name).write_bytes(data)
    return files


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    folder = tmp_path / "volume"
    folder.mkdir()
    return folder


def test_submit_dry_run_prints_the_objects_and_contacts_no_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "campaign.yaml"
    config.write_text(
        "backend: kubernetes\n"
        "telemetry: {step_s: 5, prometheus_url: 'http://prometheus.monitoring.svc:9090'}\n"
        # nothing listens here: a dry run must not try
        "kubernetes: {kubeconfig: /nonexistent/kubeconfig}\n"
    )
    code = servelab(
        "submit",
        "--dry-run",
        "--image",
        IMAGE,
        "--configfile",
        str(config),
        "--",
        "results/table5.csv",
    )
    assert code == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(CAMPAIGN_FILES) and kinds[-1] == "Job"
    assert docs[-1]["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "results/table5.csv"


def test_submit_refuses_another_base_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "base.yaml"
    other.write_text("{}\n")
    assert servelab("submit", "--dry-run", "--config", str(other)) == 2
    assert "--configfile" in capsys.readouterr().err


def test_submit_applies_the_campaign_and_refuses_a_second_one(
    tmp_path: Path, volume: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = campaign_cluster(volume)
    with running(cluster) as kube:
        config = configfile(tmp_path, kube)
        assert servelab("submit", "--configfile", config, "--", "results/table5.csv") == 0
        out = capsys.readouterr().out
        assert "Job/servelab-campaign created" in out
        assert {k[0] for k in cluster.objects} >= {
            "serviceaccounts",
            "clusterroles",
            "clusterrolebindings",
            "roles",
            "rolebindings",
            "persistentvolumeclaims",
            "configmaps",
            "jobs",
            "pods",
        }
        data = cluster.objects[("configmaps", "servelab", "servelab-campaign")]["data"]
        assert data["01-kubernetes.yaml"] == Path(config).read_text()
        assert data[IN_CLUSTER_OVERLAY[0]] == IN_CLUSTER_OVERLAY[1]

        assert servelab("status", "--cluster", "--configfile", config) == 0
        status = capsys.readouterr().out
        assert "campaign Job servelab-campaign (namespace servelab): running" in status
        assert "targets: results/table5.csv" in status and IMAGE in status

        # One campaign per volume: an active Job is never touched, not even with --replace.
        assert servelab("submit", "--replace", "--configfile", config) == 2
        assert "still active" in capsys.readouterr().err
        assert len([k for k in cluster.objects if k[0] == "jobs"]) == 1
    assert not [path for _, path in cluster.requests if "secret" in path]


def test_a_deleted_pod_is_replaced_by_the_same_command_on_the_same_volume(
    tmp_path: Path, volume: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the Job asks of the cluster when its pod is lost: a new pod, only once the old one
    has terminated, with the same command, configuration and volume. (That the same command on
    the same volume redoes nothing is the workflow's: test_campaign_job_resume.py.)"""
    cluster = campaign_cluster(volume)
    with running(cluster) as kube:
        config = configfile(tmp_path, kube)
        assert servelab("submit", "--configfile", config, "--", "results/table5.csv") == 0
        capsys.readouterr()
        api = kube_job.CampaignCluster(kube.api_client(), {"timeouts": {"poll_s": 0.001}})
        [first] = api.pods()
        assert servelab("status", "--cluster", "--configfile", config) == 0
        api.core.delete_namespaced_pod(first["metadata"]["name"], "servelab")
        gone_at = None
        for _ in range(50):
            pods = api.pods()
            names = [p["metadata"]["name"] for p in pods]
            if first["metadata"]["name"] not in names and gone_at is None:
                gone_at = cluster.pods[first["metadata"]["name"]].gone
            # never two snakemakes: while the old pod terminates there is no new one
            assert len([p for p in pods if p["status"].get("phase") in ("Pending", "Running")]) <= 1
            if [n for n in names if n != first["metadata"]["name"]]:
                break
        [second] = [p for p in api.pods() if p["metadata"]["name"] != first["metadata"]["name"]]
        created = cluster.pods[second["metadata"]["name"]].created
        assert gone_at is not None and created >= gone_at
        for key in (
            "containers",
            "initContainers",
            "volumes",
            "serviceAccountName",
            "nodeSelector",
        ):
            assert second["spec"][key] == first["spec"][key], key
        state = api.state()
        assert (state.phase, state.failed, len(state.pods)) == ("running", 1, 1)
        assert servelab("status", "--cluster", "--configfile", config) == 0
        out = capsys.readouterr().out
        assert "pods failed 1 of backoff limit 3" in out and second["metadata"]["name"] in out


def test_a_finished_job_is_replaced_only_when_asked(
    tmp_path: Path, volume: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = campaign_cluster(volume, exit_after_s=60.0)
    with running(cluster) as kube:
        config = configfile(tmp_path, kube)
        assert servelab("submit", "--configfile", config, "--", "results/table5.csv") == 0
        api = kube_job.CampaignCluster(kube.api_client(), {"timeouts": {"poll_s": 0.001}})
        for _ in range(40):
            if api.state().phase == "succeeded":
                break
        state = api.state()
        assert (state.phase, state.succeeded) == ("succeeded", 1)
        assert state.pods[-1].exit_code == 0
        capsys.readouterr()
        assert servelab("submit", "--configfile", config) == 2
        assert "--replace" in capsys.readouterr().err
        assert servelab("submit", "--replace", "--configfile", config, "--", "all") == 0
        out = capsys.readouterr().out
        assert "Job/servelab-campaign deleted (succeeded)" in out
        assert "PersistentVolumeClaim/servelab-campaign kept" in out
        assert (
            "ConfigMap/servelab-campaign replaced" in out
            and "Role/servelab-campaign replaced" in out
        )
        job = cluster.objects[("jobs", "servelab", "servelab-campaign")]
        assert job["metadata"]["annotations"]["servelab.dev/targets"] == "all"


def test_logs_show_the_newest_pod_redacted(
    tmp_path: Path, volume: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = campaign_cluster(volume)
    with running(cluster) as kube:
        config = configfile(tmp_path, kube)
        assert servelab("submit", "--configfile", config) == 0
        capsys.readouterr()
        assert servelab("logs", "--configfile", config) == 0
        out, err = capsys.readouterr()
        assert "Building DAG of jobs..." in out and TOKEN not in out and "hf_[REDACTED]" in out
        assert "servelab-campaign-" in err
        assert servelab("logs", "--tail", "1", "--configfile", config) == 0
        assert capsys.readouterr().out == "5 of 40 steps (12%) done\n"
        assert servelab("logs", "--follow", "--configfile", config) == 0
        assert capsys.readouterr().out.endswith("5 of 40 steps (12%) done\n")


def test_status_and_logs_before_any_submission(
    tmp_path: Path, volume: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running(campaign_cluster(volume)) as kube:
        config = configfile(tmp_path, kube)
        assert servelab("status", "--cluster", "--configfile", config) == 0
        assert "not submitted" in capsys.readouterr().out
        assert servelab("logs", "--configfile", config) == 2
        assert "has no pod" in capsys.readouterr().err


def test_fetch_copies_results_byte_for_byte(
    tmp_path: Path,
    volume: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    files = write_results(volume)
    placed: list[str | None] = []
    render = kube_job.render_fetch_pod

    def recording(settings: Any, image: str, *, node_name: str | None = None) -> str:
        placed.append(node_name)
        return render(settings, image, node_name=node_name)

    monkeypatch.setattr(kube_job, "render_fetch_pod", recording)
    cluster = campaign_cluster(volume)
    dest = tmp_path / "copy" / "results"
    dest.mkdir(parents=True)
    (dest / "local-only.txt").write_text("kept\n")
    with running(cluster) as kube:
        config = configfile(tmp_path, kube)
        assert servelab("submit", "--configfile", config) == 0
        api = kube_job.CampaignCluster(kube.api_client(), {"timeouts": {"poll_s": 0.001}})
        campaign_pod = api.pods()[-1]
        capsys.readouterr()
        assert servelab("fetch", "--dest", str(dest), "--configfile", config) == 0
        assert "3 files of results/ written" in capsys.readouterr().out
        # The helper went to the campaign pod's node (the volume is attached there) and is deleted.
        assert placed == [campaign_pod["spec"]["nodeName"]]
        assert cluster.pods["servelab-campaign-fetch"].delete_requested is not None
        exec_requests = [p for m, p in cluster.requests if p.endswith("/exec")]
        assert exec_requests == ["/api/v1/namespaces/servelab/pods/servelab-campaign-fetch/exec"]
    for name, data in files.items():
        assert (dest / name.removeprefix("results/")).read_bytes() == data, name
    assert (dest / "local-only.txt").read_text() == "kept\n"
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".servelab-fetch-")]


def test_fetch_after_the_job_ended_uses_the_cpu_pool_and_reports_a_failing_tar(
    tmp_path: Path,
    volume: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    placed: list[str | None] = []
    render = kube_job.render_fetch_pod
    monkeypatch.setattr(
        kube_job,
        "render_fetch_pod",
        lambda s, image, node_name=None: (
            placed.append(node_name) or render(s, image, node_name=node_name)
        ),
    )
    cluster = campaign_cluster(volume, exit_after_s=10.0)
    with running(cluster) as kube:
        config = configfile(tmp_path, kube)
        assert servelab("submit", "--configfile", config) == 0
        api = kube_job.CampaignCluster(kube.api_client(), {"timeouts": {"poll_s": 0.001}})
        for _ in range(20):
            if api.state().phase == "succeeded":
                break
        capsys.readouterr()
        # No results/ on the volume: tar fails, the command says so, the helper is deleted.
        assert servelab("fetch", "--dest", str(tmp_path / "out"), "--configfile", config) == 2
        assert "tar exited 2" in capsys.readouterr().err
        assert placed == [None]
        assert cluster.pods["servelab-campaign-fetch"].delete_requested is not None


def _archive(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    path = tmp_path / "a.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("results/../../escape.txt", tarfile.REGTYPE),
        ("/etc/passwd", tarfile.REGTYPE),
        ("other/file.txt", tarfile.REGTYPE),
        ("results/link", tarfile.SYMTYPE),
        ("results/device", tarfile.CHRTYPE),
    ],
)
def test_an_archive_member_outside_plain_results_files_is_refused(
    tmp_path: Path, name: str, kind: bytes
) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/passwd"
    good = tarfile.TarInfo("results/ok.txt")
    archive = _archive(tmp_path, (good, b"ok"), (info, b"x"))
    dest = tmp_path / "dest"
    with pytest.raises(KubernetesBackendError, match="refused archive member"):
        extract_results(archive, dest)
    assert not (dest / "ok.txt").exists()  # nothing is written from a refused archive
    assert not (tmp_path / "escape.txt").exists()


def test_the_campaign_label_finds_only_the_jobs_pods(volume: Path, tmp_path: Path) -> None:
    cluster = campaign_cluster(volume)
    with running(cluster) as kube:
        assert servelab("submit", "--configfile", configfile(tmp_path, kube)) == 0
        pods = [k for k in cluster.objects if k[0] == "pods"]
        [(_, _, name)] = pods
        assert cluster.objects[("pods", "servelab", name)]["metadata"]["labels"][CAMPAIGN_LABEL]


class _StalledSocket:
    """A WebSocket whose server sends one frame, then nothing."""

    def __init__(self) -> None:
        self.sent = False
        self.timeouts: list[float] = []

    def settimeout(self, seconds: float) -> None:
        self.timeouts.append(seconds)

    def recv_data_frame(self, control_frame: bool) -> tuple[int, Any]:
        from websocket import ABNF, WebSocketTimeoutException

        if self.sent:
            raise WebSocketTimeoutException("timed out")
        self.sent = True
        return ABNF.OPCODE_BINARY, type("Frame", (), {"data": b"\x01tar bytes"})()


def test_a_stalled_copy_ends_at_its_deadline() -> None:
    sock = _StalledSocket()
    frames = kube_job._channel_frames(sock, lambda: 7.0)
    assert next(frames) == (1, b"tar bytes")
    with pytest.raises(KubernetesBackendError, match="did not end in time"):
        next(frames)
    assert sock.timeouts == [7.0, 7.0]  # each wait bounded by what is left of the deadline
    with pytest.raises(KubernetesBackendError, match="did not end in time"):
        next(kube_job._channel_frames(_StalledSocket(), lambda: 0.0))


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (b'{"metadata": {}, "status": "Success"}', 0),
        (
            b'{"status": "Failure", "reason": "NonZeroExitCode", '
            b'"details": {"causes": [{"reason": "ExitCode", "message": "2"}]}}',
            2,
        ),
    ],
)
def test_the_exit_code_is_read_from_the_error_channel(status: bytes, code: int) -> None:
    assert kube_job._exit_code(status) == code


@pytest.mark.parametrize(
    "status", [b"", b'{"status": "Failure", "message": "container not found (\\"fetch\\")"}']
)
def test_an_exec_without_an_exit_code_is_an_error(status: bytes) -> None:
    with pytest.raises(KubernetesBackendError):
        kube_job._exit_code(status)
