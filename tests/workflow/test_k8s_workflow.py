"""The workflow's render and deploy rules with `backend: kubernetes`, as a user runs them: a real
snakemake process, the kubernetes client configured from a kubeconfig, the fake API server (with
one GPU node, and with three and `campaign.gpu_nodes: 3`)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from fakekube import FakeCluster, PodScript, engine_log, running

from servelab.deploy.node import SLOT_LABEL
from servelab.grid.config import deployment_for, node_slots

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def _workdir(tmp: Path) -> Path:
    """A copy of the workflow (so no lock or output lands in the repository)."""
    work = tmp / "work"
    work.mkdir()
    shutil.copy(REPO / "Snakefile", work / "Snakefile")
    shutil.copy(REPO / "environment.yml", work / "environment.yml")  # rules name it (conda:)
    shutil.copytree(REPO / "workflow", work / "workflow")
    shutil.copytree(REPO / "config", work / "config", symlinks=False)
    if (REPO / "profiles").is_dir():
        shutil.copytree(REPO / "profiles", work / "profiles")
    restart = work / "workflow" / "rules" / "restart.smk"
    if "rule restart" not in restart.read_text():
        # common.smk names rules.restart.output.record for backend: kubernetes, and the restart
        # rule is not written yet: a stand-in, in this copy only, so the workflow parses.
        restart.write_text(restart.read_text() + RESTART_STANDIN)
    return work


RESTART_STANDIN = """

rule restart:
    output:
        record="results/restarts/{engine}/{k}/restart.json",
    shell:
        "false"
"""


def test_deploy_rule_on_the_kubernetes_backend(tmp_path: Path) -> None:
    study = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    good = deployment_for(study, "defaults", "vllm", "rate-0.12")
    bad = deployment_for(
        study, "matched", "vllm", "rate-0.28"
    )  # its pod will log chunked prefill off
    work = _workdir(tmp_path)
    sentinel = "hf_WORKFLOWsentinelTOKEN0123456789xyz"
    cluster = FakeCluster(
        {"vllm": PodScript(engine_log("vllm-0.6.3-defaults"))},
        secrets={("servelab", "hf-token"): {"token": sentinel}},
        tick_s=10.0,
    )
    with running(cluster) as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        override = {
            "backend": "kubernetes",
            "kubernetes": {
                "kubeconfig": str(kubeconfig),
                "context": "fake",
                "timeouts": {"ready_s": 60, "delete_s": 60, "poll_s": 0.01, "request_s": 10},
            },
        }
        (work / "k8s.yaml").write_text(yaml.safe_dump(override))

        # Both deployments in one snakemake process (--keep-going: the refusal does not stop
        # the other); gpu_slots and --cores 1 run them one after the other.
        result = subprocess.run(
            [
                str(SNAKEMAKE),
                "--cores",
                "1",
                "--keep-going",
                "--configfile",
                "k8s.yaml",
                "--",
                f"results/deployments/{good.id}/resolved.json",
                f"results/deployments/{bad.id}/resolved.json",
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "HF_TOKEN": sentinel},
        )
    assert result.returncode != 0, "the refused deployment must fail the workflow"
    assert (work / "results/deployments" / good.id / "resolved.json").is_file(), result.stderr[
        -4000:
    ]
    resolved = json.loads((work / "results/deployments" / good.id / "resolved.json").read_text())
    assert (resolved["chunked_prefill"], resolved["backend"]) == (False, "kubernetes")
    log = (work / "results/deployments" / good.id / "startup.log").read_text()
    assert "vLLM API server version dev" in log
    assert (work / "results/manifests" / f"{good.id}.yaml").is_file()
    assert not (work / "results/deployments" / bad.id / "resolved.json").exists()
    rule_log = (work / "results/logs/deployments" / f"{bad.id}.deploy.log").read_text()
    assert "ResolvedConfigMismatch" in rule_log and "chunked_prefill_enabled=False" in rule_log
    # Snakemake removed the failed job's startup.log; the evidence survives beside it.
    refused_log = work / "results/deployments" / bad.id / "startup.refused.log"
    assert "chunked_prefill_enabled=False multi_step_stream_outputs" in refused_log.read_text()
    # The token is in snakemake's environment and in the Secret: in no file of the workflow.
    written = [p for p in work.rglob("*") if p.is_file() and ".snakemake" not in p.parts]
    assert any(p.suffix == ".log" for p in written)
    assert not [p for p in written if sentinel in p.read_text(errors="replace")]
    # One engine at a time: whichever deployed second retired the other.
    assert len({k[2] for k in cluster.objects if k[0] == "deployments"}) == 1


# One deployment per slot whose scripted start-up log passes the gate.
TRIO = (("defaults", "vllm"), ("defaults", "sglang"), ("matched", "sglang"))


def test_three_deploy_jobs_on_three_nodes_at_once(tmp_path: Path) -> None:
    """`campaign.gpu_nodes: 3`, `--cores 3`, three nodes: the three deploy jobs, one per node
    slot, run at once (the fake schedules no pod until all three Deployments exist, so jobs run
    one after another would time out); each engine lands on the node labelled for its slot and
    none retires another."""
    study = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    three = copy.deepcopy(study)
    three["backend"], three["campaign"]["gpu_nodes"] = "kubernetes", 3
    slots = node_slots(three)
    ids = [deployment_for(three, arm, engine, "rate-0.12").id for arm, engine in TRIO]
    assert sorted(slots[d] for d in ids) == [0, 1, 2], slots  # one deployment per slot
    work = _workdir(tmp_path)
    cluster = FakeCluster(
        {
            "vllm": PodScript(engine_log("vllm-0.6.3-defaults")),
            "sglang": PodScript(engine_log("sglang-0.4.1-l4")),
        },
        secrets={("servelab", "hf-token"): {"token": "hf_NODESworkflowTOKEN0123456789xyz"}},
        tick_s=10.0,
        nodes=3,
        # no pod is scheduled before the three Deployments exist: the jobs must overlap
        hold=lambda c: sum(1 for k in c.objects if k[0] == "deployments") < 3,
    )
    with running(cluster) as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        override = {
            "backend": "kubernetes",
            "campaign": {"gpu_nodes": 3},
            "kubernetes": {
                "kubeconfig": str(kubeconfig),
                "context": "fake",
                "timeouts": {"ready_s": 60, "delete_s": 60, "poll_s": 0.01, "request_s": 10},
            },
        }
        (work / "k8s.yaml").write_text(yaml.safe_dump(override))
        result = subprocess.run(
            [
                str(SNAKEMAKE),
                "--cores",
                "3",
                "--configfile",
                "k8s.yaml",
                "--",
                *(f"results/deployments/{d}/resolved.json" for d in ids),
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ},
        )
    assert result.returncode == 0, result.stderr[-6000:]
    nodes = {}
    for d in ids:
        resolved = json.loads((work / "results/deployments" / d / "resolved.json").read_text())
        assert resolved["backend"] == "kubernetes"
        [pod] = [
            o
            for k, o in cluster.objects.items()
            if k[0] == "pods" and o["metadata"]["labels"]["servelab.dev/deployment"] == d
        ]
        assert pod["spec"]["nodeSelector"][SLOT_LABEL] == str(slots[d])
        nodes[d] = pod["spec"]["nodeName"]
        labels = cluster.node_named(nodes[d])["metadata"]["labels"]
        assert labels[SLOT_LABEL] == str(slots[d])
        # The manifest on disk is the one a one-node campaign renders.
        assert SLOT_LABEL not in (work / "results/manifests" / f"{d}.yaml").read_text()
    assert sorted(nodes.values()) == sorted(cluster.node_names)  # three nodes, one engine each
    assert {k[2] for k in cluster.objects if k[0] == "deployments"} == set(ids)  # none retired
