"""`servelab trace compile|validate|show|export|import`: the trace compiler, validator, peer
export and production-trace import outside Snakemake."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from servelab.artifacts import TRACE_SCHEMA, read_parquet, read_trace_manifest
from servelab.grid.config import add_config_arguments, load_config
from servelab.workload.compiler import compile_from_config, write_validated_trace
from servelab.workload.export import EXPORT_FORMATS, export_trace_files, meta_path
from servelab.workload.imported import IMPORT_FORMATS, TraceWindow, import_trace, read_records
from servelab.workload.tokenizer import DEFAULT_TOKENIZER
from servelab.workload.validate import check_results

__all__ = ["register"]

TRACE_FILE = "trace.parquet"
MANIFEST_FILE = "manifest.json"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `trace` command and its subcommands."""
    trace = subparsers.add_parser(
        "trace", help="compile, validate and inspect seeded multi-agent traces"
    )
    sub = trace.add_subparsers(dest="trace_command", required=True)

    comp = sub.add_parser("compile", help="compile the trace of one (condition, rep)")
    add_config_arguments(comp)
    comp.add_argument("--condition", required=True, help="condition id, e.g. rate-0.28")
    comp.add_argument("--rep", required=True, help="repetition, e.g. rep1")
    comp.add_argument("--out", help="output folder (default: results/traces/{condition}/{rep})")
    comp.set_defaults(func=_compile)

    val = sub.add_parser("validate", help="run the six validator checks; exit 1 if any fails")
    val.add_argument("dir", help="folder holding trace.parquet and manifest.json")
    val.add_argument(
        "--retokenize",
        action="store_true",
        help="also re-encode every prompt with the manifest's tokenizer (slow)",
    )
    val.set_defaults(func=_validate)

    show = sub.add_parser("show", help="summarise a compiled trace")
    show.add_argument("dir", help="folder holding trace.parquet and manifest.json")
    show.add_argument(
        "--rows", type=int, default=8, help="how many rows to print (default: %(default)s)"
    )
    show.set_defaults(func=_show)

    export = sub.add_parser(
        "export",
        help="write a compiled trace as a flat timestamped trace for a peer load generator",
        description="Dependencies become fixed offsets: a root is sent at its arrival, a dependent "
        "at the latest of its predecessors' send times plus its tool delay (docs/workload.md, "
        "'Export for peers'). Writes OUT and OUT.meta.json.",
    )
    export.add_argument("dir", help="folder holding trace.parquet and manifest.json")
    export.add_argument(
        "--format", required=True, choices=EXPORT_FORMATS, help="the peer's trace format"
    )
    export.add_argument("--out", help="output file (default: DIR/export-FORMAT.jsonl)")
    export.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="do not ask the peer to send ignore_eos (the dispatcher's default is to send it)",
    )
    export.set_defaults(func=_export)

    imp = sub.add_parser(
        "import",
        help="turn a production trace (Mooncake JSONL) into a validated servelab trace",
        description="Each hash id becomes one block of tokens, the same in every request that has "
        "it; every request is its own one-request graph, sent at its arrival (open loop); the "
        "clock is scaled to --rate (docs/workload.md, 'Imported traces'). Writes "
        "OUT/trace.parquet and OUT/manifest.json.",
    )
    imp.add_argument("input", help="the trace file (JSONL)")
    imp.add_argument(
        "--format", required=True, choices=sorted(IMPORT_FORMATS), help="the trace's format"
    )
    imp.add_argument("--out", required=True, help="output folder")
    imp.add_argument(
        "--rate",
        type=float,
        help="requests per second of the replay (default: the trace's own clock)",
    )
    imp.add_argument(
        "--duration-s",
        type=float,
        help="seconds of replay (default: up to the trace's last request)",
    )
    imp.add_argument(
        "--start-s",
        type=float,
        default=0.0,
        help="source time (s) that becomes arrival 0 (default: %(default)s)",
    )
    imp.add_argument(
        "--max-request-tokens",
        type=int,
        help="drop requests whose prompt plus output tokens exceed this (default: keep all)",
    )
    imp.add_argument(
        "--seed", type=int, default=0, help="the trace seed the blocks are drawn from (default: 0)"
    )
    imp.add_argument(
        "--condition", help="condition id the manifest records (default: the file's stem)"
    )
    imp.add_argument("--rep", default="rep1", help="repetition the manifest records")
    imp.add_argument(
        "--tokenizer", default=DEFAULT_TOKENIZER, help="tokenizer (default: %(default)s)"
    )
    imp.set_defaults(func=_import)


def _compile(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.configfile)
    out = Path(args.out) if args.out else Path("results/traces") / args.condition / args.rep
    manifest = compile_from_config(
        config,
        args.condition,
        args.rep,
        trace_path=out / TRACE_FILE,
        manifest_path=out / MANIFEST_FILE,
    )
    print(
        f"{out / TRACE_FILE}: {manifest['n_requests']} requests in {manifest['n_graphs']} graphs, "
        f"L={manifest['prompt_tokens']} F={manifest['prefix_tokens']} "
        f"σ={manifest['achieved_sharing']:.4f}; all {len(manifest['checks'])} checks passed"
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    out = Path(args.out) if args.out else folder / f"export-{args.format}.jsonl"
    meta = export_trace_files(
        trace_path=folder / TRACE_FILE,
        manifest_path=folder / MANIFEST_FILE,
        out_path=out,
        fmt=args.format,
        ignore_eos=args.ignore_eos,
    )
    print(
        f"{out}: {meta['n_requests']} requests as {args.format} "
        f"(aiperf --custom-dataset-type {meta['peer_dataset_type']}); "
        f"dependencies flattened to fixed offsets, see {meta_path(out)}"
    )
    return 0


def _import(args: argparse.Namespace) -> int:
    out = Path(args.out)
    records, source = read_records(args.format, args.input)
    table, manifest = import_trace(
        records,
        fmt=args.format,
        source=source,
        window=TraceWindow(
            rate=args.rate,
            duration_s=args.duration_s,
            start_s=args.start_s,
            max_request_tokens=args.max_request_tokens,
        ),
        condition=args.condition or Path(args.input).stem,
        rep=args.rep,
        seed=args.seed,
        tokenizer=args.tokenizer,
    )
    manifest = write_validated_trace(
        table, manifest, trace_path=out / TRACE_FILE, manifest_path=out / MANIFEST_FILE
    )
    imported = manifest["imported"]
    print(
        f"{out / TRACE_FILE}: {manifest['n_requests']} requests (lines {imported['first_line']}-"
        f"{imported['last_line']} of {imported['records']}) over {manifest['duration_s']:.6g} s "
        f"at {manifest['rate']:.6g} requests/s (time scale {imported['time_scale']:.6g}); "
        f"{imported['distinct_blocks']} distinct blocks, sharing "
        f"{manifest['achieved_sharing']:.4f} (the hash ids record "
        f"{imported['recorded_sharing']:.4f}); all {len(manifest['checks'])} checks passed"
    )
    return 0


def _validate(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    results = check_results(folder / TRACE_FILE, folder / MANIFEST_FILE, args.retokenize)
    width = max(len(name) for name in results)
    for name, res in results.items():
        print(f"{name:<{width}}  {'ok' if res.ok else 'FAILED: ' + res.detail}")
    failed = [name for name, res in results.items() if not res.ok]
    if failed:
        print(f"{folder}: {len(failed)} check(s) failed: {', '.join(failed)}")
        return 1
    print(f"{folder}: all {len(results)} checks passed")
    return 0


def _show(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    manifest = read_trace_manifest(folder / MANIFEST_FILE)
    table = read_parquet(folder / TRACE_FILE, TRACE_SCHEMA)
    graph = table.column("graph_id").to_numpy()
    arrival = table.column("arrival_s").to_numpy()
    roles = table.column("role").to_pylist()
    delay = table.column("tool_delay_s").to_numpy()
    first = (
        np.concatenate([[0], np.flatnonzero(np.diff(graph)) + 1])
        if len(graph)
        else np.empty(0, int)
    )
    graph_arrivals = arrival[first]
    gaps = np.diff(np.concatenate([[0.0], graph_arrivals]))
    worker_delays = delay[np.asarray(roles, dtype=object) == "worker"]
    lines = [
        f"trace      {folder / TRACE_FILE}",
        f"condition  {manifest['condition']} {manifest['rep']}  seed {manifest['seed']}",
        f"rate       {manifest['rate']} graphs/s over {manifest['duration_s']} s "
        f"(offered {manifest.get('offered_load_rps', float('nan')):.3f} requests/s)",
        f"counts     {manifest['n_graphs']} graphs, {manifest['n_requests']} requests "
        + ", ".join(f"{r}={roles.count(r)}" for r in ("planner", "worker", "aggregator")),
        f"prompts    L={manifest['prompt_tokens']} F={manifest.get('prefix_tokens')} "
        f"D={manifest.get('suffix_tokens')} σ target {manifest['sharing']} achieved "
        f"{manifest['achieved_sharing']:.6f}  tokenizer {manifest['tokenizer']}",
        f"prefix     sha256 {manifest['prefix_sha256']}",
    ]
    if "topologies" in manifest:
        lines.append(
            "topologies "
            + ", ".join(f"{t['name']} {t['graphs']} graphs" for t in manifest["topologies"])
        )
    if "imported" in manifest:
        imported = manifest["imported"]
        lines.append(
            f"imported   {imported['format']} {imported['path']} lines {imported['first_line']}-"
            f"{imported['last_line']} of {imported['records']}, time scale "
            f"{imported['time_scale']:.6g}; sharing recorded by its hash ids "
            f"{imported['recorded_sharing']:.6f}"
        )
    if gaps.size:
        cv = float(np.std(gaps, ddof=1) / np.mean(gaps)) if gaps.size > 1 else float("nan")
        lines.append(
            f"arrivals   first {graph_arrivals[0]:.3f} s, last {graph_arrivals[-1]:.3f} s, mean gap "
            f"{np.mean(gaps):.3f} s (1/λ = {1 / manifest['rate']:.3f}), gap CV {cv:.3f}"
        )
    if worker_delays.size:
        lines.append(
            f"tool delay min {worker_delays.min():.3f} s, median {np.median(worker_delays):.3f} s, "
            f"max {worker_delays.max():.3f} s"
        )
    lines.append("checks     " + json.dumps(manifest["checks"], sort_keys=True))
    print("\n".join(lines))
    n = min(max(args.rows, 0), table.num_rows)
    if n:
        head = table.slice(0, n).to_pylist()
        print(
            f"\n{'request_id':<20} {'role':<10} {'arrival_s':>10} {'tool_s':>7} {'max':>4}  depends_on / prompt"
        )
        for row in head:
            deps = ",".join(row["depends_on"]) or "-"
            text = row["prompt_text"][:40].replace("\n", " ")
            print(
                f"{row['request_id']:<20} {row['role']:<10} {row['arrival_s']:>10.3f} "
                f"{row['tool_delay_s']:>7.3f} {row['max_tokens']:>4}  {deps}  {text!r}..."
            )
    return 0
