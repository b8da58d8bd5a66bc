"""vLLM's single-request decode passes on the engine's own clock, run by run: its floor before
the loaded runs, the loaded runs, its floor after (issue 26; docs/simulator.md, "Why vLLM's
passes run slower in the loaded runs").

    .venv/bin/python benchmarks/vllm_passes_by_run.py --trace /tmp/trace --results results \\
        [--json OUT]

Reads a traced deployment (benchmarks/vllm_trace/sitecustomize.py with `ec_update_in`; the
command in docs/benchmarks/sim-vs-real.md): every vLLM V1 run under the results folder's
floor/, runs/ and floor-after/ whose window holds logged steps. A run's steps are those that
start inside its window (run.json's start and end, placed on CLOCK_MONOTONIC by the logs'
`clock` lines). Of its back-to-back single-request decode steps (`lone_decodes`), a step is
*alone* when no other request's front end ran in its cycle (no `fe_in` or `fe_send` of another
request between its start and the next step's): the passes the witness and the floor's gaps
are made of. Per run, over its alone steps, the medians (ms) of the cycle and its parts
(`schedule`, `execute`: the forward pass and sampling, `update`, `between`), and of the API
server's `process_outputs` time falling in the cycle; and the same for the steps *during an
arrival*. The runs print in the order they were made.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_request_trace import (
    Event,
    Step,
    lone_decodes,
    read_events,
    steps_of,
    unix_minus_monotonic,
)

PARTS = ("cycle", "schedule", "execute", "update", "between", "outputs")
FRONT_END_KINDS = ("fe_in", "fe_send")


def run_dirs(results: Path) -> list[tuple[str, Path]]:
    """(kind, folder) of every vLLM V1 repetition: `floor` and `floor-after` (floor/…/runs/ARM/
    vllm_v1/FLOOR/repN) and `loaded` (runs/ARM/vllm_v1/CONDITION/repN)."""
    found = []
    for kind, pattern in (
        ("floor", "floor/*/runs/*/vllm_v1/*/rep*/run.json"),
        ("floor-after", "floor-after/*/runs/*/vllm_v1/*/rep*/run.json"),
        ("loaded", "runs/*/vllm_v1/*/rep*/run.json"),
    ):
        found += [(kind, p.parent) for p in sorted(results.glob(pattern))]
    return found


def classify(
    lone: Sequence[tuple[Step, dict[str, float]]], events: Sequence[Event]
) -> list[dict[str, Any]]:
    """Each lone decode step with its parts (s), `outputs` (the API server's process_outputs
    time inside its cycle, a call across its start or end counted for its part inside) and
    whether another request's front end ran in its cycle."""
    front = sorted((e.t, e.fields[0]) for e in events if e.kind in FRONT_END_KINDS)
    front_t = [t for t, _ in front]
    outputs: list[tuple[float, float]] = []
    opened: float | None = None
    for e in events:
        if e.kind == "fe_out":
            opened = e.t
        elif e.kind == "fe_out_done" and opened is not None:
            outputs.append((opened, e.t))
            opened = None
    out_starts = [a for a, _ in outputs]
    rows = []
    for step, parts in lone:
        stop = step.start + parts["cycle"]
        own = step.batch[0].rid
        i, j = bisect.bisect_left(front_t, step.start), bisect.bisect_right(front_t, stop)
        arrival = any(not own.startswith(rid) for _, rid in front[i:j])
        # the calls that overlap the cycle: one may have started in the cycle before
        k = max(bisect.bisect_left(out_starts, step.start) - 1, 0)
        m = bisect.bisect_right(out_starts, stop)
        busy = sum(max(0.0, min(b, stop) - max(a, step.start)) for a, b in outputs[k:m])
        rows.append({"start": step.start, "arrival": arrival, **parts, "outputs": busy})
    return rows


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians (ms) of each part over `rows`, and their count."""
    if not rows:
        return {"steps": 0}
    return {"steps": len(rows)} | {
        part: round(1e3 * statistics.median(r[part] for r in rows), 3) for part in PARTS
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    events = read_events(args.trace)
    offset = unix_minus_monotonic(events)
    rows = classify(lone_decodes(steps_of(events)), events)
    starts = [r["start"] for r in rows]
    runs = []
    for kind, folder in run_dirs(args.results):
        record = json.loads((folder / "run.json").read_text("utf-8"))
        lo = float(record["start_unix_s"]) - offset
        hi = float(record["end_unix_s"]) - offset
        mine = rows[bisect.bisect_left(starts, lo) : bisect.bisect_right(starts, hi)]
        if not mine:
            continue
        runs.append(
            {
                "kind": kind,
                "run": str(folder.relative_to(args.results)),
                "start_monotonic_s": round(lo, 3),
                "alone": summarise([r for r in mine if not r["arrival"]]),
                "during_arrival": summarise([r for r in mine if r["arrival"]]),
            }
        )
    runs.sort(key=lambda r: r["start_monotonic_s"])
    print(f"{'kind':11} {'run':60} {'n':>5} " + " ".join(f"{p:>8}" for p in PARTS))
    for r in runs:
        a = r["alone"]
        if not a["steps"]:
            continue
        cells = " ".join(f"{a[p]:>8.3f}" for p in PARTS)
        print(f"{r['kind']:11} {r['run'][-60:]:60} {a['steps']:>5} {cells}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs}, indent=1) + "\n", "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
