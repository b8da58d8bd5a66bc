"""Wall time of the real rate sweep behind results/sim_vs_real.csv and of its simulation.

    make sim-vs-real          # the real sweep, the fit and the comparison (results/)
    .venv/bin/python benchmarks/sim_vs_real_wall.py [--json]

The real side is read from the run records the sweep wrote (nothing is re-measured): the span from
the first floor or loaded run's start to the last one's end (the campaign's wall time, deploys and
pauses between runs included) and the sum of the runs' own windows. The simulated side is timed
here: Snakemake re-runs the fit of the CPU platform and everything after it (`--forcerun
cpu_platform`: every predicted run and the comparison), with the real runs up to date. The
predicted side must come out byte-identical: the script compares every predicted file and the
comparison's outputs before and after, and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ("config/cpu-pair.yaml", "config/sim-vs-real.yaml")
SIMULATED = (
    "results/sim_vs_real/platform.json",
    "results/sim_vs_real.csv",
    "results/sim_vs_real.json",
    "results/sim_vs_real_waiting.csv",
    "results/figures/sim_vs_real.png",
)


def _records(root: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(root.glob("**/rep*/run.json"))]


def _digests(root: Path) -> dict[str, str]:
    files = [root / p for p in SIMULATED]
    files += sorted((root / "results" / "sim_vs_real" / "predicted").glob("**/*.*"))
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in files
        if p.is_file()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    results = REPO / "results"
    loaded = _records(results / "runs")
    floors = _records(results / "floor")
    if not loaded or not floors or not (results / "sim_vs_real.csv").is_file():
        raise SystemExit("results/: no sweep to time; run `make sim-vs-real` first")
    every = loaded + floors
    before = _digests(REPO)
    start = time.perf_counter()
    subprocess.run(
        [
            str(Path(sys.executable).parent / "snakemake"),
            "--cores",
            "1",
            "results/sim_vs_real.csv",
            "--forcerun",
            "cpu_platform",
            # the simulated side only: nothing before the fit runs, whatever else is out of date
            "--allowed-rules",
            "cpu_platform",
            "predict_run",
            "sim_vs_real",
            "--configfile",
            *CONFIGS,
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    simulate_s = time.perf_counter() - start
    after = _digests(REPO)
    figures = {
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "real_runs": len(loaded),
        "floor_runs": len(floors),
        "real_span_s": round(
            max(r["end_unix_s"] for r in every) - min(r["start_unix_s"] for r in every), 1
        ),
        "real_windows_s": round(sum(r["end_unix_s"] - r["start_unix_s"] for r in every), 1),
        "predicted_runs": sum(1 for k in after if k.endswith("/run.json") and "predicted" in k),
        "simulate_s": round(simulate_s, 1),
        "byte_identical": before == after,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for key, value in figures.items():
        print(f"{key:>16}: {value}")


if __name__ == "__main__":
    main()
