"""`servelab analyze`: the whole analysis from a runs directory, plus checksum record / verify."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

from servelab.analysis.figdata import FORMATS
from servelab.analysis.pipeline import analyze
from servelab.analysis.restarts import discover_restart_records
from servelab.analysis.runs import discover_run_dirs
from servelab.analysis.verify import record_checksums, verify
from servelab.grid.config import add_config_arguments, analysis_settings, load_config
from servelab.grid.settings import AnalysisSettings

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="tables 3-6, figures 1 and 6-14 and numbers.json from run artifacts",
        description=(
            "Analyse every run under RUNS (results/runs/{arm}/{engine}/{condition}/{rep}) into "
            "--out: table3-6.csv, numbers.json, analysis_notes.txt, figures/figureN.{png,pdf}. "
            "With --verify, compare the outputs byte for byte with recorded checksums."
        ),
    )
    p.add_argument("runs", type=Path, help="runs directory, e.g. results/runs")
    p.add_argument("--out", type=Path, required=True, help="output directory (e.g. results)")
    p.add_argument("--traces", type=Path, help="trace directory (default: RUNS/../traces)")
    p.add_argument("--restarts", type=Path, help="restart records (default: RUNS/../restarts)")
    # the analysis settings, the engines and the tables' conditions
    add_config_arguments(p, default=None)
    p.add_argument(
        "--keeps-pace",
        type=float,
        help=f"keeps-pace threshold (default {AnalysisSettings.keeps_pace})",
    )
    p.add_argument(
        "--phi-guard",
        type=float,
        help=f"φ reported when |ln R̄_def| > ln GUARD (default {AnalysisSettings.phi_guard})",
    )
    p.add_argument("--keep-first-graph", action="store_true", help="do not exclude agent graph 0")
    p.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help="figure formats, comma-separated (default png,pdf; empty: tables and numbers only)",
    )
    p.add_argument(
        "--record-checksums", type=Path, metavar="FILE", help="write output checksums here"
    )
    p.add_argument(
        "--verify", type=Path, metavar="FILE", help="compare outputs with these checksums"
    )
    p.set_defaults(func=_run)


def _settings(args: argparse.Namespace) -> AnalysisSettings:
    """The configuration's analysis settings (without --config: the defaults), then the options."""
    settings = AnalysisSettings()
    if args.config is not None:
        config = load_config(args.config, args.configfile)
        settings = AnalysisSettings.from_mapping(analysis_settings(config))
    overrides: dict[str, Any] = {}
    if args.keeps_pace is not None:
        overrides["keeps_pace"] = args.keeps_pace
    if args.phi_guard is not None:
        overrides["phi_guard"] = args.phi_guard
    if args.keep_first_graph:
        overrides["exclude_first_graph"] = False
    return dataclasses.replace(settings, **overrides)


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run_dirs = discover_run_dirs(args.runs)
    traces = args.traces if args.traces is not None else args.runs.parent / "traces"
    restarts = args.restarts if args.restarts is not None else args.runs.parent / "restarts"
    manifests = sorted(traces.glob("*/*/manifest.json")) if traces.is_dir() else []
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(
            f"--formats: unsupported {', '.join(bad)} (choose from {', '.join(FORMATS)})"
        )
    result = analyze(
        run_dirs,
        args.out,
        manifests=manifests,
        restart_records=discover_restart_records(restarts),
        settings=_settings(args),
        formats=formats,
    )
    print(f"run logs: {result.found} found, {result.parsed} parsed, {result.skipped} skipped")
    print(f"wrote {len(result.outputs)} files under {args.out}")
    if result.notes:
        print(
            f"{len(result.notes)} cell(s) computed from fewer repetitions: see analysis_notes.txt"
        )
    if args.record_checksums is not None:
        digests = record_checksums(
            args.out, args.record_checksums, _relative(result.outputs, args.out)
        )
        print(f"recorded {len(digests)} checksums in {args.record_checksums}")
    if args.verify is not None:
        mismatches = verify(args.out, args.verify)
        for m in mismatches:
            print(f"MISMATCH {m}", file=sys.stderr)
        if mismatches:
            print(f"verify: {len(mismatches)} mismatch(es)", file=sys.stderr)
            return 1
        print(f"verify: every output matches {args.verify}")
    return 0


def _relative(paths: list[Path], root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in paths]
