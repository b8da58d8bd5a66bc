"""`servelab local stop` finds every process the local backend could have left, wherever its state
file lies: the campaign's deployments, the floor's, a capacity search's (results/deployments/
capacity-*), and a Prometheus; it stops them by the PIDs their state files name, and only those.

The processes are stand-ins started here (a sleeping Python whose command line carries the marker
the backend checks before it signals a PID), so the test needs no server and no Prometheus."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from servelab.deploy.local_prometheus import PROMETHEUS_DIR
from servelab.deploy.processes import alive

BIN = Path(sys.executable).parent
SLEEP = "import time; time.sleep(120)"  # bounded: a stand-in outlives no test by long


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:  # only what this test started, by its own handle
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def stand_in(started: list, *marker: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", SLEEP, *marker])
    started.append(process)
    return process


def plant_server(started: list, deployment_dir: Path, instance_id: str) -> subprocess.Popen:
    process = stand_in(started, "--instance-id", instance_id)
    deployment_dir.mkdir(parents=True)
    state = {"pid": process.pid, "instance_id": instance_id, "deployment_id": deployment_dir.name}
    (deployment_dir / "local.json").write_text(json.dumps(state))
    return process


def test_local_stop_finds_campaign_floor_and_capacity_servers_and_prometheus(
    tmp_path: Path, started: list
) -> None:
    results = tmp_path / "results"
    deployments = results / "deployments"
    servers = {
        "campaign": plant_server(started, deployments / "defaults-vllm-1", "campaign-1"),
        "floor": plant_server(started, results / "floor" / "deployments" / "f-1", "floor-1"),
        "capacity": plant_server(
            started, deployments / "capacity-defaults-vllm-tiny" / "cap-1", "capacity-1"
        ),
    }
    prometheus_dir = deployments / PROMETHEUS_DIR
    prometheus_dir.mkdir()
    config = prometheus_dir / "prometheus.yml"
    config.write_text("")
    prometheus = stand_in(started, f"--config.file={config.resolve()}")
    (prometheus_dir / "prometheus.json").write_text(json.dumps({"pid": prometheus.pid}))
    # a process whose state file names it but whose command line is another's: never signalled
    bystander = stand_in(started, "--instance-id", "someone-else")
    other = deployments / "defaults-sglang-2"
    other.mkdir()
    (other / "local.json").write_text(json.dumps({"pid": bystander.pid, "instance_id": "x"}))

    done = subprocess.run(
        [str(BIN / "servelab"), "local", "stop", "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for name, process in servers.items():
        assert process.wait(timeout=10) is not None, name
        assert f"(pid {process.pid})" in done.stdout, (name, done.stdout)
    assert prometheus.wait(timeout=10) is not None
    assert f"prometheus (pid {prometheus.pid})" in done.stdout
    assert bystander.poll() is None and alive(bystander.pid, "someone-else")

    again = subprocess.run(
        [str(BIN / "servelab"), "local", "stop", "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "nothing was running" in again.stdout
