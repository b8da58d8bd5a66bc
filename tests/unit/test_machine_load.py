"""The machine's load beside a real run: per-core busy time from /proc/stat, the CPU time of the
processes the run owns, and the refusal of a run whose pinned cores another job shared."""

from __future__ import annotations

import os
import time

import pytest

from servelab.deploy.machine_load import (
    CLOCK_TICKS,
    CpuSnapshot,
    LoadWatch,
    cpu_busy_ticks,
    descendants,
    foreign_share,
    load_record,
    process_ticks,
)
from servelab.deploy.processes import pinned
from servelab.grid.identity import deployment_identity

STAT = """cpu  100 0 50 1000 5 0 0 0 0 0
cpu0 60 0 30 500 5 0 0 0 0 0
cpu1 40 2 20 500 0 1 1 3 7 0
intr 12345
"""


def test_busy_ticks_are_read_per_core_without_idle_iowait_interrupts_or_guest() -> None:
    # cpu1: user 40 + nice 2 + system 20 + steal 3 (guest 7 is in user; irq and softirq out)
    assert cpu_busy_ticks(STAT) == {0: 90, 1: 65}


def test_a_process_that_ended_in_the_window_is_counted_from_its_reaped_time() -> None:
    ticks = CLOCK_TICKS
    # the pacer (pid 21) ran 1 s before the window and 2 s in it, then ended and was reaped
    first = CpuSnapshot(0.0, {0: 0}, {"client": {20: 0, 21: ticks}}, {"client": 0.0})
    last = CpuSnapshot(10.0, {0: 4 * ticks}, {"client": {20: ticks}}, {"client": 3.0 * ticks})
    assert foreign_share(first, last, [0], "client") == {"busy": 0.4, "owned": 0.3, "foreign": 0.1}


def snapshot(t: float, busy: dict[int, int], engine: dict[int, int], client: dict[int, int]):
    return CpuSnapshot(t, busy, {"engine": engine, "client": client})


def test_foreign_time_is_busy_time_the_run_does_not_own() -> None:
    ticks = CLOCK_TICKS
    first = snapshot(0.0, {0: 0, 1: 0}, {10: 0, 11: 5}, {20: 0})
    # 10 s window: core 1 busy 8 s, of which the engine's two processes 3 s + 2 s; a process
    # that started in the window (12) counts from zero: 1 s.
    last = snapshot(
        10.0,
        {0: 2 * ticks, 1: 8 * ticks},
        {10: 3 * ticks, 11: 5 + 2 * ticks, 12: ticks},
        {20: 2 * ticks},
    )
    engine = foreign_share(first, last, [1], "engine")
    assert engine == {"busy": 0.8, "owned": 0.6, "foreign": 0.2}
    assert foreign_share(first, last, [0], "client") == {"busy": 0.2, "owned": 0.2, "foreign": 0.0}


def test_a_run_that_shared_its_cores_is_refused_naming_them() -> None:
    ticks = CLOCK_TICKS
    first = snapshot(0.0, {0: 0, 1: 0}, {10: 0}, {20: 0})
    last = snapshot(10.0, {0: 1 * ticks, 1: 9 * ticks}, {10: 6 * ticks}, {20: ticks})
    refused = load_record(first, last, engine_cpus=[1], client_cpus=[0], max_foreign_share=0.1)
    assert refused["engine"]["foreign"] == pytest.approx(0.3)
    assert "30.0% of the engine cores 1 went to other processes" in refused["refused"]
    assert "local.max_foreign_share" in refused["refused"]
    kept = load_record(first, last, engine_cpus=[1], client_cpus=[0], max_foreign_share=0.35)
    assert kept["refused"] is None
    assert kept["cpus"] == {"0": 0.1, "1": 0.9}


def test_an_unpinned_run_records_the_load_and_refuses_nothing() -> None:
    ticks = CLOCK_TICKS
    first = snapshot(0.0, {0: 0, 1: 0}, {}, {})
    last = snapshot(10.0, {0: 10 * ticks, 1: 10 * ticks}, {}, {})
    record = load_record(first, last, engine_cpus=(), client_cpus=(), max_foreign_share=0.1)
    assert record["refused"] is None and "engine" not in record
    assert record["cpus"] == {"0": 1.0, "1": 1.0}


def test_the_watch_counts_this_process_as_owned() -> None:
    me = os.getpid()
    watch = LoadWatch(lambda: {"engine": [], "client": descendants(me)})
    first = watch.snapshot()
    watch.start()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # bounded: 0.3 s of this process's CPU
        pass
    record = watch.stop()
    last = watch.snapshot()
    # the 0.3 s this process spent is counted as its own (at least 0.25 s of clock ticks)
    assert last.owned["client"][me] - first.owned["client"][me] >= 0.25 * CLOCK_TICKS
    assert process_ticks([me])[me] >= last.owned["client"][me]
    assert record["window_s"] >= 0.25
    assert set(record["cpus"]) == {str(c) for c in cpu_busy_ticks()}


def test_pinning_wraps_the_command_in_taskset_only_when_cores_are_named() -> None:
    assert pinned(["llama-server", "-m", "x"], [1]) == [
        "taskset",
        "--cpu-list",
        "1",
        "llama-server",
        "-m",
        "x",
    ]
    assert pinned(["llama-server"], []) == ["llama-server"]


def test_pinning_is_part_of_a_local_deployments_identity_only_when_set() -> None:
    base = {
        "backend": "local",
        "gpu": {"name": "CPU", "memory_mib": 24000},
        "model": {"name": "m", "dtype": "float32", "max_model_len": 8192},
    }
    deployment = {"deployment_id": "d", "engine": "llamacpp", "flags": []}
    assert "local" not in deployment_identity(base, deployment)
    pinned_config = {**base, "local": {"engine_cpus": [1], "client_cpus": [0]}}
    assert deployment_identity(pinned_config, deployment)["local"] == {
        "engine_cpus": (1,),
        "client_cpus": (0,),
        "max_foreign_share": 0.1,
    }
    assert "local" not in deployment_identity({**pinned_config, "backend": "sim"}, deployment)
