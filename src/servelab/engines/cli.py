"""`servelab resolve-config LOGFILE [--engine NAME]`: what an engine resolved, from its log.

Prints one JSON object (docs/engines.md "Reading what an engine resolved"). Exit codes: 0 parsed
(an excerpt of no telling release family too, when every candidate family reads it the same way:
"engine" and "family" null, "open_families" the candidates, "note" says so); 2 unreadable file, a
text from no registered engine, or an excerpt its candidate families would read differently (a
message on stderr says which, and how).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from servelab.engines.logparse import UnknownEngineLog, engine_titles, parse_startup_log
from servelab.engines.registry import engine_names, engine_spec

__all__ = ["register", "resolve_config_main"]

EXIT_OK = 0
EXIT_ERROR = 2


def resolve_config_main(args: argparse.Namespace) -> int:
    path = Path(args.logfile)
    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        print(f"servelab resolve-config: cannot read {path}: {reason}", file=sys.stderr)
        return EXIT_ERROR
    text = data.decode("utf-8", errors="replace")
    try:
        parsed = parse_startup_log(text, engine=args.engine, family_open=True)
    except UnknownEngineLog as exc:
        print(f"servelab resolve-config: {path}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if parsed.open_families:
        # An excerpt whose family the text cannot tell, read the same way by every candidate.
        out = {**parsed.to_dict(), "engine": None, "product": parsed.engine, "family": None}
        names = " and ".join(parsed.open_families)
        out["note"] = (
            f"release family left open: the log shows none of the lines that tell {names} "
            "apart, and each of them reads the lines shown the same way"
        )
    else:
        spec = engine_spec(parsed.engine)
        # The release family the log was read as (detected from the text unless --engine named it).
        out = {**parsed.to_dict(), "product": spec.product, "family": spec.family or None}
    sys.stdout.write(json.dumps(out, sort_keys=True, indent=2, ensure_ascii=False) + "\n")
    return EXIT_OK


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "resolve-config",
        help=f"print the configuration a {engine_titles()} start-up log shows (JSON)",
        description=(
            f"Read a {engine_titles()} start-up log and print one JSON object: the engine (release "
            "family) detected from the text, its product and family, version, chunked_prefill, "
            "chunk_size, prefix_caching, context_len, schedule_policy (null when the log does not "
            "show them) and the evidence lines they came from."
        ),
    )
    p.add_argument("logfile", help="the engine's start-up log (text)")
    p.add_argument(
        "--engine",
        choices=engine_names(),
        default=None,
        help="the engine (release family) that wrote the log (default: detected from the text)",
    )
    p.set_defaults(func=resolve_config_main)
