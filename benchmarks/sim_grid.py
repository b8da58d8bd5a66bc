"""Wall time to simulate the study's whole grid (99 runs) and each run, on precompiled traces.

    .venv/bin/python benchmarks/sim_grid.py --traces /tmp/simtr [--jobs 2] [--only rate-0.28,rate-0.40]

Traces come from `servelab trace compile --condition C --rep R --out TRACES/C/R` (trace compilation is
the workload's cost and is benchmarked in benchmarks/trace_compile.py); a missing trace is compiled
first and not timed. Prints one line per run (wall seconds, virtual seconds, iterations) and the
totals, plus the machine. Targets (issue 3): <= 5 s per run at rate-0.28 and rate-0.40, <= 3 minutes
for the grid on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from servelab.grid.config import load_config, runs


def _compile_missing(cfg_path: str, traces: Path, needed: set[tuple[str, str]]) -> None:
    for cond, rep in sorted(needed):
        if not (traces / cond / rep / "manifest.json").is_file():
            print(f"compiling {cond}/{rep} (not timed)", flush=True)
            cmd = [sys.executable, "-m", "servelab.cli", "trace", "compile", "--config", cfg_path]
            cmd += ["--condition", cond, "--rep", rep, "--out", str(traces / cond / rep)]
            subprocess.run(cmd, check=True)


def _one(args: tuple[str, str, str, str, str, str]) -> tuple[str, float, float, int, str]:
    cfg_path, traces, arm, engine, cond, rep = args
    from servelab.sim.run import simulate_config_run

    cfg = load_config(cfg_path)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        t = time.perf_counter()
        rec = simulate_config_run(
            cfg,
            arm=arm,
            engine=engine,
            condition=cond,
            rep=rep,
            trace_dir=Path(traces) / cond / rep,
            out_dir=out,
        )
        wall = time.perf_counter() - t
    run_id = f"{arm}/{engine}/{cond}/{rep}"
    return (
        run_id,
        wall,
        float(rec["sim"]["virtual_duration_s"]),
        int(rec["sim"]["iterations"]),
        rec["status"],
    )


def machine() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()[:10]
    return (
        f"nproc={os.cpu_count()} python={platform.python_version()} "
        f"platform={platform.platform()}\n" + "\n".join(lscpu)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=1, help="parallel processes")
    ap.add_argument("--only", default="", help="comma-separated condition ids")
    ap.add_argument("--json", action="store_true", help="end with a JSON line of the totals")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    grid = runs(cfg)
    if args.only:
        keep = set(args.only.split(","))
        grid = [r for r in grid if r.condition in keep]
    _compile_missing(args.config, args.traces, {(r.condition, r.rep) for r in grid})
    work = [(args.config, str(args.traces), r.arm, r.engine, r.condition, r.rep) for r in grid]
    print(machine())
    print(f"{len(work)} runs, {args.jobs} process(es)")
    t0 = time.perf_counter()
    results: list[Any] = []
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for res in pool.map(_one, work):
                results.append(res)
                print(f"{res[0]:<40} wall {res[1]:6.2f} s  virtual {res[2]:7.1f} s  "
                      f"iterations {res[3]:6d}  {res[4]}", flush=True)  # fmt: skip
    else:
        for w in work:
            res = _one(w)
            results.append(res)
            print(f"{res[0]:<40} wall {res[1]:6.2f} s  virtual {res[2]:7.1f} s  "
                  f"iterations {res[3]:6d}  {res[4]}", flush=True)  # fmt: skip
    total = time.perf_counter() - t0
    walls = sorted(r[1] for r in results)
    print(f"grid wall time: {total:.1f} s for {len(results)} runs "
          f"(sum of run times {sum(walls):.1f} s, max run {walls[-1]:.2f} s, "
          f"median {walls[len(walls) // 2]:.2f} s)")  # fmt: skip
    if args.json:
        print(json.dumps({"grid_wall_s": round(total, 1), "runs": len(results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
