"""`servelab` command line. Each concept registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import sys

from servelab import __version__

# Modules that expose `register(subparsers)`; each adds its own subcommands.
_COMMAND_MODULES = (
    "servelab.workload.cli",
    "servelab.engines.cli",
    "servelab.sim.cli",
    "servelab.dispatch.cli",
    "servelab.analysis.cli",
    "servelab.deploy.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servelab", description=__doc__)
    parser.add_argument("--version", action="version", version=f"servelab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:
        print(f"servelab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
