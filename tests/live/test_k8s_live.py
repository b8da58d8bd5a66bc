"""Live tier (skipped without --kubeconfig): the rendered manifests against a real API server,
and, with --live-deploy, a real engine brought up, gated, identified and torn down."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servelab.campaign.deploy import confirm
from servelab.deploy.kubernetes import KubernetesBackend
from servelab.deploy.manifests import render_deployment, resolve_settings, write_rendered
from servelab.grid.config import deployment_for, runs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def _render(
    study: dict, settings: dict, arm: str, engine: str, condition: str, out: Path
) -> tuple[dict, Path]:
    d = deployment_for(study, arm, engine, condition)
    spec = study["engines"][engine]
    rendered = render_deployment(
        deployment_id=d.id,
        engine=engine,
        image=spec["image"],
        port=spec["port"],
        flags=list(d.flags),
        namespace=settings["namespace"],
        k8s_settings={**study["kubernetes"], **settings},
    )
    write_rendered(rendered, out / d.id)
    deployment = {
        "deployment_id": d.id,
        "engine": engine,
        "image": spec["image"],
        "port": spec["port"],
        "flags": list(d.flags),
        "expect_chunked_prefill": d.expect_chunked_prefill,
        "expect_chunk_size": d.expect_chunk_size,
    }
    return deployment, out / d.id


def test_api_server_admits_every_rendered_manifest(
    study: dict, live_settings: dict, tmp_path: Path
) -> None:
    """Server-side dry run (dryRun=All) of every study deployment: schema, defaulting, admission."""
    backend = KubernetesBackend.from_settings(live_settings)
    seen = set()
    for run in runs(study):
        d = deployment_for(study, run.arm, run.engine, run.condition)
        if d.id in seen:
            continue
        seen.add(d.id)
        _, rendered = _render(study, live_settings, run.arm, run.engine, run.condition, tmp_path)
        lines = backend.cluster.apply(rendered, dry_run=True)
        assert all(
            line.endswith("(dry run)") or "kept" in line or "skipped" in line for line in lines
        ), lines
    assert len(seen) == 5


def test_engine_deploys_passes_the_gate_and_tears_down(
    study: dict, deploy_settings: dict, tmp_path: Path
) -> None:
    """A real vLLM 0.6.3 in the matched arm on the L4 node; minutes, and GPU time."""
    settings = resolve_settings({**study["kubernetes"], **deploy_settings})
    backend = KubernetesBackend.from_settings(settings)
    deployment, rendered = _render(study, deploy_settings, "matched", "vllm", "rate-0.28", tmp_path)
    try:
        deployed = backend.deploy(
            deployment, manifest_path=rendered, startup_log_path=tmp_path / "startup.log"
        )
        record = confirm(deployment, deployed)
        assert (record["chunked_prefill"], record["chunk_size"]) == (True, 2048)
        assert deployed.facts["node"]["accelerator"] == "nvidia-l4"
        start = backend.node_identity(deployment["deployment_id"])
        assert start["uid"] and start["provider_id"]
        restart = backend.restart_timeline(
            deployment["deployment_id"],
            rendered,
            tmp_path / "restarts" / "vllm" / "rep1" / "restart.json",
        )
        assert restart["phases_s"]["total"] > 0
    finally:
        backend.teardown(deployment["deployment_id"])
