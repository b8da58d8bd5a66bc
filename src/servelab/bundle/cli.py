"""`servelab bundle` and `servelab verify`: one campaign in one file, verified elsewhere."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from servelab.grid.config import add_config_arguments

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bundle",
        help="one campaign's results, configuration and provenance as one .tar.gz",
        description=(
            "Write every file of the campaign of --config found under --results (traces, "
            "deployments, runs, discarded and superseded measurements, tables, figures, "
            "numbers, checksums) with bundle.json (provenance and the SHA-256 of every member) "
            "as one deterministic gzip tar: the same results give the same bytes."
        ),
    )
    p.add_argument("--results", type=Path, required=True, help="results directory, e.g. results")
    add_config_arguments(p)  # the campaign's configuration, merged as the workflow merged it
    p.add_argument("--out", type=Path, required=True, help="the bundle to write (FILE.tar.gz)")
    p.set_defaults(func=_bundle)

    v = subparsers.add_parser(
        "verify",
        help="check a bundle and regenerate its analysis byte for byte",
        description=(
            "Extract BUNDLE into a fresh folder, refuse it unless every member matches "
            "bundle.json, regenerate every table, figure, number and notes file from its runs "
            "with its recorded analysis settings and compare byte for byte. Exit 0 when every "
            "output is identical, 1 otherwise (each differing or missing file is named)."
        ),
    )
    v.add_argument("bundle", type=Path, help="a bundle written by `servelab bundle`")
    v.add_argument(
        "--workdir",
        type=Path,
        help="extract and regenerate here (empty or new; kept); default a temporary folder",
    )
    v.set_defaults(func=_verify)


def _bundle(args: argparse.Namespace) -> int:
    from servelab.bundle.archive import write_bundle
    from servelab.grid.config import load_config

    out = write_bundle(args.results, load_config(args.config, args.configfile), args.out)
    print(f"bundle written: {out} ({out.stat().st_size} bytes)")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from servelab.bundle.archive import BundleError, verify_bundle

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        report = verify_bundle(args.bundle, args.workdir)
    except BundleError as exc:
        print(f"servelab verify: {exc}", file=sys.stderr)
        return 1
    print(report.render(), end="")
    return 0 if report.ok else 1
