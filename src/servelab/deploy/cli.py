"""`servelab local stop`: stop every process the local backend started for a results folder."""

from __future__ import annotations

import argparse
from typing import Any

from servelab.deploy.local import stop_all

__all__ = ["register"]


def _local_stop(args: argparse.Namespace) -> int:
    stopped = stop_all(args.results)
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def register(subparsers: Any) -> None:
    """Add `servelab local stop`."""
    local = subparsers.add_parser("local", help="the local backend's processes")
    local_sub = local.add_subparsers(dest="local_command", required=True)
    stop = local_sub.add_parser(
        "stop", help="stop every sim server and Prometheus of a results folder"
    )
    stop.add_argument("--results", default="results", help="results folder (default: results)")
    stop.set_defaults(func=_local_stop)
