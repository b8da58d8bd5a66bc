"""Where a test run's CPU goes, by kind of process: Snakemake invocations, each rule's jobs, the
`servelab` commands, the pytest workers.

    .venv/bin/python benchmarks/suite_cpu.py [--keep LOG] [PYTEST ARGS ...]

Runs pytest (by default `make test`'s selection and workers) with a `sitecustomize` hook on
PYTHONPATH that every Python process of the run imports: at exit, each one appends its argv and
its own CPU time (user + system, `resource.getrusage`) to a log. A process killed by a signal
(a server the tests stop) writes nothing, so the total is a lower bound. Prints the CPU by kind,
largest first; docs/testing.md ("Where the time goes") records a run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTEST = ("-q", "-n", "3", "--dist", "loadgroup", "-m", "not engines", "tests")
HOOK = """
import atexit, json, os, resource, sys

def _log():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["SERVELAB_CPU_LOG"], "a") as log:
        log.write(json.dumps({"argv": sys.argv[:3], "cpu": usage.ru_utime + usage.ru_stime}) + "\\n")

atexit.register(_log)
"""


def kind(argv: list[str]) -> str:
    """A process's kind, from its argv: a Snakemake job is named by its rule's script."""
    line = " ".join(argv)
    job = re.search(r"\.snakemake/scripts/tmp\w+\.(\w+)\.py", line)
    if job:
        return f"job: {job.group(1)}"
    if argv and argv[0].endswith("snakemake"):
        return "snakemake"
    if argv and argv[0].endswith("servelab"):
        return f"servelab {argv[1] if len(argv) > 1 else ''}".rstrip()
    if argv and argv[0] == "-c":
        return "python -c (pytest workers and helpers)"
    return line[:70]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--keep", type=Path, help="keep the per-process log here")
    args, pytest_args = parser.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="servelab-suite-cpu-") as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(HOOK, encoding="utf-8")
        log = args.keep or Path(tmp) / "cpu.jsonl"
        log.unlink(missing_ok=True)
        env = {**os.environ, "SERVELAB_CPU_LOG": str(log.resolve())}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tmp, env.get("PYTHONPATH")]))
        wall0 = time.perf_counter()
        before = os.times()
        status = subprocess.run(
            [sys.executable, "-m", "pytest", *(pytest_args or DEFAULT_PYTEST)], cwd=REPO, env=env
        ).returncode
        after = os.times()
        wall = time.perf_counter() - wall0
        by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for line in log.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            entry = by_kind[kind(record["argv"])]
            entry[0] += 1
            entry[1] += record["cpu"]
    children = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    print(f"pytest exit {status}; wall {wall:.0f} s; CPU of the whole run {children:.0f} s")
    logged = sum(cpu for _, cpu in by_kind.values())
    print(
        f"logged by the hook: {logged:.0f} s over {sum(n for n, _ in by_kind.values())} processes"
    )
    for name, (count, cpu) in sorted(by_kind.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"{cpu:8.1f} s {int(count):5d}  {name}")
    return status


if __name__ == "__main__":
    sys.exit(main())
