"""Two GPU nodes on the local backend (config campaign.gpu_nodes: 2), through the real workflow:
each deployment's server runs on its own node slot and port, the two blocks measure side by side
(their run windows overlap), and neither node's server is stopped by the other node's run. The
wall time and the artifacts against one node are the benchmark's (benchmarks/gpu_nodes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from campaigns import Workdir, assert_no_server_left
from test_local_cleanup import small_local_config

from servelab.deploy.processes import read_state
from servelab.grid.config import deployment_for, node_slots

pytestmark = pytest.mark.usefixtures("prometheus_program")


def test_two_nodes_serve_two_deployments_side_by_side(tmp_path: Path) -> None:
    config = small_local_config()
    config["campaign"]["gpu_nodes"] = 2
    slots = node_slots(config)
    assert sorted(slots.values()) == [0, 1]
    work = Workdir(tmp_path, config)
    done = work.snakemake("--cores", "3", "results/table5.csv", timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert_no_server_left(tmp_path)

    states = {
        p.parent.name: read_state(p)
        for p in (tmp_path / "results" / "deployments").glob("*/local.json")
    }
    assert set(states) == set(slots)
    assert len({s["port"] for s in states.values()}) == 2  # a port each
    for deployment, state in states.items():
        assert state["node_slot"] == f"node{slots[deployment]}"
        assert state["node_id"].startswith(f"local-node{slots[deployment]}-")

    windows = []
    for engine in config["arms"]["defaults"]["engines"]:
        run = tmp_path / "results" / "runs" / "defaults" / engine / "rate-1.00" / "rep1"
        record = json.loads((run / "run.json").read_text())
        slot = slots[deployment_for(config, "defaults", engine, "rate-1.00").id]
        assert record["status"] == "ok"
        assert record["node"]["start"]["node_id"].startswith(f"local-node{slot}-")
        # the other node's run did not stop this one's server: the node did not change
        assert record["node"]["start"] == record["node"]["end"]
        statuses = pq.read_table(run / "requests.parquet").column("status").to_pylist()
        assert set(statuses) == {"ok"}
        windows.append((record["start_unix_s"], record["end_unix_s"]))
    (s1, e1), (s2, e2) = windows
    assert s1 < e2 and s2 < e1, f"the two nodes' runs did not overlap: {windows}"
