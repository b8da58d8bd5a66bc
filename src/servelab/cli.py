"""`servelab` command line. Each concept registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import sys

from servelab import __version__

# Which module registers each subcommand (its `register(subparsers)` adds them). Only the module of
# the command being run is imported, so `servelab resolve-config` does not pay for matplotlib.
COMMANDS = {
    "trace": "servelab.workload.cli",
    "resolve-config": "servelab.engines.cli",
    "sim": "servelab.sim.cli",
    "serve-sim": "servelab.sim.cli",
    "dispatch": "servelab.dispatch.cli",
    "local": "servelab.deploy.cli",
    "analyze": "servelab.analysis.cli",
    "table": "servelab.analysis.show",
    "campaign": "servelab.campaign.cli",
    "bundle": "servelab.bundle.cli",
    "verify": "servelab.bundle.cli",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or only `command`'s module's when it is known."""
    parser = argparse.ArgumentParser(prog="servelab", description=__doc__)
    parser.add_argument("--version", action="version", version=f"servelab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = [COMMANDS[command]] if command in COMMANDS else COMMANDS.values()
    for name in dict.fromkeys(modules):
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:
        print(f"servelab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
