"""The campaign Job's objects (servelab.deploy.job_manifests): Kubernetes 1.35 schemas, golden
files, and what they must say: one snakemake at a time on the campaign volume, resumed by a
replacement pod, non-root, no secret anywhere.

Regenerate the golden files with `UPDATE_GOLDENS=1 pytest tests/unit/test_campaign_job_manifests.py`
(the run then fails on purpose, so a stale golden can never pass silently).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from servelab.campaign.job import check_in_cluster_urls, render_submission
from servelab.deploy.job_manifests import (
    CAMPAIGN_FILES,
    CAMPAIGN_LABEL,
    CONFIG_DIR,
    IN_CLUSTER_OVERLAY,
    WORK_DIR,
    CampaignSpec,
    config_file_keys,
    render_campaign,
    render_fetch_pod,
    snakemake_args,
)
from servelab.deploy.manifests import ManifestError, write_rendered
from servelab.grid.settings import KubernetesSettings

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "campaign"
K8S_VERSION = "1.35"
IMAGE = "europe-docker.pkg.dev/servelab-study/servelab/servelab:0.1.0@sha256:" + "5e" * 32
# What a campaign's configuration file says besides (config/config.yaml's Prometheus is a
# workstation's, which a Job refuses).
IN_CLUSTER = (
    "telemetry:\n  step_s: 5\n"
    "  prometheus_url: http://kube-prometheus-stack-prometheus.monitoring.svc.cluster.local:9090\n"
)
OVERRIDES = "backend: kubernetes\nkubernetes:\n  run_label: study-2026-01\n"
TOKEN = "hf_CAMPAIGNjobSENTINELtoken0123456789"


def spec(**changes: Any) -> CampaignSpec:
    fields: dict[str, Any] = {
        "settings": KubernetesSettings.from_section({"run_label": "study-2026-01"}),
        "image": IMAGE,
        "config_files": {"01-kubernetes.yaml": OVERRIDES},
        "targets": ("results/table5.csv",),
        "cores": 1,
        "annotations": {"servelab.dev/servelab-version": "0.1.0"},
    }
    fields.update(changes)
    return CampaignSpec(**fields)


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return render_campaign(spec())


@pytest.fixture(scope="module")
def objects(rendered: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {name: yaml.safe_load(text) for name, text in rendered.items()}


def fetch_pods() -> dict[str, str]:
    settings = KubernetesSettings()
    return {
        "fetch-pod.yaml": render_fetch_pod(settings, IMAGE),
        "fetch-pod-on-node.yaml": render_fetch_pod(settings, IMAGE, node_name="gke-cpu-1"),
    }


def test_every_object_validates_against_kubernetes_1_35(rendered: dict[str, str]) -> None:
    assert list(rendered) == list(CAMPAIGN_FILES)
    for name, text in {**rendered, **fetch_pods()}.items():
        used = kubernetes_validate.validate(yaml.safe_load(text), K8S_VERSION, strict=True)
        assert used == K8S_VERSION, name


def test_validation_would_catch_a_broken_job(objects: dict[str, dict[str, Any]]) -> None:
    for field, value in (("podReplacementPolicies", "Failed"), ("backoffLimit", "three")):
        bad = yaml.safe_load(yaml.safe_dump(objects["job.yaml"]))
        bad["spec"][field] = value
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_golden_files_match(rendered: dict[str, str]) -> None:
    files = {**rendered, **fetch_pods()}
    if os.environ.get("UPDATE_GOLDENS") == "1":
        write_rendered(files, GOLDEN)
        pytest.fail("UPDATE_GOLDENS=1: golden campaign manifests rewritten; run again without it")
    assert sorted(p.name for p in GOLDEN.glob("*.yaml")) == sorted(files)
    for name, text in files.items():
        assert text == (GOLDEN / name).read_text(encoding="utf-8"), f"{name} differs"


def test_rendering_is_deterministic() -> None:
    assert render_campaign(spec()) == render_campaign(spec())


def test_the_job_resumes_on_its_volume_one_pod_at_a_time(
    objects: dict[str, dict[str, Any]],
) -> None:
    job = objects["job.yaml"]["spec"]
    assert (job["completions"], job["parallelism"]) == (1, 1)
    # A replacement only once the old pod has terminated: never two snakemakes (nolock).
    assert job["podReplacementPolicy"] == "Failed"
    # A disruption (eviction, preemption, node shutdown) does not count against backoffLimit.
    assert job["podFailurePolicy"]["rules"] == [
        {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }
    ]
    assert job["backoffLimit"] == 3
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # what podFailurePolicy requires
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "default-pool"}
    assert job["template"]["metadata"]["labels"][CAMPAIGN_LABEL] == "servelab-campaign"
    claim = objects["persistentvolumeclaim.yaml"]["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["work"]["persistentVolumeClaim"]["claimName"] == claim
    assert volumes["config"]["configMap"]["name"] == objects["configmap.yaml"]["metadata"]["name"]
    [container] = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["work"] == WORK_DIR and mounts["config"] == CONFIG_DIR
    # The init container makes the folders the image's results and .snakemake links point at.
    [init] = pod["initContainers"]
    assert init["command"] == ["mkdir", "-p", f"{WORK_DIR}/results", f"{WORK_DIR}/.snakemake"]


def test_the_job_runs_the_workflows_snakemake_with_the_given_files(
    objects: dict[str, dict[str, Any]],
) -> None:
    [container] = objects["job.yaml"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["snakemake"]
    assert container["args"] == [
        "--cores",
        "1",
        "--configfile",
        f"{CONFIG_DIR}/01-kubernetes.yaml",
        f"{CONFIG_DIR}/{IN_CLUSTER_OVERLAY[0]}",
        "--",
        "results/table5.csv",
    ]
    data = objects["configmap.yaml"]["data"]
    assert data == {"01-kubernetes.yaml": OVERRIDES, IN_CLUSTER_OVERLAY[0]: IN_CLUSTER_OVERLAY[1]}
    overlay = yaml.safe_load(IN_CLUSTER_OVERLAY[1])
    assert overlay == {"kubernetes": {"kubeconfig": None, "context": None}}
    # Merged last, as snakemake merges --configfile files in order.
    assert sorted(data)[-1] == IN_CLUSTER_OVERLAY[0]
    annotations = objects["job.yaml"]["metadata"]["annotations"]
    assert annotations["servelab.dev/targets"] == "results/table5.csv"


def test_no_target_means_the_workflows_default() -> None:
    assert snakemake_args(["01-a.yaml"], [], 2)[-1] == "--"
    job = yaml.safe_load(render_campaign(spec(targets=()))["job.yaml"])
    assert "default" in job["metadata"]["annotations"]["servelab.dev/targets"]


def _keys(node: Any) -> list[str]:
    """Every mapping key in a YAML document, at any depth."""
    if isinstance(node, dict):
        return [*map(str, node), *(k for v in node.values() for k in _keys(v))]
    if isinstance(node, list):
        return [k for v in node for k in _keys(v)]
    return []


def test_pods_run_as_non_root_and_carry_no_secret(rendered: dict[str, str]) -> None:
    for name, text in {**rendered, **fetch_pods()}.items():
        keys = _keys(yaml.safe_load(text))
        assert not [k for k in keys if "secret" in k.lower()], name  # secretKeyRef, secret: ...
    job = yaml.safe_load(rendered["job.yaml"])["spec"]["template"]["spec"]
    assert job["securityContext"]["runAsNonRoot"] is True
    assert job["securityContext"]["runAsUser"] != 0
    for container in job["containers"] + job["initContainers"]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert not [e for e in container.get("env") or [] if "valueFrom" in e]
    fetch = yaml.safe_load(fetch_pods()["fetch-pod.yaml"])["spec"]
    assert fetch["automountServiceAccountToken"] is False
    assert fetch["volumes"][0]["persistentVolumeClaim"]["readOnly"] is True
    assert fetch["containers"][0]["volumeMounts"][0]["readOnly"] is True


def test_the_rbac_objects_bind_the_jobs_service_account(objects: dict[str, dict[str, Any]]) -> None:
    account = objects["serviceaccount.yaml"]["metadata"]["name"]
    assert objects["job.yaml"]["spec"]["template"]["spec"]["serviceAccountName"] == account
    for binding, role in (
        ("rolebinding.yaml", "role.yaml"),
        ("clusterrolebinding.yaml", "clusterrole.yaml"),
    ):
        body = objects[binding]
        assert body["roleRef"]["name"] == objects[role]["metadata"]["name"]
        assert body["roleRef"]["kind"] == objects[role]["kind"]
        assert body["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": "servelab"}
        ]
    # cluster-wide names carry the namespace, so two namespaces' campaigns do not collide
    assert objects["clusterrole.yaml"]["metadata"]["name"] == "servelab-campaign-servelab"


def test_the_fetch_helper_goes_to_the_node_holding_the_volume() -> None:
    pods = {k: yaml.safe_load(v)["spec"] for k, v in fetch_pods().items()}
    assert pods["fetch-pod-on-node.yaml"]["nodeName"] == "gke-cpu-1"
    assert "nodeSelector" not in pods["fetch-pod-on-node.yaml"]
    assert pods["fetch-pod.yaml"]["nodeSelector"] == {
        "cloud.google.com/gke-nodepool": "default-pool"
    }
    assert pods["fetch-pod.yaml"]["activeDeadlineSeconds"] == 3600


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"image": "servelab:latest"}, "pinned by digest"),
        ({"cores": 0}, "cores"),
        ({"targets": ("--forceall",)}, "target"),
        ({"config_files": {IN_CLUSTER_OVERLAY[0]: "x: 1\n"}}, "ConfigMap key"),
        ({"settings": KubernetesSettings.from_section({"run_label": "a" * 64})}, "label"),
    ],
)
def test_bad_input_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        render_campaign(spec(**changes))


def test_config_file_keys_keep_the_merge_order() -> None:
    assert config_file_keys(["config/kubernetes.yaml", "/x/more.yaml"]) == [
        "01-kubernetes.yaml",
        "02-more.yaml",
    ]
    with pytest.raises(ManifestError):
        config_file_keys(["config/with space.yaml"])


def _configfile(tmp_path: Path, text: str) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "campaign.yaml"
    path.write_text(text)
    return str(path)


def test_a_submission_is_rendered_from_the_configuration(tmp_path: Path) -> None:
    configfile = _configfile(
        tmp_path,
        "backend: kubernetes\n" + IN_CLUSTER + "kubernetes:\n  namespace: study\n  campaign_job:\n"
        f"    image: {IMAGE}\n    name: table5\n",
    )
    settings, rendered = render_submission([configfile], ["results/table5.csv"])
    assert (settings.namespace, settings.campaign_job.name) == ("study", "table5")
    job = yaml.safe_load(rendered["job.yaml"])
    assert (job["metadata"]["name"], job["metadata"]["namespace"]) == ("table5", "study")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    data = yaml.safe_load(rendered["configmap.yaml"])["data"]
    assert data["01-campaign.yaml"] == Path(configfile).read_text()  # as given, comments and all
    # The snakemake cores follow campaign.gpu_nodes unless given.
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["--cores", "1"]
    _, rendered = render_submission([configfile], [], cores=3)
    args = yaml.safe_load(rendered["job.yaml"])["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--cores", "3"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("backend: kubernetes\n", "no image"),
        ("backend: local\n", "a campaign Job runs"),
        (
            "backend: kubernetes\nkubernetes:\n  engine_url: 'http://127.0.0.1:{port}'\n",
            "engine_url",
        ),
        (
            "backend: kubernetes\ntelemetry: {step_s: 5, prometheus_url: 'http://localhost:9090'}\n",
            "prometheus_url",
        ),
    ],
)
def test_a_submission_the_job_cannot_run_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    image = "" if message == "no image" else f"kubernetes: {{campaign_job: {{image: '{IMAGE}'}}}}\n"
    configfile = _configfile(tmp_path, text if "telemetry" in text else text + IN_CLUSTER)
    extra = _configfile(tmp_path / "x", image) if image else None
    files = [configfile, *([extra] if extra else [])]
    with pytest.raises(ValueError, match=message):
        render_submission(files, [])


def test_the_url_check_sees_only_loopback() -> None:
    config = {"backend": "kubernetes", "telemetry": {"prometheus_url": "http://10.0.0.5:9090"}}
    check_in_cluster_urls(config)
    config["telemetry"]["prometheus_url"] = "http://[::1]:9090"
    with pytest.raises(ValueError):
        check_in_cluster_urls(config)
    # the sim backend reaches no engine and no Prometheus
    check_in_cluster_urls({**config, "backend": "sim"})


def test_no_secret_in_the_environment_reaches_a_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    configfile = _configfile(
        tmp_path,
        f"backend: kubernetes\nkubernetes: {{campaign_job: {{image: '{IMAGE}'}}}}\n" + IN_CLUSTER,
    )
    _, rendered = render_submission([configfile], ["all"])
    assert not [name for name, text in rendered.items() if TOKEN in text]
