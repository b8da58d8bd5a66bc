"""No process the local backend starts outlives the workflow, whatever the target and however the
workflow ends; and `servelab local stop` finds every one a killed workflow leaves.

The local backend starts its engine servers and one Prometheus as detached processes (they outlive
the job that started them, so the next run finds them up), with a state file each under
`results/` (servelab.deploy.local). The Snakefile's end handlers stop them all when the workflow
succeeds or fails, and a Ctrl-C (SIGINT to the workflow's process group) ends it through the error
handler; a SIGKILL runs no handler, and `servelab local stop` is the way out. Each case here runs
the real Snakefile on the local backend (the simulated engines behind a live server, a real
Prometheus), on a small grid: one short condition of short prompts and answers.

Each target puts its deployments in its own place (the campaign's and the floor's under
results/deployments/, the capacity search's under results/deployments/capacity-*), and each outcome
leaves by another door: `all` (which holds table5 and the floor) succeeds, table5 fails (a refused
deployment), a floor run and a capacity probe are interrupted, and a table5 run is killed.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from campaigns import Workdir, study_config

from servelab.deploy.local import _server_marker
from servelab.deploy.local_prometheus import PROMETHEUS_DIR
from servelab.deploy.processes import alive as process_alive
from servelab.deploy.processes import read_state

BIN = Path(sys.executable).parent
WAIT_S = 300
CONDITION = "rate-1.00"

pytestmark = pytest.mark.usefixtures("prometheus_program")


def small_local_config() -> dict[str, Any]:
    """The defaults arm of both simulated engines on one 5 s condition of 256-token prompts and
    answers of at most 16 tokens, one repetition, floors of 4 requests."""
    cfg = copy.deepcopy(study_config())
    cfg["backend"] = "local"
    cfg["repetitions"] = 1
    cfg["conditions"] = [
        {"sweep": "rate", "rate": 1.0, "sharing": 0.5, "prompt_tokens": 256, "duration_s": 5}
    ]
    cfg["arms"] = {"defaults": cfg["arms"]["defaults"]}
    cfg["workload"]["max_tokens"] = {"planner": 8, "worker": 8, "aggregator": 16}
    cfg["dispatch"].update(warmup_requests=1, request_timeout_s=60, health_timeout_s=60)
    cfg["campaign"].update(faults=[], retries=0, pause_between_runs_s=0)
    cfg["floor"] = {"requests": 4, "repetitions": 1}
    cfg["analysis"]["table_conditions"] = [CONDITION]
    cfg["telemetry"]["step_s"] = 1
    return cfg


CAPACITY = {
    "shapes": [{"name": "small", "sharing": 0.5, "prompt_tokens": 256, "duration_s": 5}],
    "bracket": [0.5, 1.0],
    "tolerance": 0.9,
    "max_probes": 2,
    "keeps_pace": 0.5,
    "limits": {"ttft_p99_s": 30.0},
}


def started_processes(results: Path) -> list[tuple[str, int, str]]:
    """(state file, pid, marker) of every process the backend recorded under `results`."""
    found = []
    for state_path in sorted(results.rglob("local.json")):
        state = read_state(state_path)
        if state and state.get("pid"):
            found.append((str(state_path), int(state["pid"]), _server_marker(state)))
    for state_path in sorted(results.rglob(f"{PROMETHEUS_DIR}/prometheus.json")):
        state = read_state(state_path)
        config_path = str((state_path.parent / "prometheus.yml").resolve())
        if state and state.get("pid"):
            found.append((str(state_path), int(state["pid"]), config_path))
    return found


def alive(results: Path) -> list[tuple[str, int, str]]:
    return [entry for entry in started_processes(results) if process_alive(entry[1], entry[2])]


def _as_a_terminal_starts_it() -> None:
    """A shell starts a foreground job with SIGINT deliverable. A test process may not have it
    so (a signal ignored or blocked is inherited across fork and exec, and Python installs its
    KeyboardInterrupt handler only where SIGINT is not ignored): reset it, as a terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def start(work: Workdir, *targets: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        work.command(*targets),
        cwd=work.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the Ctrl-C reaches its jobs too
        preexec_fn=_as_a_terminal_starts_it,
    )


def wait_for(path_glob: str, work: Workdir, process: subprocess.Popen[str]) -> None:
    """Until a file matching `path_glob` exists under the workdir (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if list(work.path.glob(path_glob)):
            return
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        time.sleep(0.2)
    raise AssertionError(f"{path_glob} did not appear within {WAIT_S} s")


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=30)
        raise
    return process.returncode, output


def ended_clean(work: Workdir) -> None:
    results = work.path / "results"
    started = started_processes(results)
    assert started, "the workflow started no server: nothing was tested"
    assert alive(results) == []


def test_all_succeeds_and_leaves_no_process(tmp_path: Path) -> None:
    """`all` holds table5 and the floor: the campaign's and the floor's runs, on both engines."""
    work = Workdir(tmp_path, small_local_config())
    code, output = finish(start(work, "all"))
    assert code == 0, output[-4000:]
    ended_clean(work)
    assert (work.path / "results" / "floor.csv").is_file()
    servers = {Path(p).parent.name for p, _, _ in started_processes(work.path / "results")}
    assert {s.split("-")[1] for s in servers if s != PROMETHEUS_DIR} == {"vllm", "sglang"}


def test_a_workflow_that_fails_leaves_no_process(tmp_path: Path) -> None:
    """table5 with an arm neither engine resolves: each deployment is refused after its server
    was started (the gate reads the running server's log), so no run is measured."""
    config = small_local_config()
    for engine in ("vllm", "sglang"):
        config["arms"]["defaults"]["engines"][engine]["expect"] = {
            "chunked_prefill": True,
            "chunk_size": 512,
        }
    work = Workdir(tmp_path, config)
    code, output = finish(start(work, "results/table5.csv"))
    assert code != 0
    assert "ResolvedConfigMismatch" in output
    ended_clean(work)


@pytest.mark.parametrize(
    ("target", "running"),
    [
        ("results/floor.csv", "results/logs/floor/defaults-*/*/*/*.log"),
        ("results/capacity.csv", "results/logs/capacity/*/step-0.log"),
    ],
)
def test_an_interrupted_workflow_leaves_no_process(
    tmp_path: Path, target: str, running: str
) -> None:
    """Ctrl-C (SIGINT to the workflow's process group) while a floor run or a capacity probe is
    dispatching: the capacity search's deployments lie apart (results/deployments/capacity-*)."""
    config = small_local_config()
    config["capacity"] = copy.deepcopy(CAPACITY)
    work = Workdir(tmp_path, config)
    process = start(work, target)
    wait_for(running, work, process)
    wait_for("results/deployments/*/local.json", work, process)
    time.sleep(1.0)
    os.killpg(process.pid, signal.SIGINT)
    code, output = finish(process)
    assert code != 0, output[-4000:]
    ended_clean(work)
    if target == "results/capacity.csv":
        deployments = {Path(p).parent.name for p, _, _ in started_processes(work.path / "results")}
        assert any(d.startswith("capacity-") for d in deployments), deployments


def test_local_stop_ends_what_a_killed_workflow_left(tmp_path: Path) -> None:
    """SIGKILL runs no handler: the servers and Prometheus stay up until `servelab local stop`."""
    work = Workdir(tmp_path, small_local_config())
    process = start(work, "results/table5.csv")
    wait_for(f"results/deployments/{PROMETHEUS_DIR}/prometheus.json", work, process)
    wait_for("results/deployments/*/local.json", work, process)
    wait_for("results/logs/runs/defaults/*/*.log", work, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)
    results = work.path / "results"
    left = alive(results)
    assert left, "a killed workflow left nothing running: nothing was tested"
    stop = subprocess.run(
        [str(BIN / "servelab"), "local", "stop", "--results", "results"],
        cwd=work.path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stop.returncode == 0, stop.stderr
    for state_path, pid, _ in left:
        assert f"pid {pid}" in stop.stdout + stop.stderr, (state_path, stop.stdout)
    assert alive(results) == []
    # a second call finds nothing left
    again = subprocess.run(
        [str(BIN / "servelab"), "local", "stop", "--results", "results"],
        cwd=work.path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "nothing was running" in again.stdout
