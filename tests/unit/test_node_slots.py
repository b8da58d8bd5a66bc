"""N GPU nodes (config campaign.gpu_nodes): each deployment pinned to one node slot, balanced by
the arrival time it measures; the slot is operational, and each backend names its node by it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from campaigns import study_config

from servelab.deploy import NodeSlot
from servelab.grid.config import (
    ConfigError,
    conditions,
    deployment_for,
    gpu_nodes,
    node_slot,
    node_slots,
    runs,
    validate_config,
)
from servelab.grid.identity import operational_settings, run_identity
from servelab.sim.run import node_identity


def with_nodes(config: dict[str, Any], n: int) -> dict[str, Any]:
    out = copy.deepcopy(config)
    out["campaign"]["gpu_nodes"] = n
    return out


def measured_s(config: dict[str, Any]) -> dict[str, float]:
    """The arrival time each deployment measures: the sum of its runs' durations."""
    cond = conditions(config)
    out: dict[str, float] = {}
    for run in runs(config):
        d = deployment_for(config, run.arm, run.engine, run.condition).id
        out[d] = out.get(d, 0.0) + cond[run.condition].duration_s
    return out


def test_one_node_is_the_default_and_takes_every_deployment() -> None:
    study = study_config()
    assert gpu_nodes(study) == 1
    slots = node_slots(study)
    assert set(slots) == set(measured_s(study))
    assert set(slots.values()) == {0}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_slots_balance_the_measured_time_longest_first(n: int) -> None:
    config = with_nodes(study_config(), n)
    slots = node_slots(config)
    load = measured_s(config)
    per_slot = [sum(load[d] for d, k in slots.items() if k == slot) for slot in range(n)]
    assert all(0 <= k < n for k in slots.values())
    # Longest-processing-time greedy: no slot exceeds the mean by more than the longest single
    # deployment (a bound a round-robin or a one-slot assignment breaks on the study's grid).
    assert max(per_slot) <= sum(per_slot) / n + max(load.values())
    # and every slot measures something while there are at least as many deployments as slots
    assert all(t > 0 for t in per_slot[: min(n, len(load))])
    # the longest deployment goes first, to slot 0
    assert slots[max(load, key=lambda d: load[d])] == 0


def test_the_assignment_depends_only_on_the_grid_and_n() -> None:
    config = with_nodes(study_config(), 3)
    other = copy.deepcopy(config)
    other["campaign"]["retries"] = 7  # an operational change elsewhere moves nothing
    other["kubernetes"] = {"namespace": "elsewhere"}
    assert node_slots(config) == node_slots(other)
    assert node_slots(config) == node_slots(copy.deepcopy(config))


def test_a_deployment_outside_the_grid_hashes_to_a_slot() -> None:
    config = with_nodes(study_config(), 3)
    seen = {node_slot(config, f"capacity-search-{k}") for k in range(30)}
    assert seen == {0, 1, 2}
    assert node_slot(config, "capacity-a") == node_slot(copy.deepcopy(config), "capacity-a")


def test_the_node_count_is_operational_never_identity() -> None:
    one, three = study_config(), with_nodes(study_config(), 3)
    run = {"arm": "defaults", "engine": "vllm", "condition": "rate-0.12", "offered_load_rps": 1.0}
    assert run_identity(one, run) == run_identity(three, run)
    assert operational_settings(three)["campaign"]["gpu_nodes"] == 3


def test_node_slot_refuses_a_slot_outside_its_count() -> None:
    assert NodeSlot().name == "node0"
    assert NodeSlot(2, 3).name == "node2"
    for index, count in ((3, 3), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="node slot"):
            NodeSlot(index, count)


def test_local_pinning_and_several_nodes_are_refused_together() -> None:
    config = with_nodes(study_config(), 2)
    config["backend"] = "local"
    config["local"] = {"engine_cpus": [1], "client_cpus": [0]}
    with pytest.raises(ConfigError, match=r"campaign\.gpu_nodes.*local\.engine_cpus"):
        validate_config(config)
    config["campaign"]["gpu_nodes"] = 1
    validate_config(config)


def test_the_sim_names_one_node_as_before_and_several_by_slot() -> None:
    assert node_identity("L4", 0)["name"] == "sim-l4-node-0"
    assert node_identity("L4", 1, None)["name"] == "sim-l4-node-1"
    two = node_identity("L4", 0, "node1")
    assert two["name"] == "sim-l4-node1-0"
    assert two["uid"] != node_identity("L4", 0)["uid"]
