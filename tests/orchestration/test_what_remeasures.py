"""What re-measures (servelab.grid.identity), through the real workflow: over a completed tiny sim
campaign, a dry run after changing one operational setting plans no deploy, run or telemetry job;
after changing one identity setting it plans exactly the runs that setting defines."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from campaigns import Workdir

MEASURING = ("deploy", "run", "telemetry")


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory, tiny_campaign: Workdir) -> Workdir:
    """A copy of the session's completed tiny campaign (the dry runs write config files)."""
    return tiny_campaign.copy_to(tmp_path_factory.mktemp("identity"))


def planned(work: Workdir, config: dict[str, Any]) -> dict[str, int]:
    """{rule: jobs} a dry run plans with `config` (the campaign's own config is left as it was)."""
    path = work.path / "config" / "changed.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = work.snakemake("results/table5.csv", "-n", f"--configfile={path}")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1]
    return {
        m["rule"]: int(m["n"])
        for m in re.finditer(r"^(?P<rule>[a-z_0-9]+)\s+(?P<n>\d+)$", table, re.M)
        if m["rule"] != "total"
    }


def changed(work: Workdir, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    config = copy.deepcopy(work.config)
    edit(config)
    return config


def _set(*keys: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        node = config
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value

    return edit


OPERATIONAL = {
    "kubernetes.timeouts.poll_s": _set("kubernetes", "timeouts", "poll_s", value=7),
    "kubernetes.timeouts.ready_s": _set("kubernetes", "timeouts", "ready_s", value=600),
    "kubernetes.kubeconfig": _set("kubernetes", "kubeconfig", value="/elsewhere/kubeconfig"),
    "kubernetes.context": _set("kubernetes", "context", value="another-cluster"),
    "kubernetes.node_watch_s": _set("kubernetes", "node_watch_s", value=60),
    "campaign.pause_between_runs_s": _set("campaign", "pause_between_runs_s", value=120),
    "campaign.retries": _set("campaign", "retries", value=5),
    "campaign.faults (one run)": _set(
        "campaign",
        "faults",
        value=[{"run": "defaults/vllm/rate-0.28/rep2", "kind": "reclaim", "at_s": 5}],
    ),
    "dispatch.health_timeout_s": _set("dispatch", "health_timeout_s", value=30),
    "telemetry.prometheus_url": _set("telemetry", "prometheus_url", value="http://127.0.0.1:1"),
}


@pytest.mark.parametrize("key", sorted(OPERATIONAL))
def test_an_operational_setting_re_measures_nothing(campaign: Workdir, key: str) -> None:
    jobs = planned(campaign, changed(campaign, OPERATIONAL[key]))
    assert {rule: jobs.get(rule, 0) for rule in MEASURING} == dict.fromkeys(MEASURING, 0), jobs


def _flags(engine: str, flags: list[str]) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        config["arms"]["defaults"]["engines"][engine]["flags"] += flags

    return edit


def _image(engine: str) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        name = config["engines"][engine]["image"].split("@")[0]
        config["engines"][engine]["image"] = f"{name}@sha256:{'e' * 64}"

    return edit


# (what changes, the measuring jobs it must plan: one deployment and one block per engine,
# two repetitions each)
IDENTITY = {
    "an engine flag (vLLM)": (
        _flags("vllm", ["--max-num-seqs=128"]),
        {"deploy": 1, "run": 1, "telemetry": 2},
    ),
    "an engine image digest (SGLang)": (_image("sglang"), {"deploy": 1, "run": 1, "telemetry": 2}),
    "dispatch.request_timeout_s": (
        _set("dispatch", "request_timeout_s", value=120),
        {"deploy": 0, "run": 2, "telemetry": 4},
    ),
    "dispatch.warmup_requests": (
        _set("dispatch", "warmup_requests", value=3),
        {"deploy": 0, "run": 2, "telemetry": 4},
    ),
    "dispatch.client": (
        _set("dispatch", "client", value="httpx"),
        {"deploy": 0, "run": 2, "telemetry": 4},
    ),
    "campaign.success_threshold": (
        _set("campaign", "success_threshold", value=0.9),
        {"deploy": 0, "run": 2, "telemetry": 4},
    ),
    "telemetry.step_s": (
        _set("telemetry", "step_s", value=2.0),
        {"deploy": 0, "run": 2, "telemetry": 4},
    ),
}


@pytest.mark.parametrize("key", sorted(IDENTITY))
def test_an_identity_setting_re_measures_exactly_its_runs(campaign: Workdir, key: str) -> None:
    edit, expected = IDENTITY[key]
    jobs = planned(campaign, changed(campaign, edit))
    assert {rule: jobs.get(rule, 0) for rule in MEASURING} == expected, jobs


def test_the_unchanged_config_plans_nothing(campaign: Workdir) -> None:
    assert planned(campaign, copy.deepcopy(campaign.config)) == {}


def test_the_planned_block_is_the_one_whose_deployment_changed(campaign: Workdir) -> None:
    path = campaign.path / "config" / "changed.yaml"
    config = changed(campaign, _flags("vllm", ["--max-num-seqs=128"]))
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = campaign.snakemake("results/table5.csv", "--summary", f"--configfile={path}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
    pending = {row[0] for row in rows[1:] if row[-1] == "update pending"}
    blocks = {str(Path(f).parent) for f in pending if f.endswith("/block.json")}
    assert blocks == {"results/runs/defaults/vllm/rate-0.28"}, sorted(pending)
