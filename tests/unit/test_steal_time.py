"""benchmarks/steal_time.py: the guest's steal time per CPU from a /proc/stat sampler's log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.benchmark_modules import load_benchmark

bench = load_benchmark("steal_time")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "steal_time.py"


def sample(t: float, steal0: int, steal1: int, cut: bool = False) -> str:
    lines = [f"T {t}", f"cpu  10 0 5 100 0 0 0 {steal0 + steal1} 0 0"]
    lines.append(f"cpu0 5 0 2 50 0 0 0 {steal0} 0 0")
    if not cut:  # cut: the sampler stopped before cpu1's line
        lines.append(f"cpu1 5 0 3 50 0 0 0 {steal1} 0 0")
    return "\n".join(lines)


LOG = "\n".join(
    [
        sample(0.0, 100, 40),
        sample(10.0, 100, 43),
        sample(20.0, 107, 43),
        sample(30.0, 109, 45, cut=True),
    ]
)


def test_each_cpu_counts_the_intervals_its_steal_rose_and_the_ticks() -> None:
    by_cpu = bench.steal_by_cpu(bench.read_samples(LOG))
    # cpu0 rose in the second and third intervals; cpu1 in the first, and the last sample
    # lacks it, so it has two intervals only
    assert by_cpu["cpu0"] == {"intervals": 3, "rose": 2, "ticks": 9, "seconds": 0.09}
    assert by_cpu["cpu1"] == {"intervals": 2, "rose": 1, "ticks": 3, "seconds": 0.03}
    assert by_cpu["cpu"] == {"intervals": 3, "rose": 3, "ticks": 14, "seconds": 0.14}


def test_a_line_that_is_not_the_samplers_is_named() -> None:
    with pytest.raises(ValueError, match=r"x\.log:2: neither"):
        bench.read_samples("T 0\nintr 5 6\n", "x.log")
    with pytest.raises(ValueError, match=r"x\.log:1: a cpu line before"):
        bench.read_samples("cpu0 1 2 3 4 5 6 7 8\n", "x.log")
    with pytest.raises(ValueError, match=r"x\.log:2: a cpu line without a steal"):
        bench.read_samples("T 0\ncpu0 1 2 3\n", "x.log")


def test_the_script_writes_its_figures(tmp_path: Path) -> None:
    log = tmp_path / "stat.log"
    log.write_text(LOG + "\n", "utf-8")
    out = tmp_path / "steal.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(log), "--json", str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "cpu1  steal rose in 1 of 2 intervals: 3 ticks" in run.stdout
    record = json.loads(out.read_text("utf-8"))
    assert record["samples"] == 4 and record["span_s"] == 30.0
    assert record["cpus"]["cpu0"]["rose"] == 2


SAMPLER = SCRIPT.parent / "proc_stat_sampler.sh"


def test_the_sampler_writes_samples_the_reader_takes_and_its_pid_to_its_pidfile(
    tmp_path: Path,
) -> None:
    out, pidfile = tmp_path / "stat.log", tmp_path / "sampler.pid"
    # its own process group, so that its `sleep` ends with it
    proc = subprocess.Popen(["sh", str(SAMPLER), str(out), str(pidfile)], start_new_session=True)
    try:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not (
            out.is_file() and "cpu0" in out.read_text("utf-8")
        ):
            time.sleep(0.05)
        assert int(pidfile.read_text().strip()) == proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the group this test started, by its PID
        proc.wait(timeout=10)
    ((_, steal),) = bench.read_samples(out.read_text("utf-8"), str(out))
    assert {"cpu", "cpu0"} <= steal.keys()


def test_the_sampler_without_its_arguments_says_how_to_call_it() -> None:
    run = subprocess.run(["sh", str(SAMPLER)], capture_output=True, text=True, timeout=10)
    assert run.returncode == 2 and "usage:" in run.stderr
