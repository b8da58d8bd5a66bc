"""CPU time a fresh interpreter spends importing what each kind of process imports.

    .venv/bin/python benchmarks/import_cost.py [--repeat N] [--src DIR]

Every Snakemake invocation parses the Snakefile (whose rule helpers import servelab), and every job
starts a Python process that imports its script's modules; the test suite starts several hundred
of each. For each entry below: the median, over N fresh interpreters, of the user+system CPU the
child used (its imports and nothing else), and which heavy libraries it ended up holding.
`--src DIR` measures another checkout's `src/` (e.g. a `git worktree` of an older commit) with this
environment. docs/testing.md ("Where the time goes") records the figures with the machine.
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("pyarrow", "scipy.stats", "matplotlib", "pandas")

# (what imports it, the statement)
ENTRIES = (
    ("python alone", "pass"),
    ("the Snakefile's rule helpers (every snakemake call)", "SNAKEFILE"),
    ("job: a table", "from servelab.analysis import write_table"),
    ("job: a run's metrics", "from servelab.analysis.slo import write_run_metrics"),
    ("job: checksums", "from servelab.analysis import record_checksums"),
    ("job: the bundle", "from servelab.bundle.archive import write_bundle"),
    ("job: render manifests", "from servelab.campaign.deploy import render_manifests"),
    ("job: a run block", "from servelab.campaign.blocks import execute_block"),
    ("job: compile a trace", "from servelab.workload import compile_trace_files"),
    ("job: the figures", "from servelab.analysis import write_figures, figures"),
    ("servelab analyze --help", "import servelab.cli as c; c.build_parser('analyze')"),
)


def snakefile_imports() -> str:
    text = (REPO / "workflow" / "rules" / "common.smk").read_text()
    return "\n".join(
        ln for ln in text.splitlines() if ln.startswith(("import servelab", "from servelab"))
    )


def child_cpu(statement: str, env: dict[str, str]) -> tuple[float, list[str]]:
    code = f"import sys\n{statement}\nprint([m for m in {HEAVY!r} if m in sys.modules])"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, ast.literal_eval(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="fresh interpreters per entry")
    parser.add_argument("--src", type=Path, help="import servelab from DIR/src instead")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.src is not None:
        env["PYTHONPATH"] = str(args.src.resolve() / "src")
    print(
        f"machine: nproc {os.cpu_count()}, Python {platform.python_version()}, {args.repeat} runs"
    )
    print(f"{'median CPU':>10}  {'heavy modules held':<34} process")
    for label, statement in ENTRIES:
        stmt = snakefile_imports() if statement == "SNAKEFILE" else statement
        runs = [child_cpu(stmt, env) for _ in range(args.repeat)]
        cpu = statistics.median(c for c, _ in runs)
        held = ", ".join(runs[-1][1]) or "-"
        print(f"{cpu:9.2f}s  {held:<34} {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
