"""Simulated vs study values: the calibration (defaults-arm rate sweep) and validation tables.

Runs the simulator on precompiled traces (`servelab trace compile`, one folder per condition/rep under
--traces) and prints, per condition and engine, the run metrics of docs/analysis.md (geometric
means over repetitions; KV peak arithmetic) beside the study's values where the paper gives them.

    .venv/bin/python benchmarks/sim_calibrate.py --traces /tmp/simtr --set rate        # calibration
    .venv/bin/python benchmarks/sim_calibrate.py --traces /tmp/simtr --set validation  # no re-tuning
    .venv/bin/python benchmarks/sim_calibrate.py ... --cal gemm_efficiency=0.5 ...     # explore

Metric definitions are reimplemented here (not imported from servelab.analysis) so the script runs on
its own; they follow docs/analysis.md: measured requests exclude warm-ups and graph 0; TTFT = first chunk -
sent; TPOT = (last - first chunk)/(n - 1); X = N_ok / W.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from servelab.artifacts import REQUESTS_SCHEMA, SCRAPE_SCHEMA, read_parquet
from servelab.grid.config import arm_conditions, load_config
from servelab.grid.settings import PlatformSettings
from servelab.sim.cost import DEFAULT_CALIBRATION, Calibration
from servelab.sim.platform import PlatformModel
from servelab.sim.run import simulate_config_run

KV_NAMES = {"vllm:gpu_cache_usage_perc", "sglang:token_usage"}
QUEUE_NAMES = {"vllm:num_requests_waiting", "sglang:num_queue_reqs"}
RUNNING_NAMES = {"vllm:num_requests_running", "sglang:num_running_reqs"}

# Study values quoted in the paper (§5-7, Tables 4-6, Figures 6-10), keyed (arm, engine, condition).
# ttft in s, tpot in ms, X in req/s. Derived entries say how in STUDY_NOTES.
STUDY: dict[tuple[str, str, str], dict[str, float]] = {
    ("defaults", "vllm", "rate-0.12"): {"ttft50": 0.52, "ttft95": 12.5},
    ("defaults", "sglang", "rate-0.12"): {"ttft50": 0.468, "ttft95": 1.311},
    ("defaults", "vllm", "rate-0.20"): {"ttft50": 4.6},
    ("defaults", "sglang", "rate-0.20"): {"ttft50": 0.57},
    ("defaults", "vllm", "rate-0.28"): {"ttft50": 45.5, "ttft95": 79.0, "tpot50": 112.0, "X": 1.36},
    ("defaults", "sglang", "rate-0.28"): {
        "ttft50": 1.089,
        "ttft95": 17.8,
        "tpot50": 139.0,
        "X": 1.66,
    },
    ("defaults", "vllm", "rate-0.40"): {"X": 1.40},
    ("defaults", "sglang", "rate-0.40"): {"ttft50": 9.5, "X": 1.94},
    ("matched", "vllm", "rate-0.12"): {"ttft50": 0.44},
    ("matched", "sglang", "rate-0.12"): {"ttft50": 0.458, "ttft95": 1.241, "X": 0.770},
    ("matched", "vllm", "rate-0.28"): {"ttft50": 13.9, "tpot50": 125.0, "X": 1.58},
    ("matched", "sglang", "rate-0.28"): {"ttft50": 0.961, "ttft95": 16.72, "X": 1.66},
    ("defaults", "vllm", "length-8192"): {"ttft50": 63.3},
    ("matched", "vllm", "length-8192"): {"X": 0.345},
    ("matched", "sglang", "length-8192"): {"ttft50": 0.866, "ttft95": 4.088, "X": 0.349},
    ("defaults", "vllm", "sharing-0.00"): {"kv": 0.89},
    ("defaults", "sglang", "sharing-0.00"): {"kv": 0.87},
    ("defaults", "vllm", "sharing-0.95"): {"kv": 0.42},
    ("defaults", "sglang", "sharing-0.95"): {"kv": 0.27},
}
STUDY_NOTES = """\
study values: rate-0.12 defaults from §7.1 (vLLM p50 0.52 s, p95 12.5 s) and Table 4 (SGLang);
rate-0.20 vLLM p50 = geometric mean of the three medians in §7.2 (3.0, 3.3, 10.1 s), SGLang = that / 8.13;
rate-0.28 vLLM p50 45.5 s and p95 = 1.7 x p50 (§7.1), TPOT 112 ms (§6.2), X = 1.66 / 1.22 (Table 5);
SGLang TPOT = 1.24 x 112 (§6.1); rate-0.40 X from §1 (1.94 vs 1.40), SGLang p50 = geomean(6.2, 29.3, 4.8);
matched rate-0.12 vLLM p50 = 0.95 x SGLang's (§6.4); matched rate-0.28 vLLM p50 13.9 s (§7.1)."""

MODEL_ONLY = PlatformModel(PlatformSettings(enabled=False))

RATE_SET = [
    (a, e, c)
    for c in ("rate-0.05", "rate-0.12", "rate-0.20", "rate-0.28", "rate-0.40")
    for a, e in (("defaults", "vllm"), ("defaults", "sglang"))
]
VALIDATION_SET = (
    [
        ("matched", e, c)
        for c in ("rate-0.12", "rate-0.20", "rate-0.28", "length-8192")
        for e in ("vllm", "sglang")
    ]
    + [
        ("defaults", e, c)
        for c in ("length-512", "length-2048", "length-8192")
        for e in ("vllm", "sglang")
    ]
    + [
        ("defaults", e, c)
        for c in ("sharing-0.00", "sharing-0.30", "sharing-0.60", "sharing-0.90", "sharing-0.95")
        for e in ("vllm", "sglang")
    ]
)


def run_metrics(out: Path) -> dict[str, float]:
    reqs = read_parquet(out / "requests.parquet", REQUESTS_SCHEMA).to_pylist()
    scrape = read_parquet(out / "scrape.parquet", SCRAPE_SCHEMA).to_pylist()
    trace = [r for r in reqs if not r["warmup"]]
    meas = [r for r in trace if r["graph_id"] > 0 and r["status"] == "ok"]
    ttft = np.array([r["chunk_times_s"][0] - r["sent_s"] for r in meas])
    e2e = np.array([r["chunk_times_s"][-1] - r["sent_s"] for r in meas])
    tpot = np.array(
        [
            (r["chunk_times_s"][-1] - r["chunk_times_s"][0]) / (r["output_tokens"] - 1)
            for r in meas
            if (r["output_tokens"] or 0) >= 2
        ]
    )
    n_ok = sum(r["status"] == "ok" for r in trace)
    ends = [r["chunk_times_s"][-1] for r in trace if r["chunk_times_s"]]
    window = max(ends) - min(r["sent_s"] for r in trace if r["sent_s"] is not None)

    def peak(names: set[str]) -> float:
        return max([s["value"] for s in scrape if s["source_metric"] in names] or [0.0])

    return {
        "ttft50": float(np.percentile(ttft, 50)),
        "ttft95": float(np.percentile(ttft, 95)),
        "tpot50": float(np.median(tpot) * 1000),
        "e2e50": float(np.percentile(e2e, 50)),
        "X": n_ok / window,
        "kv": peak(KV_NAMES),
        "queue": peak(QUEUE_NAMES),
        "running": peak(RUNNING_NAMES),
        "ok": n_ok / len(trace),
    }


def _fmt(agg: dict[str, float], study: dict[str, float], k: str) -> str:
    v = f"{agg[k]:.3g}"
    return f"{v} ({study[k]:.3g})" if k in study else v


def gmean(values: list[float]) -> float:
    return float(math.exp(np.mean(np.log(np.maximum(values, 1e-12)))))


def simulate(
    cfg: dict[str, Any],
    traces: Path,
    arm: str,
    engine: str,
    cond: str,
    rep: str,
    cal: Calibration,
    work: Path,
) -> tuple[dict[str, float], dict[str, Any], float]:
    out = work / arm / engine / cond / rep
    t = time.perf_counter()
    rec = simulate_config_run(
        cfg,
        arm=arm,
        engine=engine,
        condition=cond,
        rep=rep,
        trace_dir=traces / cond / rep,
        out_dir=out,
        calibration=cal,
        # the model alone: a fit must not absorb one draw of the simulated platform
        platform=MODEL_ONLY,
    )
    wall = time.perf_counter() - t
    return run_metrics(out), rec, wall


# Calibration targets, defaults arm only, all three sweeps: (engine, condition, metric, study
# value, weight); engine "sglang/vllm" is the ratio of the two engines' values. The matched arm is
# never a target (it is the validation). Light-load TTFT is not a target: it is set by how many
# workers of a graph arrive together (the tool-call delay distribution, a workload parameter the
# paper does not give), not by the engine (docs/simulator.md). Where TTFT is a target it is
# queueing-dominated (vLLM near or past its knee) or a ratio of the engines.
FIT_TARGETS: list[tuple[str, str, str, float, float]] = [
    # rate sweep (§6.1-6.2, Table 5, §1): decode speed and capacity
    ("vllm", "rate-0.28", "tpot50", 112.0, 2.0),
    ("sglang/vllm", "rate-0.28", "tpot50", 1.24, 2.0),
    ("sglang/vllm", "rate-0.20", "tpot50", 1.12, 1.0),
    ("sglang/vllm", "rate-0.05", "tpot50", 1.00, 1.0),
    ("vllm", "rate-0.28", "X", 1.36, 2.0),
    ("sglang", "rate-0.28", "X", 1.66, 2.0),
    ("vllm", "rate-0.40", "X", 1.40, 2.0),
    ("sglang", "rate-0.40", "X", 1.94, 2.0),
    # SGLang's first (defaults-arm) deployment in Table 4: end-to-end latency pins decode speed
    ("sglang", "rate-0.12", "e2e50", 13.75, 1.0),
    ("sglang", "rate-0.28", "e2e50", 21.17, 1.0),
    ("sglang", "length-8192", "e2e50", 15.50, 1.0),
    # prompt-length sweep (§7.2, Table 5): vLLM's queue under defaults
    ("vllm", "length-8192", "ttft50", 63.3, 1.0),
    ("vllm", "length-2048", "ttft50", 0.27, 0.5),
    ("vllm", "length-512", "ttft50", 2.07, 0.5),
    # sharing sweep (§6.5, Figure 9): the gap reverses as sharing grows; KV peaks
    ("sglang/vllm", "sharing-0.30", "ttft50", 1 / 1.53, 0.5),
    ("sglang/vllm", "sharing-0.90", "ttft50", 1 / 0.81, 0.5),
    ("vllm", "sharing-0.00", "kv", 0.89, 0.5),
    ("sglang", "sharing-0.00", "kv", 0.87, 0.5),
    ("vllm", "sharing-0.95", "kv", 0.42, 0.5),
    ("sglang", "sharing-0.95", "kv", 0.27, 0.5),
]
FIT_PARAMS = (
    "gemm_efficiency",
    "bandwidth_efficiency",
    "shared_kv_dram_fraction",
    "eager_penalty_per_seq_s",
    "vllm_iteration_overhead_s",
    "vllm_per_seq_overhead_s",
)


# Where the fit starts: the constants before the 2026-12-01 recalibration (docs/simulator.md), so
# `--fit 70 --reps rep1` retraces that fit's evaluations and ends at today's constants.
FIT_START = {
    "gemm_efficiency": 0.43,
    "bandwidth_efficiency": 0.90,
    "shared_kv_dram_fraction": 0.43,
    "eager_penalty_per_seq_s": 0.00008,
    "vllm_iteration_overhead_s": 0.0068,
    "vllm_per_seq_overhead_s": 0.00006,
}


def fit(cfg: dict[str, Any], traces: Path, reps: list[str], max_evals: int) -> Calibration:
    """Nelder-Mead on FIT_PARAMS (log space) against FIT_TARGETS; prints every evaluation."""
    from scipy.optimize import minimize

    base = DEFAULT_CALIBRATION
    x0 = np.log([FIT_START[p] for p in FIT_PARAMS])
    conds = sorted({t[1] for t in FIT_TARGETS})

    def objective(x: np.ndarray) -> float:
        cal = dataclasses.replace(base, **dict(zip(FIT_PARAMS, np.exp(x).tolist(), strict=True)))
        if (
            cal.gemm_efficiency > 1
            or cal.bandwidth_efficiency > 1
            or cal.shared_kv_dram_fraction > 1
        ):
            return 1e9
        got: dict[tuple[str, str], dict[str, float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for engine in ("vllm", "sglang"):
                for cond in conds:
                    ms = [
                        simulate(cfg, traces, "defaults", engine, cond, rep, cal, Path(tmp))[0]
                        for rep in reps
                    ]
                    got[engine, cond] = {
                        k: gmean([m[k] for m in ms]) for k in ("tpot50", "X", "ttft50", "e2e50")
                    }
                    got[engine, cond]["kv"] = float(np.mean([m["kv"] for m in ms]))
        err = 0.0
        for e, c, k, v, w in FIT_TARGETS:
            sim = got[e, c][k] if "/" not in e else got["sglang", c][k] / got["vllm", c][k]
            err += w * math.log(sim / v) ** 2
        shown = ", ".join(f"{p}={getattr(cal, p):.4g}" for p in FIT_PARAMS)
        print(f"err={err:.4f}  {shown}", flush=True)
        return err

    res = minimize(
        objective, x0, method="Nelder-Mead", options={"maxfev": max_evals, "xatol": 0.02}
    )
    best = dataclasses.replace(base, **dict(zip(FIT_PARAMS, np.exp(res.x).tolist(), strict=True)))
    print(f"best: {best.to_dict()} err={res.fun:.4f}")
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--set", choices=("rate", "validation", "all"), default="rate")
    ap.add_argument("--reps", default="rep1,rep2,rep3")
    ap.add_argument("--only", default="", help="comma-separated condition ids to keep")
    ap.add_argument("--cal", nargs="*", default=[], help="calibration overrides name=value")
    ap.add_argument("--fit", type=int, default=0, help="fit FIT_PARAMS with this many evaluations")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    if args.fit:
        fit(cfg, args.traces, args.reps.split(","), args.fit)
        return 0
    cal = DEFAULT_CALIBRATION
    if args.cal:
        cal = dataclasses.replace(cal, **{k: float(v) for k, v in (x.split("=") for x in args.cal)})
    runs = {"rate": RATE_SET, "validation": VALIDATION_SET, "all": RATE_SET + VALIDATION_SET}[
        args.set
    ]
    if args.only:
        keep = set(args.only.split(","))
        runs = [r for r in runs if r[2] in keep]
    reps = args.reps.split(",")
    print(f"calibration: {cal.to_dict()}")
    cols = ("ttft50", "ttft95", "tpot50", "X", "kv", "queue", "running", "ok")
    print("| arm | engine | condition | " + " | ".join(cols) + " | wall s |")
    print("|---|---|---|" + "---|" * (len(cols) + 1))
    with tempfile.TemporaryDirectory() as tmp:
        for arm, engine, cond in runs:
            if cond not in arm_conditions(cfg, arm, engine):
                continue
            ms, walls = [], []
            for rep in reps:
                if not (args.traces / cond / rep / "manifest.json").is_file():
                    continue
                m, _, wall = simulate(cfg, args.traces, arm, engine, cond, rep, cal, Path(tmp))
                ms.append(m)
                walls.append(wall)
            if not ms:
                continue
            agg = {k: gmean([m[k] for m in ms]) for k in ("ttft50", "ttft95", "tpot50", "X")}
            agg.update(
                {k: float(np.mean([m[k] for m in ms])) for k in ("kv", "queue", "running", "ok")}
            )
            study = STUDY.get((arm, engine, cond), {})

            print(
                f"| {arm} | {engine} | {cond} | "
                + " | ".join(_fmt(agg, study, k) for k in cols)
                + f" | {np.mean(walls):.2f} |",
                flush=True,
            )
    print(f"\n({len(reps)} reps; study value in parentheses)\n{STUDY_NOTES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
