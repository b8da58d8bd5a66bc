"""Many Python commands, each run in a fork of one interpreter that has imported their common
dependencies once.

The documented-commands test runs over two hundred Python commands in a safe form: the `--help` of
the scripts of benchmarks/ and of `servelab`'s subcommands. In a fresh interpreter each pays about
a second to import numpy, pyarrow, scipy and servelab before argparse prints a line, so those
imports cost minutes of CPU. Here one interpreter
imports them once (`PRELOADED`), then forks a child for each command. The child is the command's
own run in all that the check reads: it changes to the command's folder, puts the script's folder
first on sys.path and the arguments in sys.argv as the interpreter would, runs the script as
`__main__` (runpy), and exits with its exit status; its stdout and stderr go to one pipe. A command
that fails to import, or exits non-zero, fails as it would alone.

A command is `python SCRIPT ...` (argv[0] the interpreter) or a console script of the same
environment, such as `.venv/bin/servelab ...` (a Python file that imports and calls its entry
point). Not every program keeps to that: Snakemake sets up its logging when imported, so a dry run
forked after its import logs more than it does alone. Run as

    python tests/forked_runs.py < jobs.json > results.json

with the jobs a JSON list of {"cwd": ..., "argv": [...]} and the results the same list's
[exit status, output], in order. `run_forked` is the caller's side.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

# What the commands import most (the benchmarks, by a grep of benchmarks/*.py; servelab's entry
# point). A name that fails to import here is skipped: a command that needs it
# imports it itself, as it would alone.
PRELOADED = (
    "argparse",
    "numpy",
    "pyarrow",
    "pyarrow.parquet",
    "scipy.stats",
    "scipy.optimize",
    "servelab.analysis.sim_vs_real",
    "servelab.analysis.reduce",
    "servelab.grid.config",
    "servelab.sim.cpu_fit",
    "servelab.sim.run",
    "servelab.workload",
    "servelab.dispatch.client",
    "servelab.deploy.processes",
    "servelab.cli",
)
# The batch's own start and its imports, on top of the jobs' timeouts.
PRELOAD_ALLOWANCE_S = 120.0


def script_and_argv(argv: Sequence[str]) -> tuple[str, list[str]]:
    """The Python file a command runs, and its sys.argv: `python SCRIPT ARGS` runs SCRIPT with
    [SCRIPT, ARGS]; a console script runs itself with the whole command."""
    if Path(argv[0]).name.startswith("python"):
        return argv[1], list(argv[1:])
    return argv[0], list(argv)


def _child(cwd: str, argv: Sequence[str], write_fd: int) -> None:
    """In the forked child: run the command as the interpreter would, then exit with its status."""
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    status = 0
    try:
        os.chdir(cwd)
        script, sys.argv = script_and_argv(argv)
        sys.path[0] = str(Path(script).resolve().parent)
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code
        else:  # sys.exit("message"): printed, status 1
            print(code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing left to write
                stream.flush()
    os._exit(status & 0xFF)


def _run_one(cwd: str, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(cwd, argv, write_fd)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + timeout_s
    timed_out = False
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                os.kill(pid, signal.SIGKILL)  # our own child, by its pid
                break
            ready, _, _ = select.select([pipe], [], [], left)
            if ready:
                chunk = os.read(pipe.fileno(), 65536)
                if not chunk:
                    break
                chunks.append(chunk)
    _, wait_status = os.waitpid(pid, 0)
    output = b"".join(chunks).decode(errors="replace")
    if timed_out:
        return -1, output + f"\nTimeoutExpired: no exit within {timeout_s:g} s"
    return os.waitstatus_to_exitcode(wait_status), output


def main() -> int:
    jobs = json.load(sys.stdin)
    timeout_s = float(os.environ.get("FORKED_RUNS_TIMEOUT_S", "300"))
    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    results = [_run_one(job["cwd"], job["argv"], timeout_s) for job in jobs]
    sys.stdout.write(json.dumps(results))
    return 0


def run_forked(
    jobs: Sequence[tuple[Path, tuple[str, ...]]], *, interpreter: str, timeout_s: float
) -> list[subprocess.CompletedProcess[str]]:
    """Each (cwd, argv) run as above by one batch of `interpreter`, which must be the Python of
    every command; one CompletedProcess each, in order, its output in `stdout`. A failure of the
    batch itself (it died, or wrote no results) is every job's failure, with the batch's error."""
    if not jobs:
        return []
    payload = json.dumps([{"cwd": str(cwd), "argv": list(argv)} for cwd, argv in jobs])
    try:
        batch = subprocess.run(
            [interpreter, str(Path(__file__).resolve())],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout_s * len(jobs) + PRELOAD_ALLOWANCE_S,
            check=False,
            env={**os.environ, "FORKED_RUNS_TIMEOUT_S": str(timeout_s)},
        )
        results = json.loads(batch.stdout) if batch.returncode == 0 else None
        error = f"the forked batch exited {batch.returncode}: {batch.stderr[-2000:]}"
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as failure:
        results, error = None, f"the forked batch failed: {type(failure).__name__}: {failure}"
    if results is None or len(results) != len(jobs):
        return [subprocess.CompletedProcess(argv, -1, "", error) for _cwd, argv in jobs]
    return [
        subprocess.CompletedProcess(argv, int(code), output, "")
        for (_cwd, argv), (code, output) in zip(jobs, results, strict=True)
    ]


if __name__ == "__main__":
    sys.exit(main())
