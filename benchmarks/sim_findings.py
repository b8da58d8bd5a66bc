"""The study's findings F1-F5 (§6) recomputed on the sim backend (paired by seed, geometric means).

    .venv/bin/python benchmarks/sim_findings.py --traces /tmp/simtr

Uses the traces of the grid (compiled as for benchmarks/sim_grid.py) plus, for F3's run-length
effect, three extra traces of the rate-0.28 condition at 300, 600 and 1200 s (compiled under
TRACES/runlength-{T}/). Prints markdown used in docs/simulator.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_calibrate import simulate

from servelab.grid.config import Condition, conditions, load_config, trace_seed
from servelab.sim.cost import DEFAULT_CALIBRATION

REPS = ("rep1", "rep2", "rep3")


def gm(x: list[float]) -> float:
    return float(math.exp(np.mean(np.log(x))))


def metrics(
    cfg: dict[str, Any], traces: Path, arm: str, engine: str, cond: str, work: Path
) -> list[dict[str, float]]:
    return [
        simulate(cfg, traces, arm, engine, cond, rep, DEFAULT_CALIBRATION, work)[0] for rep in REPS
    ]


def gap(v: list[dict[str, float]], s: list[dict[str, float]], k: str) -> float:
    """Paired engine gap: vLLM / SGLang for latency, SGLang / vLLM for throughput."""
    if k == "X":
        return gm([b[k] / a[k] for a, b in zip(v, s, strict=True)])
    return gm([a[k] / b[k] for a, b in zip(v, s, strict=True)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--traces", type=Path, required=True)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    tr = args.traces
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        m: dict[tuple[str, str, str], list[dict[str, float]]] = {}

        def get(arm: str, engine: str, cond: str) -> list[dict[str, float]]:
            if (arm, engine, cond) not in m:
                m[arm, engine, cond] = metrics(cfg, tr, arm, engine, cond, work)
            return m[arm, engine, cond]

        print(
            "### F1: the default gap appears under load, first in the tail; SGLang decodes slower"
        )
        print("| rate | TTFT p50 gap | TTFT p95 gap | TPOT SGLang/vLLM | X SGLang/vLLM |")
        print("|---|---|---|---|---|")
        for c in ("rate-0.05", "rate-0.12", "rate-0.20", "rate-0.28", "rate-0.40"):
            v, s = get("defaults", "vllm", c), get("defaults", "sglang", c)
            tpot = gm([b["tpot50"] / a["tpot50"] for a, b in zip(v, s, strict=True)])
            print(
                f"| {c[5:]} | {gap(v, s, 'ttft50'):.2f} | {gap(v, s, 'ttft95'):.2f} | "
                f"{tpot:.2f} | {gap(v, s, 'X'):.3f} |"
            )

        print("\n### F2: matching chunked prefill removes part of the gap (phi, Eq. 7)")
        print("| condition | metric | defaults gap | matched gap | removed phi |")
        print("|---|---|---|---|---|")
        for c in ("rate-0.12", "rate-0.28", "length-8192"):
            vd, sd = get("defaults", "vllm", c), get("defaults", "sglang", c)
            vm, sm = get("matched", "vllm", c), get("matched", "sglang", c)
            for k in ("ttft50", "ttft95", "X") if c == "rate-0.28" else ("ttft50", "ttft95"):
                d, mt = gap(vd, sd, k), gap(vm, sm, k)
                phi = (
                    f"{math.log(d / mt) / math.log(d):.0%}"
                    if abs(math.log(d)) > math.log(1.1)
                    else "—"
                )
                print(f"| {c} | {k} | {d:.2f} | {mt:.2f} | {phi} |")

        print("\n### F3: near saturation the median gap measures queue growth (Eq. 8)")
        print("| condition | rep | delta | X vLLM | X SGLang | T s | predicted vLLM p50 | sim |")
        print("|---|---|---|---|---|---|---|---|")
        for arm, c in (
            ("defaults", "rate-0.20"),
            ("defaults", "rate-0.28"),
            ("matched", "rate-0.28"),
        ):
            v, s = get(arm, "vllm", c), get(arm, "sglang", c)
            dur = conditions(cfg)[c].duration_s
            offered = conditions(cfg)[c].rate * 6
            for rep, a, b in zip(REPS, v, s, strict=True):
                delta = 1 - a["X"] / b["X"]
                if delta > 0.01 and b["X"] >= 0.97 * offered:
                    pred = b["ttft50"] + dur / 2 * delta / (1 - delta)
                    print(
                        f"| {arm} {c} | {rep} | {delta:.3f} | {a['X']:.3f} | {b['X']:.3f} | "
                        f"{dur:.0f} | {pred:.1f} | {a['ttft50']:.1f} |"
                    )
        print("\nRun length (defaults, rate 0.28, rep1 seed, traces of 300/600/1200 s):")
        print("| run length s | vLLM p50 s | SGLang p50 s | gap |")
        print("|---|---|---|---|")
        c0 = conditions(cfg)["rate-0.28"]
        for dur in (300, 600, 1200):
            folder = f"runlength-{dur}"
            d = tr / folder / "rep1"
            if not (d / "manifest.json").is_file():
                from servelab.workload import compile_trace_files

                compile_trace_files(
                    condition=Condition(
                        id=folder,
                        sweep="rate",
                        rate=c0.rate,
                        sharing=c0.sharing,
                        prompt_tokens=c0.prompt_tokens,
                        duration_s=float(dur),
                    ),
                    rep="rep1",
                    seed=trace_seed(int(cfg["campaign_seed"]), "rate-0.28", "rep1"),
                    workload=cfg["workload"],
                    tokenizer=cfg["tokenizer"],
                    trace_path=d / "trace.parquet",
                    manifest_path=d / "manifest.json",
                )
            res = {}
            for engine in ("vllm", "sglang"):
                res[engine] = _run_custom(cfg, tr, folder, engine, work)
            print(
                f"| {dur} | {res['vllm']['ttft50']:.1f} | {res['sglang']['ttft50']:.2f} | "
                f"{res['vllm']['ttft50'] / res['sglang']['ttft50']:.1f} |"
            )

        print("\n### F4: at equal throughput a tail advantage survives matching")
        print("| condition | X vLLM | X SGLang | p50 gap | p95 gap |")
        print("|---|---|---|---|---|")
        for c in ("rate-0.12", "rate-0.28", "length-8192"):
            v, s = get("matched", "vllm", c), get("matched", "sglang", c)
            print(
                f"| matched {c} | {gm([x['X'] for x in v]):.3f} | {gm([x['X'] for x in s]):.3f} | "
                f"{gap(v, s, 'ttft50'):.2f} | {gap(v, s, 'ttft95'):.2f} |"
            )

        print("\n### F5: the gap shrinks and reverses as sharing grows; KV peak falls")
        print(
            "| sigma | TTFT p50 gap | vLLM p50 s | SGLang p50 s | KV peak vLLM | KV peak SGLang |"
        )
        print("|---|---|---|---|---|---|")
        for c in ("sharing-0.00", "sharing-0.30", "sharing-0.60", "sharing-0.90", "sharing-0.95"):
            v, s = get("defaults", "vllm", c), get("defaults", "sglang", c)
            print(
                f"| {c[8:]} | {gap(v, s, 'ttft50'):.2f} | {gm([x['ttft50'] for x in v]):.2f} | "
                f"{gm([x['ttft50'] for x in s]):.2f} | {np.mean([x['kv'] for x in v]):.2f} | "
                f"{np.mean([x['kv'] for x in s]):.2f} |"
            )
    return 0


def _run_custom(
    cfg: dict[str, Any], traces: Path, folder: str, engine: str, work: Path
) -> dict[str, float]:
    """A defaults-arm run on a trace whose condition id is not in the grid (run-length study)."""
    from sim_calibrate import run_metrics

    from servelab.grid.config import deployment_for
    from servelab.sim.run import simulate_run_files

    dep = deployment_for(cfg, "defaults", engine, "rate-0.28")
    out = work / folder / engine
    simulate_run_files(
        trace_path=traces / folder / "rep1" / "trace.parquet",
        manifest_path=traces / folder / "rep1" / "manifest.json",
        arm="defaults",
        engine=engine,
        condition=folder,
        rep="rep1",
        flags=list(dep.flags),
        gpu_name=cfg["gpu"]["name"],
        gpu_memory_mib=int(cfg["gpu"]["memory_mib"]),
        model_preset=cfg["model"]["preset"],
        deployment_id=dep.id,
        warmup_requests=20,
        request_timeout_s=float(cfg["dispatch"]["request_timeout_s"]),
        stream_interval=1,
        telemetry_step_s=5.0,
        success_threshold=0.95,
        offered_load_rps=1.68,
        attempt=1,
        faults=[],
        requests_path=out / "requests.parquet",
        scrape_path=out / "scrape.parquet",
        run_json_path=out / "run.json",
    )
    return run_metrics(out)


if __name__ == "__main__":
    sys.exit(main())
