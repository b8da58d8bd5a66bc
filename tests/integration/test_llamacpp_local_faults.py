"""The local backend's faults against the real llama-server, through the campaign functions the
Snakemake rules call: the server killed mid-run ends the run as `interrupted` with every request
recorded, a server that never answers /health in time is refused naming the deployment, and a
measured start whose log disagrees with its start-up probe's is refused.

(The dispatcher's own faults against the real server, a request timeout and a server that
stops answering before the run, are in test_llamacpp_wire.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from campaigns import deploy_local, fault_config, local_results, run_killed_at

from servelab.artifacts import read_run_json
from servelab.deploy.local import LocalBackend, LocalError
from servelab.deploy.processes import alive
from servelab.grid import config as grid

pytestmark = pytest.mark.usefixtures("llama_server_program", "prometheus_program")

CONDITION = "rate-0.50"
KILL_AT_S = 3.0


@pytest.fixture(scope="module")
def config() -> dict:
    return fault_config("llamacpp.yaml")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, config: dict) -> Iterator[Path]:
    with local_results(tmp_path_factory.mktemp("llamacpp-faults"), config, CONDITION) as root:
        yield root


def _deployment(config: dict) -> dict:
    d = grid.deployment_for(config, "defaults", "llamacpp", CONDITION)
    return {
        "deployment_id": d.id,
        "arm": "defaults",
        "engine": "llamacpp",
        "flags": list(d.flags),
        "image": None,
        "port": config["engines"]["llamacpp"]["port"],
        "expect_chunked_prefill": d.expect_chunked_prefill,
        "expect_chunk_size": d.expect_chunk_size,
    }


def test_the_server_killed_mid_run_interrupts_the_run(results: Path, config: dict) -> None:
    dep = _deployment(config)
    deploy_local(results, config, dep)
    run_dir = run_killed_at(results, config, dep, CONDITION, KILL_AT_S)
    record = read_run_json(run_dir / "run.json")
    assert record["status"] == "interrupted"
    assert "server process (pid" in record["interrupted_reason"]
    assert "exited during the run" in record["interrupted_reason"]
    requests = pq.read_table(run_dir / "requests.parquet").to_pylist()
    trace_rows = pq.read_table(results / "traces" / CONDITION / "rep1" / "trace.parquet").num_rows
    measured = [r for r in requests if not r["warmup"]]
    assert len(measured) == trace_rows  # nothing lost: sent or not, every request has its row
    ok = [r for r in measured if r["status"] == "ok"]
    assert ok, "requests before the kill were served"
    assert all(r["chunk_times_s"][-1] <= KILL_AT_S + 1.0 for r in ok)
    unsent = [r for r in measured if r["sent_s"] is None]
    assert unsent and all("not sent" in r["error"] for r in unsent)
    assert {r["status"] for r in measured} <= {"ok", "error"}
    assert record["local"]["model_sha256"] and "llama-server" in record["local"]["server_command"]


def test_a_server_not_ready_in_time_is_refused_naming_the_deployment(
    results: Path, config: dict
) -> None:
    dep = {**_deployment(config), "deployment_id": "defaults-llamacpp-slowstart"}
    backend = LocalBackend(gpu=config["gpu"], model=config["model"], server_start_timeout_s=0.05)
    folder = results / "deployments" / dep["deployment_id"]
    with pytest.raises(
        LocalError, match=r"defaults-llamacpp-slowstart: server not up within 0.05 s"
    ):
        backend.start_server(dep, folder)


def test_a_measured_start_unlike_its_start_up_probe_is_refused(
    results: Path, config: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate reads the probe's log, so the measured server must show the same configuration:
    a probe started with other slots is refused, naming both logs, and no server is left."""
    import servelab.deploy.local as local

    def other_slots(engine: str, flags: list[str]) -> list[str]:
        return [*flags, "--parallel=2", "--log-verbosity=4"]

    monkeypatch.setattr(local, "startup_log_flags", other_slots)
    dep = {**_deployment(config), "deployment_id": "defaults-llamacpp-probe"}
    folder = results / "deployments" / dep["deployment_id"]
    backend = LocalBackend(gpu=config["gpu"], model=config["model"])
    with pytest.raises(LocalError, match=r"n_slots: probe 2, measured 4") as refused:
        backend.deploy(dep, manifest_path="", startup_log_path=str(folder / "startup.log"))
    assert str(folder / "server-startup.log") in str(refused.value)
    state = json.loads((folder / "local.json").read_text())
    assert not Path(f"/proc/{state['pid']}").exists() or not alive(
        state["pid"], local._server_marker(state)
    )
