"""What llama-server's trace verbosity costs a measured server: its per-task time against its history.

    .venv/bin/python benchmarks/llamacpp_trace_cost.py [--fills 1200] [--every 300]
        [--shared-prefix 0] [--verbosity 3 --verbosity 4] [--json out.json]

At `--log-verbosity 4` llama-server prints n_batch (what servelab's gate reads), but it also traces
its host prompt cache on every task: server_prompt_cache::load prints one line per cached prompt and
server_prompt_cache::update lists every entry (llama.cpp 0c1e570 (vendored in llama-cpp-python
0.3.36), tools/server/server-task.cpp, SRV_TRC). The default `--cache-ram 8192` keeps thousands of
the tiny model's prompts, so each task costs more the more the server has served.

For each verbosity (3, the default, and 4) one llama-server with the CPU pair's flags (4 slots of
2,048 tokens, one thread), pinned to one core (`taskset`, as the sim-vs-real campaign pins it),
serves `--fills` distinct 1,024-token prompts one at a time (each generating one token), and every
`--every` prompts a probe of 9 distinct 128-token prompts, one at a time. Printed per probe: the
prompts served so far, the probe's median wall time per request (what a client's TTFT sees), the
server's own median prompt_ms (`timings`, the forward pass alone), and the server log's size.

With `--shared-prefix N` every filling prompt starts with the same N tokens, as the campaign's
prompts share theirs. The cache's scans then compare up to N tokens with each cached prompt:
server_prompt_cache::alloc scans every entry twice, ::load once, each with
server_tokens::get_common_prefix, which walks two prompts until they differ
(tools/server/server-common.cpp), and every idle slot is saved (so scanned for) after each launch
(tools/server/server-context.cpp, process_single_task, cache_idle_slots). `--verbosity` (repeatable)
picks the levels measured (default: 3 and 4). `--fill-tokens` is what each filling prompt generates
(default 1). A slot that kept 1,024 prompt tokens and matches the next by 512 keeps exactly half, so
it is not saved (get_available_slot saves a slot similarity picks only when it keeps under half);
with 16, as the campaign's requests generate, it is, and the cache grows by one prompt a request.

Each server is started on a free port and stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import LlamaServer, machine
from llamacpp_launch_cost import launch_ms

from servelab.deploy.processes import pinned

FLAGS = ("--ctx-size", "8192", "--parallel", "4", "--threads", "1")
PROBE_REQUESTS = 9
ENGINE_CPUS = (1,)
TIMEOUT_S = 60.0


def _prompt(rng: random.Random, n: int) -> list[int]:
    # distinct random token ids: no prompt shares a prefix with another (no cache hit)
    return [rng.randrange(1000, 100_000) for _ in range(n)]


def _complete(client: httpx.Client, prompt: list[int], n_predict: int = 1) -> tuple[float, float]:
    """(wall seconds, the server's prompt_ms) of one request generating `n_predict` tokens."""
    t0 = time.perf_counter()
    response = client.post("/completion", json={"prompt": prompt, "n_predict": n_predict})
    response.raise_for_status()
    return time.perf_counter() - t0, float(response.json()["timings"]["prompt_ms"])


def measure(
    verbosity: int,
    fills: int,
    every: int,
    seed: int,
    shared_prefix: int = 0,
    fill_tokens: int = 1,
) -> list[dict[str, Any]]:
    log_path = Path(tempfile.mkstemp(prefix=f"llama-server-lv{verbosity}-", suffix=".log")[1])
    server = LlamaServer(flags=(*FLAGS, "--log-verbosity", str(verbosity)), log_path=log_path)
    server.command = pinned(server.command, ENGINE_CPUS)
    rng = random.Random(seed)
    prefix = _prompt(rng, shared_prefix)
    rows: list[dict[str, Any]] = []
    try:
        with server, httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as client:
            offset = 0
            for served in range(fills + 1):
                if served % every == 0:
                    data = log_path.read_bytes()
                    text, offset = data[offset:].decode(errors="replace"), len(data)
                    launches = [ms for life in launch_ms(text) for ms in life]
                    fill_launch = launches[PROBE_REQUESTS if served else 0 :]
                    probe = [_complete(client, _prompt(rng, 128)) for _ in range(PROBE_REQUESTS)]
                    row = {
                        "verbosity": verbosity,
                        "shared_prefix": shared_prefix,
                        "fill_tokens": fill_tokens,
                        "prompts_served": served,
                        "probe_wall_ms": round(statistics.median(w for w, _ in probe) * 1e3, 2),
                        "probe_prompt_ms": round(statistics.median(p for _, p in probe), 2),
                        "log_mb": round(log_path.stat().st_size / 1e6, 1),
                        # the filling requests' since the last probe
                        "fill_launch_ms": round(statistics.median(fill_launch), 3)
                        if fill_launch
                        else None,
                    }
                    rows.append(row)
                    print(
                        f"-lv {verbosity}  after {served:5d} prompts: 128-token request "
                        f"{row['probe_wall_ms']:6.1f} ms wall, {row['probe_prompt_ms']:5.1f} ms "
                        f"prompt_ms; log {row['log_mb']:7.1f} MB; fills' launch "
                        f"{row['fill_launch_ms']} ms",
                        flush=True,
                    )
                if served < fills:
                    _complete(client, prefix + _prompt(rng, 1024 - shared_prefix), fill_tokens)
    finally:
        log_path.unlink(missing_ok=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--fills", type=int, default=1200)
    parser.add_argument("--every", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shared-prefix", type=int, default=0)
    parser.add_argument("--fill-tokens", type=int, default=1)
    parser.add_argument("--verbosity", type=int, action="append", choices=(3, 4))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not 0 <= args.shared_prefix < 1024:
        parser.error(f"--shared-prefix {args.shared_prefix}: between 0 and 1023 tokens")
    print(json.dumps(machine()))
    rows = [
        row
        for v in args.verbosity or (3, 4)
        for row in measure(
            v, args.fills, args.every, args.seed, args.shared_prefix, args.fill_tokens
        )
    ]
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
