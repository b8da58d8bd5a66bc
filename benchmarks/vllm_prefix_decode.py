"""Does a vLLM V1 request whose prompt began with a cached prefix decode more slowly than a fresh
one of the same length? (issue 26; docs/simulator.md, "Why vLLM's passes run slower in the
loaded runs").

    .venv/bin/python benchmarks/vllm_prefix_decode.py [--arm defaults|matched] [--cycles 8]
        [--pairs 3] [--output-tokens 32] [--json FILE]

vLLM's single-request decode passes in the loaded runs run slower than its floor's fit prices
them (`run_speed_witness.py`), and on the engine's own steps the defaults floor of the loaded
runs' shape (half the prompt a prefix shared within a graph) ran slower against its price than
the floors of fresh prompts. This sets the two kinds of request side by side on one server, with
nothing else different: one vLLM V1 server (the CPU pair's flags; `--arm matched` adds
`--max-num-batched-tokens=256`) pinned to core 1, the client on core 0, each process of the
server logging its steps through benchmarks/vllm_trace/sitecustomize.py. Per cycle:

1. a `planner`: a 512-token prefix new to the server and 512 fresh tokens, which caches the prefix;
2. `--pairs` pairs, one at a time, of a `fresh` request (1,024 new tokens) and a `cached` one
   (the cycle's prefix, then 512 new tokens), their order alternating from pair to pair and from
   cycle to cycle.

Prompts are token ids (the tokenizer's safe vocabulary, `warmup_prompts`), so both kinds are
1,024 tokens exactly and the cached prefix is whole blocks. Each request asks for
`--output-tokens` greedy tokens with `ignore_eos`, streamed.

Per request, medians over its decode steps (one request in the step, one token), on the
engine's own clock:
- `cycle`: the step's start (`Scheduler.schedule` entered) to the next step's, back to back;
- `schedule`, `execute` (schedule returned to `update_from_output` entered: the forward pass and
  sampling), `update` (`update_from_output`'s own time) and `between` (the step's end to the
  next step's start: the busy loop's input handling, and anything else the core ran);
and `client_gap`, the median gap between its streamed chunks after the first, on the client's
clock. Per kind, the median of the requests' medians; `cached ÷ fresh` of each, with
Mann-Whitney's two-sided p over the requests (scipy).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_bench_peer import MODEL, TOKENIZER, VLLM_PYTHON, VllmServer, _free_port
from vllm_request_trace import Event, client_id, lone_decodes, read_events, steps_of

from servelab.workload import warmup_prompts

HERE = Path(__file__).resolve().parent
PROMPT_TOKENS = 1024
PREFIX_TOKENS = 512
SEED = 2612
REQUEST_TIMEOUT_S = 120.0
ENGINE_CORE, CLIENT_CORE = "1", 0
MATCHED_FLAG = "--max-num-batched-tokens=256"
PARTS = ("cycle", "schedule", "execute", "update", "between")
KINDS = ("fresh", "cached")


def stream_request(
    url: str, request_id: str, ids: Sequence[int], output_tokens: int
) -> list[float]:
    """Send one greedy streamed completion of prompt `ids`; the client's times (perf_counter)
    of its chunks that carry text."""
    body = {
        "model": MODEL,
        "prompt": list(ids),
        "max_tokens": output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
    }
    times: list[float] = []
    headers = {"X-Request-Id": request_id}
    with httpx.stream(
        "POST", url + "/v1/completions", json=body, headers=headers, timeout=REQUEST_TIMEOUT_S
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"text":""' not in line:
                times.append(time.perf_counter())
    if len(times) < 2:
        raise RuntimeError(f"{request_id}: streamed {len(times)} chunks with text")
    return times


def plan(cycles: int, pairs: int) -> list[tuple[int, str]]:
    """The send order: (cycle, kind) per request, each cycle's planner first, then its pairs,
    fresh first in even (cycle + pair) and cached first in odd."""
    order: list[tuple[int, str]] = []
    for cycle in range(cycles):
        order.append((cycle, "planner"))
        for pair in range(pairs):
            first, second = KINDS if (cycle + pair) % 2 == 0 else KINDS[::-1]
            order += [(cycle, first), (cycle, second)]
    return order


def prompts(order: Sequence[tuple[int, str]], seed: int) -> list[list[int]]:
    """Each request's token ids: fresh tokens throughout, but for `cached`, whose first
    PREFIX_TOKENS are its cycle's planner's."""
    pool = [ids for _, ids in warmup_prompts(seed, len(order), PROMPT_TOKENS, TOKENIZER)]
    prefix: dict[int, list[int]] = {}
    out: list[list[int]] = []
    for (cycle, kind), ids in zip(order, pool, strict=True):
        if kind == "planner":
            prefix[cycle] = ids[:PREFIX_TOKENS]
        if kind == "cached":
            ids = prefix[cycle] + ids[PREFIX_TOKENS:]
        out.append(list(ids))
    return out


def decode_steps(events: Sequence[Event], known: set[str]) -> dict[str, list[dict[str, float]]]:
    """Per client request id, its back-to-back decode steps on the engine's clock
    (`lone_decodes`: one request and one token, followed by another step of the same request),
    each with the parts named in PARTS (seconds)."""
    out: dict[str, list[dict[str, float]]] = {}
    for step, parts in lone_decodes(steps_of(events)):
        rid = client_id(step.batch[0].rid, known)
        if rid is not None:
            out.setdefault(rid, []).append(parts)
    return out


def request_row(steps: Sequence[Mapping[str, float]], chunks: Sequence[float]) -> dict[str, Any]:
    """One request's medians (ms): each part of its decode steps, and its client gap."""
    gaps = [b - a for a, b in itertools.pairwise(chunks[1:])]
    row: dict[str, Any] = {"decode_steps": len(steps)}
    for part in PARTS:
        row[part] = 1e3 * statistics.median(s[part] for s in steps) if steps else None
    row["client_gap"] = 1e3 * statistics.median(gaps) if gaps else None
    return row


def compare(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per kind and part, the median of the requests' medians; cached ÷ fresh, and
    Mann-Whitney's two-sided p over the requests."""
    out: dict[str, Any] = {}
    for part in (*PARTS, "client_gap"):
        by_kind = {
            kind: [r[part] for r in rows if r["kind"] == kind and r[part] is not None]
            for kind in KINDS
        }
        if not all(by_kind.values()):
            continue
        fresh, cached = (statistics.median(by_kind[k]) for k in KINDS)
        test = stats.mannwhitneyu(by_kind["cached"], by_kind["fresh"], alternative="two-sided")
        out[part] = {
            "fresh_ms": round(fresh, 3),
            "cached_ms": round(cached, 3),
            "ratio": round(cached / fresh, 3) if fresh > 0 else None,
            "p": float(f"{test.pvalue:.3g}"),
            "requests": {k: len(v) for k, v in by_kind.items()},
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--arm", choices=("defaults", "matched"), default="defaults")
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=3, help="fresh/cached pairs a cycle")
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--json", type=Path, help="write the measurement here")
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CORE})
    order = plan(args.cycles, args.pairs)
    ids = prompts(order, args.seed)
    wall0 = time.perf_counter()
    with TemporaryDirectory() as scratch:
        trace = Path(scratch) / "trace"
        trace.mkdir()
        # the server inherits both: every vLLM process logs its events to `trace`
        os.environ["SERVELAB_VLLM_TRACE_DIR"] = str(trace)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(HERE / "vllm_trace"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        with VllmServer(
            VLLM_PYTHON,
            Path(scratch),
            _free_port(),
            cpus=ENGINE_CORE,
            extra_flags=(MATCHED_FLAG,) if args.arm == "matched" else (),
        ) as vllm:
            warm = warmup_prompts(args.seed + 1, 4, PROMPT_TOKENS, TOKENIZER)
            for k, (_, warm_ids) in enumerate(warm):
                stream_request(vllm.url, f"warmup{k}", warm_ids, args.output_tokens)
            chunks = {
                f"{kind}{k}": stream_request(vllm.url, f"{kind}{k}", prompt, args.output_tokens)
                for k, ((_, kind), prompt) in enumerate(zip(order, ids, strict=True))
            }
        os.environ.pop("SERVELAB_VLLM_TRACE_DIR")
        steps = decode_steps(read_events(trace), set(chunks))
    rows = []
    for k, (cycle, kind) in enumerate(order):
        rid = f"{kind}{k}"
        rows.append(
            {"request": rid, "cycle": cycle, "kind": kind}
            | request_row(steps.get(rid, []), chunks[rid])
        )
    result = compare(rows)
    print(
        f"vLLM V1, {args.arm}: {PROMPT_TOKENS}-token prompts, {args.output_tokens} output tokens, "
        f"{args.cycles} cycles of {args.pairs} pairs; medians of the requests' medians (ms)"
    )
    print(f"{'part':11} {'fresh':>8} {'cached':>8} {'ratio':>7} {'p':>9}")
    for part, r in result.items():
        print(
            f"{part:11} {r['fresh_ms']:>8.3f} {r['cached_ms']:>8.3f} {r['ratio']:>7.3f} {r['p']:>9.3g}"
        )
    record = {
        "arm": args.arm,
        "prompt_tokens": PROMPT_TOKENS,
        "prefix_tokens": PREFIX_TOKENS,
        "output_tokens": args.output_tokens,
        "cycles": args.cycles,
        "pairs": args.pairs,
        "seed": args.seed,
        "machine": {"nproc": os.cpu_count(), "loadavg": os.getloadavg()},
        "compare": result,
        "requests": rows,
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
