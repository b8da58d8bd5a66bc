"""Wall time of one command, as JSON: the source of the figures that are a command's duration.

    .venv/bin/python benchmarks/command_wall.py [--env NAME=VALUE ...] -- make test-fast

Runs the command in the current folder, with its output passed through to stderr, and prints
{"wall_s": ..., "wall_min": ...} last; exits with the command's status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given (put it after --)")
    env = dict(os.environ)
    env.update(item.split("=", 1) for item in args.env)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=sys.stderr, check=False)
    wall = time.perf_counter() - start
    print(json.dumps({"wall_s": round(wall, 1), "wall_min": round(wall / 60.0, 2)}))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
