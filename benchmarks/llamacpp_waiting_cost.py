"""Do requests waiting for a slot slow llama-server's passes? (issue 26; docs/simulator.md, "A
fifth measurement").

    .venv/bin/python benchmarks/llamacpp_waiting_cost.py [--waiting 0 4 12] [--cycles 3]
        [--output-tokens 200] [--prompt-tokens 128] [--arrival during before] [--out OUT.json]

Past saturation the real llama-server's passes take longer than the fitted CPU platform says,
with the same passes and tokens a pass as the simulated server (benchmarks/sim_vs_real_passes.py).
A loaded run differs from the floor in the requests that wait for a slot: their HTTP threads
(a thread each: 8 fixed and the rest spawned, servelab.sim.llamacpp `_accept`; the waiting
requests are sent from client threads a few ms apart, so each gets one) share the engine's
pinned core. This measures that alone. llama-server (the CPU pair's flags: four slots, one
thread) runs on core 1, the client on core 0. Four greedy requests of fresh `--prompt-tokens`-token prompts
(128) fill the slots and decode `--output-tokens` tokens; 0.3 s later, `--waiting` more requests
are sent, which wait for a slot until the four finish (`--arrival during`, as in a loaded run;
`before` sends them 0.02 s after the four, before the four's first token, as the floor's
warm-ups arrive). The four's median gap between tokens, from 0.35 s after the first of them
starts to the first one's end, is the pass time with that many requests waiting; each
decoder's first-to-last span a token is the same read where the client took tokens in clumps.
The settings are interleaved over `--cycles` cycles; llama-server's own count of `llama_decode`
calls around each (`llamacpp:n_decode_total`) shows the four shared every pass.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import LlamaServer, machine
from parallel_sampling import CLIENT_CORE, decode_calls, served_llama, streamed_sequences

from servelab.workload import warmup_prompts

SLOTS = 4  # --parallel of the CPU pair (cpu_pair_engines.LLAMA_FLAGS)
PROMPT_TOKENS = 128  # the default of --prompt-tokens
SETTLE_S = 0.35  # after the four's first token: the waiting requests have been sent by then
CPU_WINDOW = (0.5, 2.0)  # s after the four are sent: they decode, the rest wait


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds so far of the server's main thread, which runs the slots and `llama_decode`
    (one compute thread, `--threads 1`), and of all its other threads (HTTP and the rest), from
    /proc/PID/task/*/stat (utime + stime)."""
    tick = os.sysconf("SC_CLK_TCK")
    main = others = 0.0
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick
        if stat.parent.name == str(pid):
            main += cpu
        else:
            others += cpu
    return main, others


def token_times(url: str, text: str, max_tokens: int) -> list[float]:
    """One greedy streamed completion: the arrival time (perf_counter) of each chunk with text."""
    return streamed_sequences(url, text, 1, greedy=True, seeded=False, max_tokens=max_tokens)[0]


ARRIVAL_DELAY_S = {"during": 0.3, "before": 0.02}  # after the four are sent


def one_setting(
    server: LlamaServer, texts: list[str], waiting: int, output_tokens: int, arrival: str
) -> dict[str, Any]:
    """The four decoders' median gap with `waiting` requests queued behind them, and the server's
    CPU time by thread over CPU_WINDOW."""
    url = server.url
    decoders, queued = texts[:SLOTS], texts[SLOTS : SLOTS + waiting]
    calls_before = decode_calls(url, "llamacpp")
    with ThreadPoolExecutor(max_workers=SLOTS + waiting) as pool:
        running = [pool.submit(token_times, url, t, output_tokens) for t in decoders]
        time.sleep(ARRIVAL_DELAY_S[arrival])
        sent_behind = time.perf_counter()
        behind = [pool.submit(token_times, url, t, 8) for t in queued]
        # the server's threads over a window in which the four decode and the rest wait
        time.sleep(CPU_WINDOW[0] - ARRIVAL_DELAY_S[arrival])
        window_start = time.perf_counter()
        cpu_before = thread_cpu_s(server.pid)
        time.sleep(CPU_WINDOW[1] - CPU_WINDOW[0])
        cpu_after = thread_cpu_s(server.pid)
        window_s = time.perf_counter() - window_start
        sequences = [f.result() for f in running]
        for f in behind:
            f.result()
    calls = decode_calls(url, "llamacpp")
    if min(s[-1] for s in sequences) - min(s[0] for s in sequences) < CPU_WINDOW[1]:
        raise RuntimeError(
            f"waiting {waiting}: a decoder ended inside the CPU window; raise --output-tokens"
        )
    start = min(s[0] for s in sequences) + SETTLE_S
    end = min(s[-1] for s in sequences)
    gaps = [b - a for s in sequences for a, b in itertools.pairwise(s) if a >= start and b <= end]
    if not gaps:
        raise RuntimeError(f"waiting {waiting}: no gap inside the window; raise --output-tokens")
    # A starved client or HTTP thread delivers tokens in clumps, which breaks the gaps, not the
    # span: each decoder's first to last token over its tokens.
    spans = [(s[-1] - s[0]) / (len(s) - 1) for s in sequences]
    if arrival == "before" and min(s[0] for s in sequences) < sent_behind:
        raise RuntimeError(
            f"waiting {waiting}: a decoder's first token came before the rest were sent"
        )
    return {
        "waiting": waiting,
        "arrival": arrival,
        "median_gap_ms": round(float(np.median(gaps)) * 1e3, 3),
        "span_ms_per_token": round(float(np.median(spans)) * 1e3, 3),
        "gaps": len(gaps),
        "decode_calls": None if calls is None or calls_before is None else calls - calls_before,
        "cpu_s_main_thread": round(cpu_after[0] - cpu_before[0], 3),
        "cpu_s_other_threads": round(cpu_after[1] - cpu_before[1], 3),
        # the threads' share of the engine's core over the window
        "main_thread_share": round((cpu_after[0] - cpu_before[0]) / window_s, 3),
        "other_threads_share": round((cpu_after[1] - cpu_before[1]) / window_s, 3),
        "results_per_s": round(SLOTS / float(np.median(spans)), 1),
    }


def interleaved(
    server: LlamaServer,
    texts: list[str],
    settings: list[Any],
    cycles: int,
    per_setting: int,
    measure: Callable[[LlamaServer, list[str], Any], dict[str, Any]],
) -> list[dict[str, Any]]:
    """`measure(server, fresh prompts, setting)` for every setting in every cycle, settings
    interleaved within a cycle, each on `per_setting` prompts not sent before; the rows, printed
    as they come."""
    rows = []
    for cycle in range(cycles):
        for setting in settings:
            fresh, texts = texts[:per_setting], texts[per_setting:]
            row = {"cycle": cycle, **measure(server, fresh, setting)}
            rows.append(row)
            print(row, flush=True)
    return rows


def write_record(args: argparse.Namespace, started: float, rows: list, **extra: Any) -> None:
    """`--out`'s JSON: the machine, the settings, the wall time, the rows and `extra`."""
    if args.out is None:
        return
    record = {
        "machine": machine(),
        "settings": {**vars(args), "out": str(args.out)},
        "wall_s": round(time.perf_counter() - started, 1),
        "rows": rows,
        **extra,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--waiting", type=int, nargs="+", default=[0, 4, 12])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--output-tokens", type=int, default=300)
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=PROMPT_TOKENS,
        help="every request's fresh prompt; longer ones make the four's passes dearer",
    )
    parser.add_argument(
        "--arrival",
        nargs="+",
        choices=sorted(ARRIVAL_DELAY_S),
        default=["during"],
        help="when the waiting requests are sent, each interleaved with every --waiting",
    )
    parser.add_argument("--out", type=Path, help="write the measurement as JSON here")
    args = parser.parse_args()
    if any(w < 0 for w in args.waiting) or args.cycles < 1 or args.output_tokens < 50:
        parser.error("--waiting >= 0, --cycles >= 1 and --output-tokens >= 50")
    os.sched_setaffinity(0, {CLIENT_CORE})
    per_setting = SLOTS + max(args.waiting)
    settings = [(w, a) for w in args.waiting for a in args.arrival]
    count = args.cycles * len(settings) * per_setting
    texts = [text for text, _ in warmup_prompts(7, count, args.prompt_tokens)]
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="servelab-waiting-") as tmp,
        served_llama(Path(tmp)) as server,
    ):
        rows = interleaved(
            server,
            texts,
            settings,
            args.cycles,
            per_setting,
            lambda srv, fresh, s: one_setting(srv, fresh, s[0], args.output_tokens, s[1]),
        )
    summary = {
        key: {
            f"{w} {a}": round(
                float(np.median([r[key] for r in rows if r["waiting"] == w and r["arrival"] == a])),
                3,
            )
            for w, a in settings
        }
        for key in (
            "median_gap_ms",
            "span_ms_per_token",
            "cpu_s_main_thread",
            "cpu_s_other_threads",
            "main_thread_share",
            "other_threads_share",
            "results_per_s",
        )
    }
    print(f"by requests waiting, the median over cycles: {summary}")
    write_record(args, started, rows, by_waiting=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
