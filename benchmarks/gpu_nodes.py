"""N GPU nodes on the local backend: wall time near 1/N, the artifacts of one node, the lag of N
dispatchers on one machine (issue 27; docs/benchmarks/gpu-nodes.md).

Runs the real workflow (`snakemake --cores N results/table5.csv`) in a scratch folder per N, on
the local backend (the simulated engines' live servers, a real Prometheus, the real dispatcher),
with config `campaign.gpu_nodes: N` over the same small grid: both arms, both study engines (four
deployments), RATES graphs/s of DURATION s each, one repetition. For each N it prints the wall
time, the runs' schedule lag (requests.parquet `sent_s - scheduled_s`, trace requests) and how many
runs measured beside another node's (overlapping run windows); then, against N = 1, which fields of
requests.parquet and run.json differ, by name.

    python benchmarks/gpu_nodes.py [--nodes 1 2 3] [--duration 12] [--json OUT]

Needs the `prometheus` binary (Debian package). Every process the workflow starts is stopped by the
workflow (its onsuccess/onerror); the folders are removed unless --keep.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parents[1]
RATES = (0.2, 0.28, 0.4)
# requests.parquet columns that hold what was measured rather than when (compared across N; not
# scheduled_s either: a dependant is due when its predecessors finished, on the wall clock)
OUTCOME_COLUMNS = (
    "request_id",
    "graph_id",
    "role",
    "warmup",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "status",
    "error",
)
# run.json fields that are wall-clock by nature, or name where the run was
WALL_CLOCK = {
    "start_unix_s",
    "end_unix_s",
    "wall_s",
    "duration_s",
    "trace_start_s",
    "node",
    "local",
    "machine_load",
    "dispatcher",
    "dispatcher_lag_s",
    "wire_lag_s",
    "server_lag_s",
    "measured_window",
    "git_commit",
}


# A flag that changes no measurement but gives each (arm, engine, condition) a deployment of its
# own: the engine's random seed (vLLM `--seed`, SGLang `--random-seed`; both in the registry's
# argparse tables, servelab.engines._cli_tables). Greedy sampling does not read it.
SEED_FLAG = {"vllm": "--seed", "sglang": "--random-seed"}


def config_for(nodes: int, duration_s: float, grid: str = "study") -> dict[str, Any]:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["backend"] = "local"
    config["repetitions"] = 1
    config["conditions"] = [
        {
            "sweep": "rate",
            "rate": r,
            "sharing": 0.9,
            "prompt_tokens": 1024,
            "duration_s": duration_s,
        }
        for r in RATES
    ]
    config["analysis"]["table_conditions"] = [f"rate-{r:.2f}" for r in RATES]
    # the matched arm over the same conditions, one deployment an engine (no 8,192-token runs)
    matched = config["arms"]["matched"]
    matched["conditions"] = "all"
    matched["engines"]["sglang"].pop("flags_by_condition", None)
    matched["engines"]["sglang"].pop("skip_conditions", None)
    if grid == "per-condition":
        # twelve deployments of equal length, so that N = 2 and N = 3 both divide them evenly
        for arm in config["arms"].values():
            for engine, espec in arm["engines"].items():
                espec["flags_by_condition"] = {
                    f"rate-{r:.2f}": [f"{SEED_FLAG[engine]}={k}"] for k, r in enumerate(RATES)
                }
    config["dispatch"].update(warmup_requests=2, health_timeout_s=60)
    config["campaign"].update(gpu_nodes=nodes, pause_between_runs_s=0, faults=[])
    return config


def run_campaign(work: Path, config: dict[str, Any], cores: int) -> float:
    (work / "config").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    snakemake = Path(sys.executable).parent / "snakemake"
    start = time.perf_counter()
    proc = subprocess.run(
        [
            str(snakemake),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--cores",
            str(cores),
            "results/table5.csv",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"N={config['campaign']['gpu_nodes']}: {proc.stderr[-4000:]}")
    return wall


def run_dirs(work: Path) -> Iterator[Path]:
    """Each published run ({arm}/{engine}/{condition}/{rep}; not its measured/ or attempts/)."""
    yield from sorted(p.parent for p in (work / "results" / "runs").glob("*/*/*/rep*/run.json"))


def lags_ms(work: Path, column: str = "sent_s") -> np.ndarray:
    """Every trace request's lag behind its due time, ms: at the scheduler (`sent_s`) or on the
    wire (`written_s`, its last byte written: the documented on-wire figure's definition)."""
    out = []
    for run in run_dirs(work):
        t = pq.read_table(run / "requests.parquet").to_pydict()
        out += [
            (at - due) * 1e3
            for at, due, warm in zip(t[column], t["scheduled_s"], t["warmup"], strict=True)
            if not warm and at is not None
        ]
    return np.asarray(out)


def windows(work: Path) -> list[tuple[str, str, float, float]]:
    out = []
    for run in run_dirs(work):
        record = json.loads((run / "run.json").read_text())
        node = record["node"]["start"].get("node_id", "")
        out.append((str(run.relative_to(work)), node, record["start_unix_s"], record["end_unix_s"]))
    return out


def overlapping(work: Path) -> int:
    """Runs whose window overlaps a run of another node."""
    w = windows(work)
    return sum(any(n != m and s < f2 and s2 < f for _, m, s2, f2 in w) for _, n, s, f in w)


def differences(one: Path, other: Path) -> dict[str, Any]:
    """What differs between two campaigns' runs: outcome columns of requests.parquet, and run.json
    fields outside WALL_CLOCK (by name, with how many runs)."""
    runs_one = {str(p.relative_to(one)): p for p in run_dirs(one)}
    runs_other = {str(p.relative_to(other)): p for p in run_dirs(other)}
    out: dict[str, Any] = {
        "runs": len(runs_one),
        "missing": sorted(set(runs_one) ^ set(runs_other)),
        "requests_columns": {},
        "run_json_fields": {},
    }
    for rel in sorted(set(runs_one) & set(runs_other)):
        a = pq.read_table(runs_one[rel] / "requests.parquet").to_pydict()
        b = pq.read_table(runs_other[rel] / "requests.parquet").to_pydict()
        for column in OUTCOME_COLUMNS:
            if a[column] != b[column]:
                out["requests_columns"][column] = out["requests_columns"].get(column, 0) + 1
        ra = json.loads((runs_one[rel] / "run.json").read_text())
        rb = json.loads((runs_other[rel] / "run.json").read_text())
        for key in sorted(set(ra) | set(rb)):
            if key not in WALL_CLOCK and ra.get(key) != rb.get(key):
                out["run_json_fields"][key] = out["run_json_fields"].get(key, 0) + 1
    return out


def row_for(work: Path, wall: float) -> dict[str, Any]:
    lag, wire = lags_ms(work), lags_ms(work, "written_s")
    return {
        "wall_s": round(wall, 1),
        "runs": len(list(run_dirs(work))),
        "overlapping_runs": overlapping(work),
        "lag_ms_median": round(float(np.median(lag)), 3),
        "lag_ms_p99": round(float(np.percentile(lag, 99)), 3),
        "lag_ms_max": round(float(lag.max()), 3),
        "wire_lag_ms_median": round(float(np.median(wire)), 3),
        "wire_lag_ms_p99": round(float(np.percentile(wire, 99)), 3),
        "requests": int(lag.size),
    }


def reanalyse(root: Path, figures_path: Path, nodes: list[int]) -> int:
    figures = json.loads(figures_path.read_text())
    first = nodes[0]
    for n in nodes:
        row = row_for(root / f"nodes-{n}", figures[f"N={n}"]["wall_s"])
        if n != first:
            row["wall_ratio_to_first"] = round(row["wall_s"] / figures[f"N={first}"]["wall_s"], 3)
            row["differences_from_first"] = differences(
                root / f"nodes-{first}", root / f"nodes-{n}"
            )
        figures[f"N={n}"] = row
        print(f"N={n}: {json.dumps(row)}")
    figures_path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument(
        "--grid",
        choices=("study", "per-condition"),
        default="study",
        help="study: one deployment per (arm, engine), four in all; per-condition: one per "
        "(arm, engine, condition), twelve of equal length",
    )
    parser.add_argument("--keep", type=Path, help="run under this folder and keep it")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--reanalyse",
        action="store_true",
        help="read the campaigns kept under --keep again (wall times from --json) and rewrite it",
    )
    args = parser.parse_args()
    if args.reanalyse:
        return reanalyse(args.keep, args.json, args.nodes)
    root = args.keep or Path(tempfile.mkdtemp(prefix="servelab-nodes-"))
    machine = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_1m_before": os.getloadavg()[0],
    }
    print(f"machine: {machine}")
    figures: dict[str, Any] = {
        "machine": machine,
        "rates": RATES,
        "duration_s": args.duration,
        "grid": args.grid,
    }
    works: dict[int, Path] = {}
    for n in args.nodes:
        work = root / f"nodes-{n}"
        shutil.rmtree(work, ignore_errors=True)
        config = config_for(n, args.duration, args.grid)
        wall = run_campaign(work, copy.deepcopy(config), cores=max(n, 1) + 1)
        works[n] = work
        row = row_for(work, wall)
        if n != args.nodes[0]:
            row["wall_ratio_to_first"] = round(wall / figures[f"N={args.nodes[0]}"]["wall_s"], 3)
            row["differences_from_first"] = differences(works[args.nodes[0]], work)
        figures[f"N={n}"] = row
        print(f"N={n}: {json.dumps(row)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
