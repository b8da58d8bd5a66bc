"""The sim-vs-real rules: the CPU platform's fit depends on the floor alone (no loaded run is in its
part of the DAG), every run of the grid is predicted and compared, and the CPU pair runs on the sim
backend with a fitted platform (config/cpu-pair-sim.yaml) through the real Snakefile."""

from __future__ import annotations

import csv
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from servelab.grid.config import floor_blocks, load_config

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIGS = ("--configfile", "config/cpu-pair.yaml", "config/sim-vs-real.yaml")


def snakemake(
    *args: str, cwd: Path = REPO, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    command = [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--cores", "1"]
    return subprocess.run(
        [*command, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:", 1)[1]
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)
        if m.group(1) != "total"
    }


def test_the_platform_fit_needs_the_floor_and_no_loaded_run() -> None:
    done = snakemake("-n", "--forceall", "results/sim_vs_real/platform.json", *CONFIGS)
    assert done.returncode == 0, done.stderr[-2000:]
    jobs = job_counts(done.stdout)
    assert jobs["cpu_platform"] == 1 and jobs["floor_run"] > 0
    # the loaded runs and their traces are not in the fit's part of the DAG
    assert "run" not in jobs and "compile_trace" not in jobs and "predict_run" not in jobs


def test_the_comparison_predicts_every_run_of_the_grid_once() -> None:
    done = snakemake("-n", "--forceall", "results/sim_vs_real.csv", *CONFIGS)
    assert done.returncode == 0, done.stderr[-2000:]
    jobs = job_counts(done.stdout)
    config = yaml.safe_load((REPO / "config" / "sim-vs-real.yaml").read_text())
    blocks = 2 * 2 * len(config["conditions"])  # arms x engines x rates
    assert jobs["run"] == blocks
    assert jobs["predict_run"] == blocks * config["repetitions"]
    assert jobs["sim_vs_real"] == 1 and jobs["cpu_platform"] == 1
    # the bracket (config floor.bracket): every floor made again after its deployment's runs
    assert jobs["floor_after_run"] == jobs["floor_run"] and jobs["floor_drift"] == 1


def floors_of(arm: str, engine: str) -> tuple[str, list[str]]:
    """(the deployment id, its floor shapes) of one arm and engine of the comparison's grid."""
    config = load_config(
        REPO / "config" / "config.yaml",
        [REPO / "config" / "cpu-pair.yaml", REPO / "config" / "sim-vs-real.yaml"],
    )
    blocks = [
        b for b in floor_blocks(config) if (b.deployment.arm, b.deployment.engine) == (arm, engine)
    ]
    return blocks[0].deployment.id, [b.shape.id for b in blocks]


def test_the_bracket_puts_each_deployments_floors_on_either_side_of_its_own_runs() -> None:
    deployment, shapes = floors_of("matched", "llamacpp")
    # a block of loaded runs waits for its deployment's floor, and for no other deployment's
    run = snakemake(
        "-n", "--forceall", "results/runs/matched/llamacpp/rate-1.00/block.json", *CONFIGS
    )
    assert run.returncode == 0, run.stderr[-2000:]
    jobs = job_counts(run.stdout)
    assert jobs["floor_run"] == len(shapes) and jobs["run"] == 1 and "floor_after_run" not in jobs
    assert run.stdout.count(f"measure the unloaded floor of {deployment} on") == len(shapes)
    # the floor after waits for every block of its deployment's loaded runs
    after = f"results/floor-after/{deployment}/runs/matched/llamacpp/{shapes[0]}/block.json"
    done = snakemake("-n", "--forceall", after, *CONFIGS)
    assert done.returncode == 0, done.stderr[-2000:]
    jobs = job_counts(done.stdout)
    config = yaml.safe_load((REPO / "config" / "sim-vs-real.yaml").read_text())
    assert jobs["run"] == len(config["conditions"]) and jobs["floor_after_run"] == 1
    measured = re.findall(r"run every repetition of (\S+)/rate-", done.stdout)
    assert set(measured) == {"matched/llamacpp"}, measured


def test_without_the_bracket_the_runs_wait_for_no_floor(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    (tmp_path / "config" / "off.yaml").write_text("floor: {bracket: null}\n")
    done = snakemake(
        "-n", "--forceall", "results/sim_vs_real.csv", *CONFIGS, "config/off.yaml", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    jobs = job_counts(done.stdout)
    assert "floor_after_run" not in jobs and "floor_drift" not in jobs
    run = snakemake(
        "-n",
        "--forceall",
        "results/runs/matched/llamacpp/rate-1.00/block.json",
        *CONFIGS,
        "config/off.yaml",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "floor_run" not in job_counts(run.stdout)


def test_every_condition_of_the_comparison_offers_twelve_graphs_a_repetition() -> None:
    # a repetition of fewer graphs is one graph's critical path, not a rate's percentiles
    config = yaml.safe_load((REPO / "config" / "sim-vs-real.yaml").read_text())
    offered = {f"rate-{c['rate']:.2f}": c["rate"] * c["duration_s"] for c in config["conditions"]}
    assert offered and all(graphs >= 12 for graphs in offered.values()), offered


def on_the_sim_backend(
    tmp_path: Path, target: str, overlays: tuple[str, ...], short: str
) -> tuple[str, ...]:
    """Make `target` in a scratch folder: the CPU pair on the sim backend with its fitted
    platform (config/cpu-pair-sim.yaml), then `overlays`, then `short` (YAML) last. Returns the
    `--configfile` arguments it used."""
    shutil.copytree(REPO / "config", tmp_path / "config")
    (tmp_path / "config" / "short.yaml").write_text(short)
    configs = ("config/cpu-pair.yaml", "config/cpu-pair-sim.yaml", *overlays, "config/short.yaml")
    done = snakemake(target, "--configfile", *configs, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return ("--configfile", *configs)


def test_the_cpu_pair_runs_on_the_sim_backend_with_a_fitted_platform(tmp_path: Path) -> None:
    short = {"repetitions": 1, "dispatch": {"warmup_requests": 1}}
    on_the_sim_backend(tmp_path, "results/table5.csv", (), yaml.safe_dump(short))
    with (tmp_path / "results" / "table5.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows, "Table 5 is empty"
    logs = sorted((tmp_path / "results" / "deployments").glob("*llamacpp*/startup.log"))
    assert len(logs) == 2, logs  # both arms, confirmed by the gate from the simulated log
    resolved = {p.parent.name.split("-")[0]: p.parent / "resolved.json" for p in logs}
    assert '"chunk_size": 256' in resolved["matched"].read_text()
    assert '"chunked_prefill": false' in resolved["defaults"].read_text()


# The comparison's grid cut short: two rates, one repetition, one floor shape beside the rate's
# (two floor repetitions: the quiet-floor bar needs their spread).
SHORT_BRACKET = """
repetitions: 1
conditions:
  - {sweep: rate, rate: 0.5, sharing: 0.5, prompt_tokens: 1024, duration_s: 8}
  - {sweep: rate, rate: 3.0, sharing: 0.5, prompt_tokens: 1024, duration_s: 8}
floor:
  requests: 8
  repetitions: 2
  warmup_requests: 2
  warmup_requests_by_engine: {llamacpp: 4}
  shapes:
    - {sharing: 0.0, prompt_tokens: 512}
"""


def test_on_the_sim_backend_each_deployment_is_floored_run_and_floored_again_in_turn(
    tmp_path: Path,
) -> None:
    configs = on_the_sim_backend(
        tmp_path, "results/sim_vs_real.csv", ("config/sim-vs-real.yaml",), SHORT_BRACKET
    )
    results = tmp_path / "results"
    # every block, in the order its block.json was written: deployment by deployment, the floor
    # before, then the loaded runs, then the floor after
    blocks = sorted(results.glob("**/block.json"), key=lambda p: p.stat().st_mtime_ns)
    phases = []
    for path in blocks:
        part = path.relative_to(results).parts
        if part[0] == "runs":
            phases.append((f"{part[1]}/{part[2]}", "run"))
        else:
            phases.append((f"{part[3]}/{part[4]}", part[0]))  # floor or floor-after
    turns = [k for k, _ in itertools.groupby(phases)]
    assert len(turns) == 12, turns  # 4 deployments x (floor, run, floor-after), never interleaved
    for k in range(0, 12, 3):
        assert [phase for _, phase in turns[k : k + 3]] == ["floor", "run", "floor-after"], turns
        assert len({d for d, _ in turns[k : k + 3]}) == 1, turns
    # the simulator's floors are the same twice: every deployment agrees and is judged
    drift = json.loads((results / "sim_vs_real" / "floor_drift.json").read_text())
    assert all(d["agrees"] and d["pairs"] == 4 for d in drift["deployments"].values()), drift
    # the simulator's floors differ by their seeds alone: quiet by the bar
    assert all(d["quiet"] and d["judged"] for d in drift["deployments"].values()), drift
    summary = json.loads((results / "sim_vs_real.json").read_text())
    assert len(summary["bracket"]["judged"]) == 4 and summary["bracket"]["refused"] == []

    # A refused deployment made again as docs/simulator.md says ("The bracketing floor"): with
    # its engine's other deployment, since the fit pools both; `servelab campaign redo --engine`
    # moves their floors and runs aside, then the target with one of their runs named.
    deployments = sorted(p.parent.name for p in results.glob("floor-after/*-llamacpp-*/runs"))
    assert len(deployments) == 2, deployments
    command = ["campaign", "redo", "--engine", "llamacpp", "--why", "drift", *configs]
    redo = subprocess.run(
        [str(BIN / "servelab"), *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert redo.returncode == 0, redo.stderr[-2000:]
    targets = redo.stdout.splitlines()[-1].removeprefix("targets: ").split()
    assert sorted(targets) == sorted(
        f"results/runs/{arm}/llamacpp/rate-{rate}/rep1/run.json"
        for arm in ("defaults", "matched")
        for rate in ("0.50", "3.00")
    ), redo.stdout
    left = [p for kind in ("floor", "floor-after") for p in results.glob(f"{kind}/*-llamacpp-*")]
    assert not left, f"a llama.cpp floor was left in place: {left}"
    assert len(list(results.glob("floor-after/*-vllm-*"))) == 2  # vLLM's untouched
    # the target alone: Snakemake does not re-make a missing file the present target needs
    alone = snakemake("-n", "results/sim_vs_real.csv", *configs, cwd=tmp_path)
    assert alone.returncode == 0 and "Nothing to be done" in alone.stdout, alone.stdout[-2000:]
    plan = snakemake("-n", "results/sim_vs_real.csv", targets[0], *configs, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr[-2000:]
    jobs = job_counts(plan.stdout)
    floors = len(list((results / "redone" / "floor").glob("*/001/runs/*/*/*/block.json")))
    assert (jobs["floor_run"], jobs["floor_after_run"], jobs["run"]) == (floors, floors, 4), jobs
    assert set(re.findall(r"unloaded floor of (\S+) on", plan.stdout)) == set(deployments)
    assert set(re.findall(r"run every repetition of (\S+)/rate-", plan.stdout)) == {
        "defaults/llamacpp",
        "matched/llamacpp",
    }
    assert jobs["cpu_platform"] == jobs["floor_drift"] == jobs["sim_vs_real"] == 1, jobs
