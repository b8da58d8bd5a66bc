"""The current releases' manifests (config/current.yaml, on an L4 and an H100): Kubernetes 1.35
schemas, golden files, and what the new families change.

config/current.yaml pins no image (no digest could be read where it was written): the tests
render with a stand-in digest of zeros, so the objects themselves are what is checked. Regenerate
the goldens with `UPDATE_GOLDENS=1 pytest tests/unit/test_k8s_manifests_current.py`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from snakemake.utils import update_config

from servelab.deploy.manifests import deployment_templates, render_for, write_rendered
from servelab.grid.config import deployment_for, drop_removed_engines, runs, validate_config

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "manifests_current"
K8S_VERSION = "1.35"
STAND_IN = {
    "vllm_v1": "vllm/vllm-openai:v0.33.0@sha256:" + "0" * 64,
    "sglang_v05": "lmsysorg/sglang:v0.5.23@sha256:" + "0" * 64,
}


def _config(*overlays: str) -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for name in overlays:
        update_config(config, yaml.safe_load((REPO / "config" / name).read_text()))
    drop_removed_engines(config)
    validate_config(config)
    for engine, image in STAND_IN.items():
        config["engines"][engine]["image"] = image
    return config


CONFIGS = {
    "l4": ("current.yaml",),
    "h100": ("current.yaml", "current-h100.yaml"),
}


def _rendered(config: dict) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for run in runs(config):
        d = deployment_for(config, run.arm, run.engine, run.condition)
        out.setdefault(d.id, render_for(config, d))
    return out


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def current(request: pytest.FixtureRequest) -> tuple[str, dict, dict[str, dict[str, str]]]:
    config = _config(*CONFIGS[request.param])
    return request.param, config, _rendered(config)


def test_the_current_configs_pin_no_image_and_say_why() -> None:
    text = (REPO / "config" / "current.yaml").read_text()
    config = yaml.safe_load(text)
    assert all("image" not in config["engines"][e] for e in ("vllm_v1", "sglang_v05"))
    assert "No digest is pinned" in text


def test_four_deployments_with_dns_safe_names(current: tuple) -> None:
    _, _, rendered = current
    assert sorted(d.rsplit("-", 1)[0] for d in rendered) == [
        "defaults-sglang-v05",
        "defaults-vllm-v1",
        "matched-sglang-v05",
        "matched-vllm-v1",
    ]


def test_every_manifest_validates_against_kubernetes_1_35(current: tuple) -> None:
    _, _, rendered = current
    checked = 0
    for files in rendered.values():
        for name, text in files.items():
            doc = yaml.safe_load(text)
            if doc["kind"] == "PodMonitor":  # a CRD: checked in test_k8s_manifests.py
                continue
            assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION, name
            checked += 1
    assert checked == 4 * 3


def test_the_new_families_start_their_servers_and_sglang_keeps_its_shm(current: tuple) -> None:
    _, config, rendered = current
    for did, files in rendered.items():
        container = yaml.safe_load(files["deployment.yaml"])["spec"]["template"]["spec"]
        engine = "vllm_v1" if "vllm-v1" in did else "sglang_v05"
        main = container["containers"][0]
        assert main["image"] == STAND_IN[engine]
        want = (
            ["vllm", "serve"] if engine == "vllm_v1" else ["python3", "-m", "sglang.launch_server"]
        )
        assert main["command"] == want
        port = config["engines"][engine]["port"]
        assert main["args"][:2] == ["--host=0.0.0.0", f"--port={port}"]
        mounts = {m["mountPath"] for m in main.get("volumeMounts", [])}
        assert ("/dev/shm" in mounts) == (engine == "sglang_v05")
    # every SGLang release family renders from SGLang's own deployment template
    assert deployment_templates("sglang_v05")["deployment.yaml"] == "deployment.sglang.yaml.j2"
    assert deployment_templates("vllm_v1")["deployment.yaml"] == "deployment.yaml.j2"


def test_the_matched_arm_carries_the_settings_that_still_differ(current: tuple) -> None:
    gpu, config, _ = current
    matched = deployment_for(config, "matched", "vllm_v1", "rate-0.28").flags
    if gpu == "l4":
        assert {"--max-num-batched-tokens=4096", "--max-cudagraph-capture-size=48"} <= set(matched)
    else:
        assert "--max-cudagraph-capture-size=256" in matched
        assert not any(f.startswith("--max-num-batched-tokens") for f in matched)
    # SGLang, the control, is deployed the same way in both arms
    assert (
        deployment_for(config, "matched", "sglang_v05", "rate-0.28").flags
        == deployment_for(config, "defaults", "sglang_v05", "rate-0.28").flags
    )


def test_golden_files_match(current: tuple) -> None:
    gpu, _, rendered = current
    folder = GOLDEN / gpu
    actual = {f"{did}/{name}" for did, files in rendered.items() for name in files}
    if os.environ.get("UPDATE_GOLDENS") == "1":
        for stale in folder.rglob("*.yaml"):
            stale.unlink()
        for did, files in rendered.items():
            write_rendered(files, folder / did)
        pytest.fail("UPDATE_GOLDENS=1: golden manifests rewritten; run again without it")
    expected = {p.relative_to(folder).as_posix() for p in folder.rglob("*.yaml")}
    assert expected == actual, "golden set differs (regenerate with UPDATE_GOLDENS=1)"
    for did, files in rendered.items():
        for name, text in files.items():
            assert text == (folder / did / name).read_text(encoding="utf-8"), f"{did}/{name}"


def test_rendering_is_deterministic() -> None:
    config = _config("current.yaml")
    assert _rendered(config) == _rendered(copy.deepcopy(config))
