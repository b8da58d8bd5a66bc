"""`servelab sim ...` and `servelab serve-sim`: run the simulator outside Snakemake.

`servelab serve-sim` serves a simulated engine live over HTTP (servelab.sim.server_cli); the two
`sim` subcommands run it offline:

    servelab sim deploy --config config/config.yaml --arm defaults --engine vllm --condition rate-0.28 \
        --out results/deployments/x/startup.log
    servelab sim run --config config/config.yaml --arm defaults --engine vllm --condition rate-0.28 \
        --rep rep1 --trace results/traces/rate-0.28/rep1 --out /tmp/run
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from servelab.grid.config import (
    ARMS,
    ConfigError,
    add_config_arguments,
    arm_conditions,
    deployment_for,
    load_config,
)
from servelab.sim.models import simulated_engines
from servelab.sim.run import sim_deploy, simulate_config_run
from servelab.sim.server_cli import add_arguments as add_serve_arguments
from servelab.sim.server_cli import serve_main

__all__ = ["register"]

_DEPLOY_TIMESTAMP = datetime(2026, 1, 1, tzinfo=UTC)


def _common(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--arm", required=True, choices=ARMS)
    p.add_argument("--engine", required=True, choices=simulated_engines())
    p.add_argument("--condition", required=True, help="condition id, e.g. rate-0.28")


def _deployment(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    cfg = load_config(args.config, args.configfile)
    if args.condition not in arm_conditions(cfg, args.arm, args.engine):
        raise ConfigError(
            f"--condition {args.condition}: not run by {args.engine} in the {args.arm} arm of "
            f"{args.config}"
        )
    return cfg, deployment_for(cfg, args.arm, args.engine, args.condition)


def _cmd_deploy(args: argparse.Namespace) -> int:
    cfg, dep = _deployment(args)
    resolved = sim_deploy(
        engine=args.engine,
        flags=list(dep.flags),
        gpu_name=cfg["gpu"]["name"],
        gpu_memory_mib=int(cfg["gpu"]["memory_mib"]),
        model_preset=cfg["model"]["preset"],
        deployment_id=dep.id,
        startup_log_path=args.out,
        timestamp=_DEPLOY_TIMESTAMP,
    )
    print(json.dumps(resolved.as_run_config(), sort_keys=True))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    cfg, _ = _deployment(args)  # also refuses a run outside the grid
    faults: list[dict[str, Any]] = []
    if args.reclaim_at is not None:
        faults.append({"kind": "reclaim", "at_s": args.reclaim_at})
    if args.fail:
        faults.append({"kind": "fail"})
    record = simulate_config_run(
        cfg,
        arm=args.arm,
        engine=args.engine,
        condition=args.condition,
        rep=args.rep,
        trace_dir=args.trace,
        out_dir=args.out,
        attempt=args.attempt,
        faults=faults,
    )
    keys = ("run_id", "status", "n_sent", "n_ok", "success_fraction", "trace_start_s")
    print(json.dumps({k: record[k] for k in keys}, sort_keys=True))
    return 0 if record["status"] == "ok" else 1


def register(subparsers: Any) -> None:
    """Add `servelab sim deploy`, `servelab sim run` and `servelab serve-sim`."""
    sim = subparsers.add_parser("sim", help="simulated engines (the default backend)")
    sub = sim.add_subparsers(dest="sim_command", required=True)

    dep = sub.add_parser(
        "deploy", help="resolve an engine's configuration and write its start-up log"
    )
    _common(dep)
    dep.add_argument("--out", required=True, help="start-up log file to write")
    dep.set_defaults(func=_cmd_deploy)

    run = sub.add_parser("run", help="simulate one run and write its artifacts")
    _common(run)
    run.add_argument("--rep", required=True, help="repetition, e.g. rep1")
    run.add_argument("--trace", required=True, help="folder with trace.parquet and manifest.json")
    run.add_argument(
        "--out", required=True, help="folder for requests.parquet, scrape.parquet, run.json"
    )
    run.add_argument("--attempt", type=int, default=1)
    run.add_argument("--reclaim-at", type=float, default=None, help="inject a node reclamation (s)")
    run.add_argument("--fail", action="store_true", help="inject an engine crash at trace start")
    run.set_defaults(func=_cmd_run)

    serve = subparsers.add_parser(
        "serve-sim",
        help="serve a simulated engine over an OpenAI-compatible HTTP API, in real time",
        description="Serve one of the simulator's engines live (vLLM 0.6.3 or V1 0.33.0, SGLang "
        "0.4.1 or 0.5.23, each with its release's start-up log and /metrics names): "
        "/v1/completions (streaming), /health, /v1/models, /metrics.",
    )
    add_serve_arguments(serve)
    serve.set_defaults(func=serve_main)
