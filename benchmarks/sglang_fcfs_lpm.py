"""SGLang's scheduling policy on the CPU: FCFS (0.5.23's default) against LPM (longest prefix match,
0.4.1's default, the study's), in the matched arm of config/cpu-study.yaml, on the same seeded traces.

    make vllm-cpu sglang-cpu
    .venv/bin/python benchmarks/sglang_fcfs_lpm.py [--rate 0.5 --rate 3] [--keep DIR] [--json]

For each rate (agent graphs per second; 1,024-token prompts, sharing 0.5, 15 s of arrivals, as
cpu-study.yaml's condition) it runs the real Snakefile twice in scratch folders, for the matched
arm's SGLang block only (`results/runs/matched/sglang_v05/rate-R/rep{1,2}/run.json`): once with
config/cpu-study.yaml (FCFS), once with config/ablations/cpu-sglang-lpm.yaml laid over it (LPM).
The traces are the same seeded traces in both. It prints, per rate and policy, TTFT p50 and p95,
E2E p50 and throughput from each run's requests.parquet (servelab.analysis.reduce, warm-ups
excluded), and per repetition the LPM ÷ FCFS ratio of TTFT p50 and p95, the analysis's paired form.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import yaml

from servelab.analysis.reduce import reduce_requests

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
REPS = ("rep1", "rep2")


def campaign(work: Path, rate: float, lpm: bool) -> dict[str, Any]:
    (work / "config" / "ablations").mkdir(parents=True)
    for name in ("config.yaml", "cpu-study.yaml", "ablations/cpu-sglang-lpm.yaml"):
        shutil.copy(REPO / "config" / name, work / "config" / name)
    base = yaml.safe_load((REPO / "config" / "cpu-study.yaml").read_text())
    condition = {**base["conditions"][0], "rate": rate}
    name = f"rate-{rate:.2f}"
    (work / "config" / "rate.yaml").write_text(
        yaml.safe_dump({"conditions": [condition], "analysis": {"table_conditions": [name]}})
    )
    files = ["config/cpu-study.yaml", *(["config/ablations/cpu-sglang-lpm.yaml"] * lpm)]
    targets = [f"results/runs/matched/sglang_v05/{name}/{rep}/run.json" for rep in REPS]
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--cores", "1",
         *targets, "--configfile", *files, "config/rate.yaml"],
        cwd=work, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{work}: the campaign failed:\n{(done.stdout + done.stderr)[-3000:]}")
    out: dict[str, Any] = {"policy": "lpm" if lpm else "fcfs", "rate": rate, "reps": {}}
    for rep in REPS:
        run = work / "results" / "runs" / "matched" / "sglang_v05" / name / rep
        req = reduce_requests(pq.read_table(run / "requests.parquet"), rep)
        ok = req.ok & ~np.asarray(req.warmup, dtype=bool)
        ttft = req.ttft[ok]
        out["reps"][rep] = {
            "requests_ok": int(ok.sum()),
            "ttft_p50_ms": 1e3 * float(np.percentile(ttft, 50)),
            "ttft_p95_ms": 1e3 * float(np.percentile(ttft, 95)),
            "e2e_p50_ms": 1e3 * float(np.percentile(req.e2e[ok], 50)),
        }
        resolved = json.loads(
            next(
                (work / "results" / "deployments").glob("matched-sglang*/resolved.json")
            ).read_text()
        )
        out["schedule_policy_resolved"] = resolved.get("schedule_policy")
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, action="append", help="agent graphs/s (repeatable)")
    ap.add_argument("--keep", help="run in this folder and keep it")
    ap.add_argument("--json", action="store_true", help="end with the results as one JSON line")
    args = ap.parse_args(argv)
    rates = args.rate or [0.5, 3.0]
    root = Path(args.keep or tempfile.mkdtemp(prefix="sglang-fcfs-lpm-"))
    rows = []
    for rate in rates:
        pair = {}
        for lpm in (False, True):
            work = root / f"rate-{rate:g}-{'lpm' if lpm else 'fcfs'}"
            pair[lpm] = campaign(work, rate, lpm)
            print(json.dumps(pair[lpm]), flush=True)
        ratios = {
            rep: {
                m: pair[True]["reps"][rep][m] / pair[False]["reps"][rep][m]
                for m in ("ttft_p50_ms", "ttft_p95_ms")
            }
            for rep in REPS
        }
        rows.append({"rate": rate, "fcfs": pair[False], "lpm": pair[True], "lpm_over_fcfs": ratios})
        print(json.dumps({"rate": rate, "lpm_over_fcfs": ratios}), flush=True)
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
