"""Rendered engine manifests: Kubernetes 1.35 schemas, golden files, and what they must contain.

Regenerate the golden files with `UPDATE_GOLDENS=1 pytest tests/unit/test_k8s_manifests.py`
(the run then fails on purpose, so a stale golden can never pass silently).
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import os
import shutil
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

import servelab
from servelab.deploy.manifests import (
    DEFAULTS,
    ENGINE_COMMANDS,
    MANIFEST_FILES,
    ManifestError,
    deployment_templates,
    load_rendered,
    render_deployment,
    render_for,
    resolve_settings,
    template_files,
    templates_dir,
    write_rendered,
)
from servelab.grid.config import ConfigError, deployment_for, runs, validate_config
from servelab.grid.identity import MANIFEST_KEYS
from servelab.grid.settings import KubernetesSettings

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "manifests"
K8S_VERSION = "1.35"  # the study's GKE version; kubernetes-validate ships schemas for it

# The structure of the PodMonitor fields we render, taken from prometheus-operator's CRD
# (example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml, operator 0.91.0:
# spec.selector required; spec.namespaceSelector.matchNames a list of strings; podTargetLabels a
# list of strings; podMetricsEndpoints[].port string, path string, interval a Duration,
# relabelings[] with sourceLabels a list of label names and targetLabel a string).
# Stricter than the CRD on purpose: no field outside this subset is allowed.
_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
PODMONITOR_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "namespace", "labels"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": _LABELS,
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["matchLabels"],
                    "properties": {"matchLabels": _LABELS},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["matchNames"],
                    "properties": {
                        "matchNames": {"type": "array", "items": {"type": "string"}, "minItems": 1}
                    },
                },
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string", "minLength": 1},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["sourceLabels", "targetLabel"],
                                    "properties": {
                                        "sourceLabels": {
                                            "type": "array",
                                            "items": {
                                                "type": "string",
                                                "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$",
                                            },
                                        },
                                        "targetLabel": {"type": "string", "minLength": 1},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _study_deployments(config: dict) -> dict[str, object]:
    out = {}
    for run in runs(config):
        d = deployment_for(config, run.arm, run.engine, run.condition)
        out.setdefault(d.id, d)
    return out


@pytest.fixture(scope="module")
def study() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


@pytest.fixture(scope="module")
def rendered(study: dict) -> dict[str, dict[str, str]]:
    """Every deployment of the study grid, rendered with the config's settings."""
    return {did: render_for(study, d) for did, d in _study_deployments(study).items()}


def _docs(rendered: dict[str, dict[str, str]]):
    for did, files in sorted(rendered.items()):
        for name, text in files.items():
            yield did, name, yaml.safe_load(text)


def test_study_grid_has_five_deployments(rendered: dict) -> None:
    # defaults x {vllm, sglang}; matched vllm; matched sglang for rate runs and for length-8192.
    assert sorted(d.split("-")[0] + "-" + d.split("-")[1] for d in rendered) == [
        "defaults-sglang",
        "defaults-vllm",
        "matched-sglang",
        "matched-sglang",
        "matched-vllm",
    ]
    for files in rendered.values():
        assert list(files) == list(MANIFEST_FILES)


def test_every_manifest_validates_against_kubernetes_1_35(rendered: dict) -> None:
    assert K8S_VERSION in kubernetes_validate.utils.all_versions() or any(
        v.startswith(K8S_VERSION + ".") for v in kubernetes_validate.utils.all_versions()
    )
    checked = 0
    for did, name, doc in _docs(rendered):
        if doc["kind"] == "PodMonitor":
            jsonschema.validate(doc, PODMONITOR_SCHEMA)
        else:
            used = kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            assert used == K8S_VERSION, (did, name, used)
        checked += 1
    assert checked == 5 * 5  # five objects each, the DCGM exporter's PodMonitor among them


def test_validation_would_catch_a_broken_manifest(rendered: dict) -> None:
    """The schema check is not vacuous: a misspelt field and a wrong type are rejected."""
    doc = yaml.safe_load(next(iter(rendered.values()))["deployment.yaml"])
    bad = copy.deepcopy(doc)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    bad = copy.deepcopy(doc)
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    monitor = yaml.safe_load(next(iter(rendered.values()))["podmonitor.yaml"])
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "5 seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, PODMONITOR_SCHEMA)


def test_golden_files_match(rendered: dict) -> None:
    update = os.environ.get("UPDATE_GOLDENS") == "1"
    expected = (
        {p.relative_to(GOLDEN).as_posix() for p in GOLDEN.rglob("*.yaml")}
        if GOLDEN.is_dir()
        else set()
    )
    actual = {f"{did}/{name}" for did, files in rendered.items() for name in files}
    if update:
        for did, files in rendered.items():
            write_rendered(files, GOLDEN / did)
        for stale in expected - actual:
            (GOLDEN / stale).unlink()
        pytest.fail("UPDATE_GOLDENS=1: golden manifests rewritten; run again without it")
    assert expected == actual, "golden set differs (regenerate with UPDATE_GOLDENS=1)"
    for did, files in rendered.items():
        for name, text in files.items():
            golden = (GOLDEN / did / name).read_text(encoding="utf-8")
            assert text == golden, f"{did}/{name} differs from its golden file"


def test_rendering_is_deterministic(study: dict) -> None:
    d = deployment_for(study, "matched", "sglang", "length-8192")
    first = render_for(study, d)
    again = render_for(copy.deepcopy(study), d)
    assert first == again
    # Partial settings give the same text as the full defaults.
    spec = study["engines"]["sglang"]
    args = dict(
        deployment_id=d.id,
        engine="sglang",
        image=spec["image"],
        port=spec["port"],
        flags=list(d.flags),
        namespace="servelab",
    )
    assert render_deployment(**args, k8s_settings={}) == render_deployment(
        **args, k8s_settings=DEFAULTS
    )


@pytest.mark.parametrize(
    ("arm", "engine", "condition"),
    [
        ("defaults", "vllm", "rate-0.12"),
        ("defaults", "sglang", "rate-0.12"),
        ("matched", "vllm", "rate-0.28"),
        ("matched", "sglang", "length-8192"),
    ],
)
def test_deployment_carries_the_study_configuration(
    study: dict, arm: str, engine: str, condition: str
) -> None:
    d = deployment_for(study, arm, engine, condition)
    files = render_for(study, d)
    dep = yaml.safe_load(files["deployment.yaml"])
    pod = dep["spec"]["template"]
    container = pod["spec"]["containers"][0]
    port = study["engines"][engine]["port"]
    assert container["args"] == ["--host=0.0.0.0", f"--port={port}", *d.flags]
    assert (
        container["image"] == study["engines"][engine]["image"] and "@sha256:" in container["image"]
    )
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    probe = container["readinessProbe"]
    assert (probe["httpGet"]["path"], probe["initialDelaySeconds"], probe["periodSeconds"]) == (
        "/health",
        60,
        10,
    )
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    # The token only through a Secret reference.
    token = [e for e in container["env"] if e["name"] == "HF_TOKEN"]
    assert token == [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    ]
    # Weights on the 60 Gi claim, mounted as the HF cache.
    claim = yaml.safe_load(files["persistentvolumeclaim.yaml"])
    assert claim["spec"]["resources"]["requests"]["storage"] == "60Gi"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["model-cache"] == "/root/.cache/huggingface"
    assert {"name": "HF_HOME", "value": "/root/.cache/huggingface"} in container["env"]
    # SGLang alone gets a memory-backed /dev/shm.
    assert ("dshm" in volumes) == (engine == "sglang") == (mounts.get("dshm") == "/dev/shm")
    if engine == "sglang":
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    # Labels, selectors and scraping line up.
    labels = pod["metadata"]["labels"]
    assert labels["servelab.dev/deployment"] == d.id == dep["metadata"]["name"]
    assert labels["servelab.dev/run"] == "servelab"
    assert (
        labels["app.kubernetes.io/name"] == engine
        and labels["app.kubernetes.io/part-of"] == "servelab"
    )
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = yaml.safe_load(files["service.yaml"])
    assert service["spec"]["selector"].items() <= labels.items()
    assert (
        service["spec"]["ports"][0]["port"] == port
        and service["spec"]["ports"][0]["targetPort"] == "http"
    )
    assert container["ports"][0] == {"name": "http", "containerPort": port, "protocol": "TCP"}
    notes = pod["metadata"]["annotations"]
    assert notes == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }
    monitor = yaml.safe_load(files["podmonitor.yaml"])
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "5s"}
    ]
    assert "servelab.dev/deployment" in monitor["spec"]["podTargetLabels"]
    # The GPU's DCGM exporter (GKE's managed one), its series labelled with the node it runs on.
    dcgm = yaml.safe_load(files["podmonitor-dcgm.yaml"])
    assert dcgm["metadata"]["name"] == "servelab-dcgm-exporter"  # one, whichever deployment
    assert dcgm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert dcgm["spec"]["namespaceSelector"] == {"matchNames": ["gke-managed-system"]}
    assert dcgm["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gke-managed-dcgm-exporter"
    }
    assert dcgm["spec"]["podMetricsEndpoints"] == [
        {
            "port": "metrics",
            "path": "/metrics",
            "interval": "5s",
            "relabelings": [
                {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
            ],
        }
    ]


def test_the_dcgm_podmonitor_follows_its_settings_and_can_be_left_out(study: dict) -> None:
    d = next(iter(_study_deployments(study).values()))
    own = {
        **study["kubernetes"],
        "dcgm_exporter": {
            "namespace": "gpu-operator",
            "pod_labels": {"app": "nvidia-dcgm-exporter"},
            "port": "gpu-metrics",
        },
    }
    dcgm = yaml.safe_load(render_for({**study, "kubernetes": own}, d)["podmonitor-dcgm.yaml"])
    jsonschema.validate(dcgm, PODMONITOR_SCHEMA)
    assert dcgm["spec"]["namespaceSelector"]["matchNames"] == ["gpu-operator"]
    assert dcgm["spec"]["selector"]["matchLabels"] == {"app": "nvidia-dcgm-exporter"}
    assert dcgm["spec"]["podMetricsEndpoints"][0]["port"] == "gpu-metrics"
    off = {**study["kubernetes"], "dcgm_exporter": {"enabled": False}}
    files = render_for({**study, "kubernetes": off}, d)
    assert list(files) == [n for n in MANIFEST_FILES if n != "podmonitor-dcgm.yaml"]


def test_settings_change_what_is_rendered(study: dict) -> None:
    d = deployment_for(study, "defaults", "vllm", "rate-0.05")
    spec = study["engines"]["vllm"]
    files = render_deployment(
        deployment_id=d.id,
        engine="vllm",
        image=spec["image"],
        port=spec["port"],
        flags=list(d.flags),
        namespace="bench",
        k8s_settings={
            "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"},
            "model_volume": {"storage_class": None, "size": "100Gi"},
            "hf_token_secret": {"name": "hub"},
            "run_label": "campaign-7",
            "resources": {"cpu": 6},
        },
    )
    docs = {name: yaml.safe_load(text) for name, text in files.items()}
    assert {doc["metadata"]["namespace"] for doc in docs.values()} == {"bench"}
    pod = docs["deployment.yaml"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}
    assert "storageClassName" not in docs["persistentvolumeclaim.yaml"]["spec"]
    assert docs["persistentvolumeclaim.yaml"]["spec"]["resources"]["requests"]["storage"] == "100Gi"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hub", "key": "token"}
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "6"}
    assert all(
        doc["metadata"]["labels"]["servelab.dev/run"] == "campaign-7" for doc in docs.values()
    )
    for doc in docs.values():
        if doc["kind"] != "PodMonitor":
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


_GOOD = dict(
    deployment_id="defaults-vllm-0123abcd",
    engine="vllm",
    image="vllm/vllm-openai:v0.6.3@sha256:" + "a" * 64,
    port=8000,
    flags=["--dtype=bfloat16"],
    namespace="servelab",
    k8s_settings={},
)


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"deployment_id": "Defaults_vllm"}, "deployment_id"),
        ({"deployment_id": "9-starts-with-digit"}, "deployment_id"),
        ({"engine": "tgi"}, "engine 'tgi'"),
        ({"image": "vllm/vllm-openai:v0.6.3"}, "must be pinned by digest"),
        ({"port": 0}, "port 0"),
        ({"namespace": "Servelab"}, "namespace"),
        ({"flags": "--dtype=bfloat16"}, "flags: expected a list"),
        ({"flags": ["dtype=bfloat16"]}, "flags[0]"),
        ({"flags": ["--port=9000"]}, "flags[0]"),
        ({"flags": ["--dtype=bfloat16", "--hf-token=abc"]}, "flags[1]: looks like a credential"),
        ({"flags": ["--api-key=hf_" + "x" * 30]}, "flags[0]: looks like a credential"),
        (
            {"k8s_settings": {"nodeSelector": {}}},
            "config key kubernetes: unknown key(s) 'nodeSelector'",
        ),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(change: dict, names: str) -> None:
    with pytest.raises(ManifestError) as info:
        render_deployment(**{**_GOOD, **change})
    assert names in str(info.value)


def test_credential_flag_is_not_echoed_in_the_error() -> None:
    token = "hf_" + "Q" * 34
    with pytest.raises(ManifestError) as info:
        render_deployment(**{**_GOOD, "flags": [f"--api-key={token}"]})
    assert token not in str(info.value)


def test_no_secret_value_reaches_a_manifest(monkeypatch: pytest.MonkeyPatch, study: dict) -> None:
    sentinel = "hf_SENTINELsentinelSENTINELsentinel0042"
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.setenv(name, sentinel)
    for d in _study_deployments(study).values():
        for text in render_for(study, d).values():
            assert sentinel not in text
            assert "secretKeyRef" in text or "HF_TOKEN" not in text


def test_write_rendered_is_atomic_and_removes_stale_files(tmp_path: Path, rendered: dict) -> None:
    did, files = next(iter(sorted(rendered.items())))
    out = tmp_path / "results" / "manifests" / did
    out.mkdir(parents=True)
    (out / "old-object.yaml").write_text("stale")
    (out / "notes.txt").write_text("kept: not a manifest")
    written = write_rendered(files, out)
    assert [p.name for p in written] == list(MANIFEST_FILES)
    assert sorted(p.name for p in out.iterdir()) == sorted([*MANIFEST_FILES, "notes.txt"])
    assert all((out / n).read_text() == t for n, t in files.items())
    with pytest.raises(ManifestError, match="plain"):
        write_rendered({"../escape.yaml": "x"}, out)


def test_load_rendered_reads_a_directory_or_one_multi_document_file(
    tmp_path: Path, rendered: dict
) -> None:
    did, files = next(iter(sorted(rendered.items())))
    write_rendered(files, tmp_path / did)
    # The workflow's render rule writes one multi-document file, objects in file-name order.
    (tmp_path / f"{did}.yaml").write_text("---\n".join(files[n] for n in sorted(files)))
    order = ["PersistentVolumeClaim", "Service", "Deployment", "PodMonitor", "PodMonitor"]
    for source in (tmp_path / did, tmp_path / f"{did}.yaml"):
        objects = load_rendered(source)
        assert [o["kind"] for o in objects] == order
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    with pytest.raises(ManifestError, match="no Kubernetes objects"):
        load_rendered(tmp_path / "empty.yaml")
    with pytest.raises(ManifestError, match="neither"):
        load_rendered(tmp_path / "missing")


def test_config_defaults_match_the_code(study: dict) -> None:
    assert study["kubernetes"] == DEFAULTS
    assert resolve_settings(study["kubernetes"]) == resolve_settings({})


def test_config_schema_checks_the_kubernetes_section(study: dict) -> None:
    validate_config(study)
    bad = copy.deepcopy(study)
    bad["kubernetes"]["namepsace"] = "x"
    with pytest.raises(ConfigError, match=r"kubernetes: unknown key\(s\) 'namepsace'"):
        validate_config(bad)
    bad = copy.deepcopy(study)
    bad["kubernetes"]["model_volume"]["size"] = "sixty"
    with pytest.raises(ConfigError, match=r"kubernetes\.model_volume\.size"):
        validate_config(bad)


def test_example_config_merges_into_a_valid_kubernetes_config(study: dict) -> None:
    from snakemake.utils import update_config

    example = yaml.safe_load((REPO / "config" / "kubernetes.example.yaml").read_text())
    merged = copy.deepcopy(study)
    update_config(merged, example)
    validate_config(merged)
    assert merged["backend"] == "kubernetes"
    assert merged["campaign"]["pause_between_runs_s"] == 30
    assert merged["conditions"] == study["conditions"]  # the grid itself is untouched


# ----------------------------------------------------------------------------- templates


def test_templates_are_package_data_found_through_the_package() -> None:
    folder = templates_dir()
    package = Path(servelab.__file__).parent
    assert folder == package / "deploy" / "templates"
    # Every template ships with a normal (non-editable) install: package-data names it.
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["servelab"]
    templates = sorted(folder.glob("*.j2"))
    assert templates
    for path in templates:
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, glob) for glob in globs), relative


def test_each_engine_renders_from_its_own_templates_where_it_has_them() -> None:
    assert deployment_templates("vllm") == MANIFEST_FILES
    sglang = deployment_templates("sglang")
    assert sglang["deployment.yaml"] == "deployment.sglang.yaml.j2"
    assert {k: v for k, v in sglang.items() if k != "deployment.yaml"} == {
        k: v for k, v in MANIFEST_FILES.items() if k != "deployment.yaml"
    }
    names = {engine: {p.name for p in template_files(engine)} for engine in ENGINE_COMMANDS}
    # SGLang's deployment extends the common one: both are its inputs; vLLM never reads SGLang's.
    assert names["sglang"] == {*MANIFEST_FILES.values(), "deployment.sglang.yaml.j2"}
    assert names["vllm"] == set(MANIFEST_FILES.values())
    # No template lies unused: each is an input of some engine's deployments.
    assert set().union(*names.values()) == {p.name for p in templates_dir().glob("*.j2")}


def test_template_files_follow_extends_and_includes(tmp_path: Path) -> None:
    folder = tmp_path / "templates"
    shutil.copytree(templates_dir(), folder)
    (folder / "service.toy.yaml.j2").write_text(
        '{% extends "service.yaml.j2" %}\n{% block x %}{% include "toy-ports.j2" %}{% endblock %}\n'
    )
    (folder / "toy-ports.j2").write_text("# ports\n")
    names = {p.name for p in template_files("toy", folder)}
    assert {"service.toy.yaml.j2", "service.yaml.j2", "toy-ports.j2"} <= names
    assert "deployment.sglang.yaml.j2" not in names
    # A name computed at render time cannot be declared as a rule input: refused, not guessed.
    (folder / "service.toy.yaml.j2").write_text("{% include engine ~ '.j2' %}\n")
    with pytest.raises(ManifestError, match="only known at render time"):
        template_files("toy", folder)
    (folder / "service.toy.yaml.j2").write_text('{% include "missing.j2" %}\n')
    with pytest.raises(ManifestError, match=r"'missing\.j2' not found"):
        template_files("toy", folder)


def test_an_edited_engine_template_changes_only_that_engines_manifests(
    tmp_path: Path, study: dict
) -> None:
    folder = tmp_path / "templates"
    shutil.copytree(templates_dir(), folder)
    own = folder / "deployment.sglang.yaml.j2"
    own.write_text(own.read_text().replace("is too small.", "is too small (edited)."))
    changed = set()
    for did, d in _study_deployments(study).items():
        spec = study["engines"][d.engine]
        kwargs = dict(
            deployment_id=did,
            engine=d.engine,
            image=spec["image"],
            port=int(spec["port"]),
            flags=list(d.flags),
            namespace="servelab",
            k8s_settings=study["kubernetes"],
        )
        if render_deployment(**kwargs, templates=folder) != render_deployment(**kwargs):
            changed.add(d.engine)
    assert changed == {"sglang"}


# A changed value for every key of the kubernetes section (a new key fails here until it has one).
_CHANGED_SETTING = {
    "kubeconfig": "/elsewhere/kubeconfig",
    "context": "other-cluster",
    "namespace": "bench",
    "run_label": "campaign-7",
    "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"},
    "gpu_resource": "amd.com/gpu",
    "gpu_taint_key": "amd.com/gpu",
    "resources": {"cpu": "8"},
    "image_pull_policy": "Always",
    "termination_grace_period_s": 60,
    "node_watch_s": 1,
    "model_volume": {"size": "100Gi"},
    "hf_token_secret": {"name": "hub"},
    "readiness_probe": {"period_s": 20},
    "sglang_shm_size": "20Gi",
    "pod_monitor": {"interval": "10s"},
    "engine_url": "http://{service}:{port}",
    "metrics_selector": {"pod": "{deployment_id}"},
    "dcgm_exporter": {"namespace": "gpu-operator"},
    "gpu_metrics_selector": {"Hostname": "{node}"},
    "timeouts": {"poll_s": 7},
    "campaign_job": {"name": "table5", "volume": {"size": "50Gi"}},
}


def test_exactly_the_manifest_keys_reach_a_manifest(study: dict) -> None:
    """servelab.grid.identity.MANIFEST_KEYS are the render rule's params: a key left out would not
    re-render when changed, a key put in would re-render (and redeploy) for nothing."""
    assert set(_CHANGED_SETTING) == {f.name for f in dataclasses.fields(KubernetesSettings)}
    deployments = list(_study_deployments(study).values())
    # every engine the study deploys on Kubernetes (llama.cpp, built locally, has no image)
    assert {d.engine for d in deployments} == {"vllm", "sglang"} <= set(ENGINE_COMMANDS)

    def render_all(k8s: dict) -> list[dict[str, str]]:
        return [render_for({**study, "kubernetes": k8s}, d) for d in deployments]

    baseline = render_all(study["kubernetes"])
    reaching = {
        key
        for key, value in _CHANGED_SETTING.items()
        if render_all({**study["kubernetes"], key: value}) != baseline
    }
    assert reaching == set(MANIFEST_KEYS)
