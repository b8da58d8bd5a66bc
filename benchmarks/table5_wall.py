"""Wall time of the main job, `snakemake --cores 1 results/table5.csv`, from nothing (sim backend).

Runs the real workflow in a scratch folder (so the repository's results/ is untouched), with the
study's config, and prints the total wall time and how many jobs of each rule ran.

    python benchmarks/table5_wall.py [--cores 1] [--target T] [--configfile F ...] [--keep DIR]
        [--json]

With --json the last line is {"wall_s": ..., "jobs": ...} (benchmarks/figures.py reads it).
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cores", default="1")
    parser.add_argument("--target", default="results/table5.csv")
    parser.add_argument("--keep", type=Path, help="run here and keep the results")
    parser.add_argument("--configfile", nargs="+", default=[], help="overlays, as snakemake's")
    parser.add_argument("--json", action="store_true", help="end with a JSON line")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="servelab-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    # what the configs name relative to the working directory: the overlays, and the trace files
    # a condition's `trace:` replays (config/ablations/real-trace.yaml reads data/traces/)
    for folder in ("config", "data"):
        shutil.copytree(REPO / folder, work / folder, dirs_exist_ok=True, symlinks=False)
    snakemake = Path(sys.executable).parent / "snakemake"
    start = time.perf_counter()
    proc = subprocess.run(
        [
            str(snakemake),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--cores",
            args.cores,
            args.target,
            *(["--configfile", *args.configfile] if args.configfile else []),
        ],
        cwd=work,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stderr[-5000:], file=sys.stderr)
        return proc.returncode
    counts = collections.Counter(
        re.findall(r"^Finished jobid: \d+ \(Rule: (\w+)\)$", proc.stderr, re.M)
    )
    print(f"target: {args.target}   cores: {args.cores}")
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}"
    )
    print(f"wall time: {wall:.1f} s")
    for rule, n in sorted(counts.items()):
        print(f"  {rule:<18} {n:>4} jobs")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"wall_s": round(wall, 1), "jobs": sum(counts.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
