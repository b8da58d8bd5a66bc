"""What does a waiting request cost llama-server's passes, read from the floor's own queue?
(issue 26; docs/simulator.md, "An eighth measurement").

    .venv/bin/python benchmarks/llamacpp_floor_queue.py --results results [--json OUT]

With config `floor.warmup_requests_by_engine` giving llama.cpp more warm-ups than slots, each
floor run opens with a queue: the first warm-ups decode in the slots while the rest wait, and
every result the server sends wakes each held request's thread (servelab.sim.llamacpp, `_send`).
This reads every `ok` llama.cpp floor run under `--results`, orders its warm-ups by first token,
groups them into waves of one slot count (the slots the server resolved at start-up), and takes each wave's
median inter-token gap and the requests held when it began (the warm-ups not yet in an earlier
wave). The slope of a line through the waves, gap against requests held, divided by the results
a pass sends (one a decoding slot), is that run's cost of one wake-up. That count is the
client's: beside it is the most the server itself held at one of the run's scrapes, which was
far fewer until the warm-ups were spaced (fix 10: llama-server's HTTP pool takes a burst only
as far as it has idle threads). It prints the
slope per run, in the order the runs were made, and the median per arm.

Only the defaults arm's waves are clean: its warm-ups prefill together and then decode together.
The matched arm's waves overlap, prompt chunks sharing passes with decodes, so its slope mixes
the wake-ups with the scheduling (the fit replays that, and prices both: servelab.sim.cpu_fit).
Nothing is fitted here but the line.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_fit_stability import floor_runs


def resolved_slots(results: Path, record: dict[str, Any]) -> int:
    """The slots the run's llama-server resolved at start-up (its deployment's resolved.json,
    `facts.n_slots`, confirmed from the start-up log by the gate)."""
    path = results / "deployments" / str(record["deployment_id"]) / "resolved.json"
    facts = json.loads(path.read_text(encoding="utf-8")).get("facts") or {}
    if int(facts.get("n_slots") or 0) < 1:
        raise SystemExit(f"{path}: no facts.n_slots (not a llama-server deployment?)")
    return int(facts["n_slots"])


def waves(run_dir: Path, slots: int) -> list[tuple[int, float]]:
    """(requests held, median gap in seconds) of each wave of the run's warm-ups."""
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    warmups = sorted(
        (r for r in rows if r["warmup"] and r["status"] == "ok" and len(r["chunk_times_s"]) > 2),
        key=lambda r: r["chunk_times_s"][0],
    )
    out = []
    for first in range(0, len(warmups) - slots + 1, slots):
        wave = warmups[first : first + slots]
        gaps = [float(np.median(np.diff(r["chunk_times_s"][1:]))) for r in wave]
        out.append((len(warmups) - first, float(np.median(gaps))))
    return out


def server_held_most(run_dir: Path) -> int | None:
    """The most requests the server itself held at one scrape of the run (its scrape.parquet:
    `llamacpp:requests_processing` + `llamacpp:requests_deferred`), None without those series.
    The warm-ups the client sent are not all held: llama-server's HTTP pool takes a burst of
    connections only as far as it has idle threads (docs/simulator.md, "A tenth measurement")."""
    names = ("llamacpp:requests_processing", "llamacpp:requests_deferred")
    by_time: dict[float, float] = {}
    for row in pq.read_table(run_dir / "scrape.parquet").to_pylist():
        if row["source_metric"] in names:
            by_time[row["t_s"]] = by_time.get(row["t_s"], 0.0) + float(row["value"])
    return int(max(by_time.values())) if by_time else None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = [r for r in floor_runs(args.results) if r.engine == "llamacpp"]
    if not runs:
        raise SystemExit(f"{args.results}: no ok llama.cpp floor run")
    found: list[dict[str, Any]] = []
    for run in runs:
        record = json.loads((run.run_dir / "run.json").read_text(encoding="utf-8"))
        slots = resolved_slots(args.results, record)
        points = waves(run.run_dir, slots)
        if len(points) < 3:
            continue  # no queue to read: as many warm-ups as slots, or fewer
        held, gaps = np.array(points).T
        slope = float(np.polyfit(held, gaps, 1)[0])
        started = datetime.fromtimestamp(float(record["start_unix_s"]), tz=UTC)
        found.append(
            {
                "run": str(run.run_dir.relative_to(args.results)),
                "arm": run.arm,
                "started_utc": started.strftime("%Y-%m-%dT%H:%M:%S"),
                "waves": len(points),
                "first_wave_gap_ms": round(1e3 * gaps[0], 2),
                "last_wave_gap_ms": round(1e3 * gaps[-1], 2),
                "us_per_wakeup": round(1e6 * slope / slots, 2),
                "server_held_most": server_held_most(run.run_dir),
            }
        )
    found.sort(key=lambda f: f["started_utc"])
    print(
        f"{'run':82} {'waves':>5} {'first ms':>8} {'last ms':>8} {'µs a wake-up':>12} "
        f"{'server held':>11}"
    )
    for f in found:
        print(
            f"{f['run']:82} {f['waves']:>5} {f['first_wave_gap_ms']:>8} "
            f"{f['last_wave_gap_ms']:>8} {f['us_per_wakeup']:>12} {f['server_held_most']!s:>11}"
        )
    by_arm = {
        arm: round(float(np.median([f["us_per_wakeup"] for f in found if f["arm"] == arm])), 2)
        for arm in sorted({f["arm"] for f in found})
    }
    for arm, median in by_arm.items():
        print(f"{arm}: median {median} µs a wake-up")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"runs": found, "by_arm": by_arm}, indent=1) + "\n", encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
