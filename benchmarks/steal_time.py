"""The guest's steal time beside a measurement, from a /proc/stat sampler's log (issue 26;
docs/simulator.md, "A twenty-fifth measurement").

    .venv/bin/python benchmarks/steal_time.py LOG [--json OUT.json]

LOG is what benchmarks/proc_stat_sampler.sh writes: every 10 s a `T <unix time>` line, then
/proc/stat's cpu lines. Steal is a cpu line's eighth value: the time the hypervisor ran something
else while this virtual CPU wanted to run, in USER_HZ ticks (proc(5), /proc/stat, "steal"). Per
CPU (and `cpu`, all of them): the intervals between consecutive samples that both hold it, how
many saw its steal rise, and the ticks and seconds in all. A sample cut short (the sampler
stopped between its lines) counts only for the CPUs it holds.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

from servelab.artifacts import write_json

STEAL_FIELD = 7  # of the values after the cpu name: user nice system idle iowait irq softirq steal
USER_HZ = 100  # the tick of /proc/stat on Linux (proc(5): USER_HZ, 1/100 s on most architectures)


def read_samples(text: str, source: str = "log") -> list[tuple[float, dict[str, int]]]:
    """(unix time, steal ticks per cpu name) of each sample, in the log's order."""
    samples: list[tuple[float, dict[str, int]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "T":
            samples.append((float(parts[1]), {}))
        elif parts[0].startswith("cpu"):
            if not samples:
                raise ValueError(f"{source}:{number}: a cpu line before any `T` line")
            if len(parts) <= STEAL_FIELD + 1:
                raise ValueError(f"{source}:{number}: a cpu line without a steal value")
            samples[-1][1][parts[0]] = int(parts[STEAL_FIELD + 1])
        else:
            raise ValueError(f"{source}:{number}: neither a `T` line nor a cpu line: {line!r}")
    return samples


def steal_by_cpu(samples: list[tuple[float, dict[str, int]]]) -> dict[str, dict[str, Any]]:
    """Per cpu name: `intervals`, `rose` (intervals whose steal grew), `ticks` and `seconds`."""
    out: dict[str, dict[str, Any]] = {}
    for (_, before), (_, after) in itertools.pairwise(samples):
        for cpu in sorted(before.keys() & after.keys()):
            row = out.setdefault(cpu, {"intervals": 0, "rose": 0, "ticks": 0})
            grew = after[cpu] - before[cpu]
            row["intervals"] += 1
            row["rose"] += grew > 0
            row["ticks"] += grew
    for row in out.values():
        row["seconds"] = round(row["ticks"] / USER_HZ, 2)
    return dict(sorted(out.items()))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("log", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    samples = read_samples(args.log.read_text("utf-8"), str(args.log))
    if len(samples) < 2:
        raise SystemExit(f"{args.log}: {len(samples)} sample(s); an interval needs two")
    by_cpu = steal_by_cpu(samples)
    span = samples[-1][0] - samples[0][0]
    print(f"{len(samples)} samples over {span / 60:.1f} min")
    for cpu, row in by_cpu.items():
        print(
            f"{cpu:5s} steal rose in {row['rose']} of {row['intervals']} intervals: "
            f"{row['ticks']} ticks, {row['seconds']} s"
        )
    if args.json is not None:
        write_json(args.json, {"samples": len(samples), "span_s": round(span, 1), "cpus": by_cpu})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
