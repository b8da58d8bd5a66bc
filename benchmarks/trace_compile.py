"""Benchmark: trace compilation time and peak memory for the grid's largest traces.

    .venv/bin/python benchmarks/trace_compile.py [--config config/config.yaml] [--repeat 3]
        [--conditions rate-0.40 length-8192]

Each measurement runs in a fresh interpreter (as one Snakemake job would) and reports
- cold: wall time of the whole process (imports, tokenizer load, safe-vocabulary scan, compile, write),
- its parts, timed inside the child: imports, tokenizer load, vocabulary scan, compile_from_config (arrivals,
  graphs, prompts, the verification encode of every prompt, Parquet write, validation of the written bytes),
  the share of that spent inside the Rust tokenizer's batch encode, and load_trace (what every dispatch pays),
- CPU time (user + system, all threads) and peak RSS of the child (getrusage via os.wait4),
- the 1-minute load average when the child ended (the machine may be shared: read the figures with it).
Prints one line per run and the median per condition; writes nothing outside a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(config_path: str, condition: str, out: str) -> None:
    """Runs in the fresh interpreter: time each phase and print one JSON line."""
    t0 = time.perf_counter()
    from servelab.grid.config import load_config
    from servelab.workload import compile_from_config, load_trace
    from servelab.workload import prompts as prompt_layer
    from servelab.workload.tokenizer import load_tokenizer, safe_vocabulary

    t_import = time.perf_counter() - t0
    config = load_config(config_path)
    t1 = time.perf_counter()
    load_tokenizer(str(config["tokenizer"]))
    t_tok = time.perf_counter() - t1
    t1 = time.perf_counter()
    safe_vocabulary(str(config["tokenizer"]))
    t_vocab = time.perf_counter() - t1

    encode = prompt_layer.encode_batch
    spent = [0.0]

    def timed_encode(tok, texts):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return encode(tok, texts)
        finally:
            spent[0] += time.perf_counter() - t

    prompt_layer.encode_batch = timed_encode
    folder = Path(out)
    t1 = time.perf_counter()
    manifest = compile_from_config(
        config,
        condition,
        "rep1",
        trace_path=folder / "trace.parquet",
        manifest_path=folder / "manifest.json",
    )
    t_compile = time.perf_counter() - t1
    t1 = time.perf_counter()
    load_trace(folder / "trace.parquet", folder / "manifest.json")
    t_load = time.perf_counter() - t1
    print(
        json.dumps(
            {
                "import_s": t_import,
                "tokenizer_s": t_tok,
                "vocab_s": t_vocab,
                "compile_s": t_compile,
                "encode_s": spent[0],
                "load_trace_s": t_load,
                "n_requests": manifest["n_requests"],
                "prompt_tokens": manifest["prompt_tokens"],
                "trace_mib": (folder / "trace.parquet").stat().st_size / 2**20,
            }
        )
    )


def measure(config: str, condition: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", config, condition, tmp],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out = proc.stdout.read().decode() if proc.stdout else ""
        err = proc.stderr.read().decode() if proc.stderr else ""
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{condition}: child failed:\n{err}")
        result = json.loads(out.strip().splitlines()[-1])
        result["cold_s"] = wall
        result["load_avg_1m"] = os.getloadavg()[0]
        result["peak_rss_mib"] = usage.ru_maxrss / 1024  # KiB on Linux
        result["cpu_s"] = usage.ru_utime + usage.ru_stime  # all threads: contention-insensitive
        return result


def machine() -> str:
    lines = [f"python {platform.python_version()}", f"nproc {os.cpu_count()}"]
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        lines += [ln for ln in lscpu.splitlines() if ln.split(":")[0] in ("Model name", "CPU(s)")]
    except (OSError, subprocess.CalledProcessError):
        pass
    return "; ".join(" ".join(x.split()) for x in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    parser.add_argument("--conditions", nargs="+", default=["rate-0.40", "length-8192"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    cols = (
        "cold_s",
        "cpu_s",
        "import_s",
        "tokenizer_s",
        "vocab_s",
        "compile_s",
        "encode_s",
        "load_trace_s",
        "peak_rss_mib",
    )
    for condition in args.conditions:
        runs = []
        for k in range(args.repeat):
            r = measure(args.config, condition)
            runs.append(r)
            print(
                f"{condition} run {k + 1}: {r['n_requests']} requests x {r['prompt_tokens']} tokens, "
                f"trace {r['trace_mib']:.1f} MiB | "
                + " ".join(f"{c}={r[c]:.2f}" for c in cols)
                + f" | load average {r['load_avg_1m']:.2f}"
            )
        med = {c: statistics.median(r[c] for r in runs) for c in cols}
        print(f"{condition} median of {len(runs)}: " + " ".join(f"{c}={med[c]:.2f}" for c in cols))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4])
        sys.exit(0)
    sys.exit(main())
