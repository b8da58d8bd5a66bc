"""Command line of the live dispatcher: `servelab dispatch`.

The live simulated engine's `servelab serve-sim` is registered by servelab.sim.cli, the local
backend's `servelab local stop` by servelab.deploy.cli: the client knows neither.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from servelab.dispatch.client import CLIENTS
from servelab.dispatch.run import dispatch_run_files
from servelab.engines.registry import engine_names
from servelab.grid.settings import DispatchSettings

__all__ = ["register"]


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    trace_dir = Path(args.trace)
    out = Path(args.out)
    resolved: dict[str, Any] = (
        json.loads(args.resolved)
        if args.resolved
        else {
            "chunked_prefill": None,
            "chunk_size": None,
        }
    )
    record = dispatch_run_files(
        base_url=args.url,
        trace_path=str(trace_dir / "trace.parquet"),
        manifest_path=str(trace_dir / "manifest.json"),
        arm=args.arm,
        engine=args.engine,
        condition=args.condition,
        rep=args.rep,
        backend=args.backend,
        deployment_id=args.deployment_id or f"{args.arm}-{args.engine}",
        resolved_config=resolved,
        warmup_requests=args.warmup_requests,
        warmup_spacing_s=args.warmup_spacing,
        request_timeout_s=args.request_timeout,
        health_timeout_s=args.health_timeout,
        success_threshold=args.success_threshold,
        offered_load_rps=args.offered_load,
        attempt=args.attempt,
        node_identity_fn=lambda: {"url": args.url},
        progress_interval_s=args.progress_interval,
        workers=args.workers,
        client=args.client,
        requests_path=str(out / "requests.parquet"),
        run_json_path=str(out / "run.json"),
    )
    print(
        json.dumps(
            {
                k: record[k]
                for k in ("run_id", "status", "n_sent", "n_ok", "n_failed", "dispatcher_lag_s")
            },
            indent=2,
        )
    )
    return 0 if record["status"] == "ok" else 1


def register(subparsers: Any) -> None:
    """Add `servelab dispatch`."""
    dispatch = subparsers.add_parser(
        "dispatch",
        help="replay a compiled trace against an OpenAI-compatible server",
        description="Send a trace's requests at their scheduled times (warm-up first), stream "
        "every answer, and write requests.parquet and run.json.",
    )
    dispatch.add_argument(
        "--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000"
    )
    dispatch.add_argument(
        "--trace", required=True, help="folder with trace.parquet and manifest.json"
    )
    dispatch.add_argument("--out", required=True, help="folder for requests.parquet and run.json")
    dispatch.add_argument("--arm", default="defaults")
    dispatch.add_argument("--engine", default="vllm", choices=engine_names())
    dispatch.add_argument("--condition", required=True)
    dispatch.add_argument("--rep", default="rep1")
    dispatch.add_argument("--backend", default="local")
    dispatch.add_argument("--deployment-id")
    dispatch.add_argument("--resolved", help="resolved configuration as JSON (for run.json)")
    dispatch.add_argument("--warmup-requests", type=int, default=20)
    dispatch.add_argument(
        "--warmup-spacing",
        type=float,
        default=0.0,
        help="seconds between two warm-ups' sends (default 0: all at once)",
    )
    dispatch.add_argument("--request-timeout", type=float, default=300.0)
    dispatch.add_argument("--health-timeout", type=float, default=DispatchSettings.health_timeout_s)
    dispatch.add_argument("--success-threshold", type=float, default=0.95)
    dispatch.add_argument(
        "--offered-load",
        type=float,
        default=0.0,
        help="offered load in requests/s (sizes the connection pool)",
    )
    dispatch.add_argument("--attempt", type=int, default=1)
    dispatch.add_argument("--progress-interval", type=float, default=10.0)
    dispatch.add_argument(
        "--workers", type=int, default=1, help="dispatch processes (graphs split among them)"
    )
    dispatch.add_argument(
        "--client",
        choices=CLIENTS,
        default=DispatchSettings.client,
        help="paced: a pacer process sends, the event loop reads (default); httpx: one loop does both",
    )
    dispatch.set_defaults(func=_dispatch)
