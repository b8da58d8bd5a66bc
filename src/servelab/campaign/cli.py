"""`servelab campaign plan|status|redo`: a campaign's GPU-hours before, its runs' states during and
after, and the deliberate re-measurement of chosen runs (docs/campaigns.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from servelab.artifacts import write_text
from servelab.campaign.plan import TARGETS, format_plan, plan_campaign
from servelab.campaign.redo import redo_runs
from servelab.campaign.status import campaign_status, format_status, status_csv
from servelab.grid.config import add_config_arguments, load_config

__all__ = ["register"]


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return load_config(args.config, args.configfile)


def _plan(args: argparse.Namespace) -> int:
    print(format_plan(plan_campaign(_config(args), args.target, args.results)), end="")
    return 0


def _status(args: argparse.Namespace) -> int:
    rows = campaign_status(_config(args), args.results)
    if args.csv:
        write_text(args.csv, status_csv(rows))
    print(format_status(rows), end="")
    return 0


def _redo(args: argparse.Namespace) -> int:
    for redone in redo_runs(_config(args), args.results, args.run_ids, args.why):
        print(f"{redone.run_id}: moved {', '.join(redone.moved)} to {redone.folder}")
    print("the workflow measures these runs again at its next invocation", file=sys.stderr)
    return 0


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--results", default="results", help="results folder (default: results)")


def register(subparsers: Any) -> None:
    """Add `servelab campaign plan`, `status` and `redo`."""
    campaign = subparsers.add_parser("campaign", help="plan, status and redo of a campaign")
    sub = campaign.add_subparsers(dest="campaign_command", required=True)

    plan = sub.add_parser(
        "plan",
        help="the runs a target would measure, by deployment, and their GPU-hours",
        description="The runs of the target whose run.json is missing or not final, grouped by "
        "deployment: load (the conditions' duration_s), warm-ups, pauses and one start-up per "
        "deployment, summed into GPU-hours.",
    )
    _add_config_options(plan)
    plan.add_argument(
        "--target",
        default="table5",
        choices=list(TARGETS),
        help="what to plan for (default: table5; all: every run of the grid)",
    )
    plan.set_defaults(func=_plan)

    status = sub.add_parser(
        "status",
        help="every run of the grid: done, failed, discarded or missing",
        description="Every run of the grid with its state, attempts, node, wall time, reason "
        "and discards, read from the artifacts only.",
    )
    _add_config_options(status)
    status.add_argument("--csv", metavar="FILE", help="also write the table as CSV to FILE")
    status.set_defaults(func=_status)

    redo = sub.add_parser(
        "redo",
        help="move runs' measurements aside (never deleted) so the workflow measures them again",
        description="Moves each run's measured/, attempts/ and published files to "
        "results/redone/{arm}/{engine}/{condition}/{rep}/NNN/ with a reason.json.",
    )
    redo.add_argument(
        "run_ids", nargs="+", metavar="RUN_ID", help="{arm}/{engine}/{condition}/{rep}"
    )
    redo.add_argument("--why", required=True, help="why the runs are measured again (kept)")
    _add_config_options(redo)
    redo.set_defaults(func=_redo)
