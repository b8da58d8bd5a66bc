"""The machine's load beside a real run on this machine, and the verdict whether another job shared
the cores the run was pinned to (docs/simulator.md, "Against the real engines").

On two cores the engine, the dispatcher and Prometheus share the machine. config `local` pins the
engine's process group to `engine_cpus` and the dispatcher and Prometheus to `client_cpus`
(`taskset` for the processes the backend starts, `sched_setaffinity` for the dispatcher itself).
A measurement is only the engine's own if nothing else ran on those cores, so the local backend
records, over the run's window:

- every core's busy time (Linux `/proc/stat`: user + nice + system + steal; interrupt and softirq
  time is left out: on loopback it is the kernel moving the run's own HTTP traffic, which no
  process is charged for, 16-20% of the client's core at 20 requests/s of streaming);
- the CPU time of the processes the run owns (`/proc/<pid>/stat` utime + stime): the engine's
  process group, and the dispatcher's process tree plus the results folder's Prometheus; a process
  of the tree that ended within the window (the dispatcher's pacer) is counted by the time the
  kernel added to this process's reaped children (`os.times`);
- per core set, the **foreign share**: (busy − owned) / (window × cores).

A run whose foreign share on either set exceeds `max_foreign_share` shared its cores with another
job: the backend marks it failed (retried, then recorded failed; never analysed as a measurement).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CpuSnapshot",
    "LoadWatch",
    "cpu_busy_ticks",
    "descendants",
    "foreign_share",
    "load_record",
    "process_ticks",
]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# /proc/stat cpuN columns: user nice system idle iowait irq softirq steal guest guest_nice; guest
# time is already counted in user (proc(5)); irq and softirq are left out (module docstring).
_BUSY_COLUMNS = (0, 1, 2, 7)


def cpu_busy_ticks(stat_text: str | None = None) -> dict[int, int]:
    """Busy clock ticks of every core since boot, from `/proc/stat` (or the text given)."""
    text = stat_text if stat_text is not None else Path("/proc/stat").read_text()
    busy: dict[int, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit():
            values = [int(v) for v in rest.split()]
            busy[int(name[3:])] = sum(values[i] for i in _BUSY_COLUMNS if i < len(values))
    return busy


def process_ticks(pids: Iterable[int]) -> dict[int, int]:
    """utime + stime (clock ticks, all threads) of each live process; vanished ones are left out."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state is field 3: fields[0]
        out[pid] = int(fields[11]) + int(fields[12])  # utime (14), stime (15)
    return out


def descendants(root: int) -> list[int]:
    """`root` and every live process below it (by parent pid, from /proc)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        parent[int(entry.name)] = int(fields[1])
    out, frontier = [root], [root]
    while frontier:
        current = frontier.pop()
        children = [pid for pid, ppid in parent.items() if ppid == current and pid not in out]
        out.extend(children)
        frontier.extend(children)
    return out


@dataclass(frozen=True)
class CpuSnapshot:
    """One reading: wall time, every core's busy ticks, and the owned processes' ticks by role."""

    monotonic_s: float
    busy: dict[int, int]
    owned: dict[str, dict[int, int]]  # role ("engine", "client") -> pid -> ticks
    # role -> CPU ticks of its processes that ended and were reaped (the client: os.times of
    # this process's children)
    reaped: dict[str, float] = field(default_factory=dict)


def foreign_share(
    first: CpuSnapshot, last: CpuSnapshot, cpus: Sequence[int], role: str
) -> dict[str, float]:
    """Busy, owned and foreign CPU time on `cpus` between two snapshots, as shares of the window
    (1.0 = every one of the cores busy the whole window). A process seen only in `last` counts
    from zero (it started within the window); one seen only in `first` is lost (it ended)."""
    window = max(last.monotonic_s - first.monotonic_s, 1e-9)
    capacity = window * len(cpus) * CLOCK_TICKS
    busy = sum(last.busy.get(c, 0) - first.busy.get(c, 0) for c in cpus)
    before, after = first.owned.get(role, {}), last.owned.get(role, {})
    owned: float = sum(ticks - before.get(pid, 0) for pid, ticks in after.items())
    # A process that ended in the window: its whole lifetime is in the reaped total, its ticks
    # before the window are not the window's.
    owned += last.reaped.get(role, 0.0) - first.reaped.get(role, 0.0)
    owned -= sum(ticks for pid, ticks in before.items() if pid not in after)
    return {
        "busy": round(busy / capacity, 4),
        "owned": round(owned / capacity, 4),
        "foreign": round(max(busy - owned, 0) / capacity, 4),
    }


def load_record(
    first: CpuSnapshot,
    last: CpuSnapshot,
    *,
    engine_cpus: Sequence[int],
    client_cpus: Sequence[int],
    max_foreign_share: float,
) -> dict[str, Any]:
    """What run.json keeps (`machine_load`), with `refused` naming the core set another job used;
    unpinned (no core sets), the load is recorded over every core and nothing is refused."""
    window = last.monotonic_s - first.monotonic_s
    all_cpus = sorted(last.busy)
    record: dict[str, Any] = {
        "window_s": round(window, 3),
        "loadavg": _loadavg(),
        "cpus": {str(c): _core_share(first, last, c) for c in all_cpus},
        "engine_cpus": list(engine_cpus),
        "client_cpus": list(client_cpus),
        "max_foreign_share": max_foreign_share,
        "refused": None,
    }
    if not engine_cpus or not client_cpus:
        return record
    reasons = []
    for role, cpus in (("engine", engine_cpus), ("client", client_cpus)):
        share = foreign_share(first, last, cpus, role)
        record[role] = share
        if share["foreign"] > max_foreign_share:
            reasons.append(
                f"{share['foreign']:.1%} of the {role} cores {','.join(map(str, cpus))} went to "
                f"other processes (limit {max_foreign_share:.0%} in config local.max_foreign_share)"
            )
    record["refused"] = "; ".join(reasons) or None
    return record


def _core_share(first: CpuSnapshot, last: CpuSnapshot, cpu: int) -> float:
    window = max(last.monotonic_s - first.monotonic_s, 1e-9)
    return round((last.busy.get(cpu, 0) - first.busy.get(cpu, 0)) / (window * CLOCK_TICKS), 4)


def _loadavg() -> list[float]:
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


@dataclass
class LoadWatch:
    """Snapshots at a run's start and end; `owned` gives the pids of each role when called."""

    owned: Callable[[], dict[str, Iterable[int]]]
    engine_cpus: Sequence[int] = ()
    client_cpus: Sequence[int] = ()
    max_foreign_share: float = 0.1
    _first: CpuSnapshot | None = field(default=None, init=False)

    def snapshot(self) -> CpuSnapshot:
        owned = {role: process_ticks(pids) for role, pids in self.owned().items()}
        times = os.times()
        reaped = {"client": (times.children_user + times.children_system) * CLOCK_TICKS}
        return CpuSnapshot(time.monotonic(), cpu_busy_ticks(), owned, reaped)

    def start(self) -> None:
        self._first = self.snapshot()

    def stop(self) -> dict[str, Any]:
        if self._first is None:
            raise RuntimeError("LoadWatch.stop before start")
        return load_record(
            self._first,
            self.snapshot(),
            engine_cpus=self.engine_cpus,
            client_cpus=self.client_cpus,
            max_foreign_share=self.max_foreign_share,
        )
