"""The simulator against the real engines, through the real Snakefile on real vLLM V1 and
llama.cpp: `snakemake --cores 1 results/sim_vs_real.csv --configfile config/cpu-pair.yaml
config/sim-vs-real.yaml`, as documented, in a scratch folder, with one more overlay that shortens
the sweep to two rates, one repetition and one floor shape (the documented sweep is 50 minutes).

Checked: every real run pinned (the engine on core 1, the client on core 0) with its machine load
in run.json; the CPU platform fitted from the floor alone, for both engines; every run predicted
and compared; the predicted side byte-identical when the fit and the predictions run again; no
server left running. This tier runs beside another campaign on two cores, so the overlay lets the
refusal pass (`max_foreign_share: 1`); the refusal itself is tested in tests/unit.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path

import pytest
from campaigns import Workdir, check_campaign_commands, documented_campaign

from servelab.campaign.plan import target_runs
from servelab.deploy.processes import read_state
from servelab.engines.llamacpp import SERVER_START
from servelab.grid.config import load_config

pytestmark = [
    pytest.mark.usefixtures("vllm_cpu_program", "llama_server_program", "prometheus_program"),
    pytest.mark.xdist_group("sim-vs-real"),
]

SHORT = """
repetitions: 1
local: {engine_cpus: [1], client_cpus: [0], max_foreign_share: 1.0}
conditions:
  - {sweep: rate, rate: 0.5, sharing: 0.5, prompt_tokens: 1024, duration_s: 8}
  - {sweep: rate, rate: 3.0, sharing: 0.5, prompt_tokens: 1024, duration_s: 8}
floor:
  requests: 8
  repetitions: 1
  bracket: {max_noise: null}  # one repetition has no spread: the drift alone is the verdict
  shapes:
    - {sharing: 0.0, prompt_tokens: 512}
"""
ARMS = ("defaults", "matched")
TARGET = ("results/sim_vs_real.csv", "--configfile")
CONFIGS = ("config/cpu-pair.yaml", "config/sim-vs-real.yaml", "config/short.yaml")


def _predicted_digests(work: Path) -> dict[str, str]:
    root = work / "results" / "sim_vs_real"
    files = [*sorted(p for p in root.glob("predicted/**/*") if p.is_file()), root / "platform.json"]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("sim-vs-real")
    documented_campaign(
        work, TARGET[0], CONFIGS, overlays={"config/short.yaml": SHORT}, timeout=1500
    )
    return work


def test_every_real_run_was_pinned_and_its_machine_load_recorded(campaign: Path) -> None:
    records = [
        json.loads(p.read_text())
        for p in sorted((campaign / "results").glob("**/runs/*/*/*/rep1/run.json"))
    ]
    assert len(records) == 3 * 2 * 2 * 2  # loaded runs, floor runs, floor runs after (bracket)
    for record in records:
        load = record["machine_load"]
        assert (load["engine_cpus"], load["client_cpus"]) == ([1], [0])
        assert load["engine"]["owned"] > 0 and load["refused"] is None
        assert record["status"] == "ok"
    for state in (campaign / "results" / "deployments").glob("*/local.json"):
        assert read_state(state)["cpus"] == [1]


def test_every_llamacpp_run_met_a_server_started_for_it(campaign: Path) -> None:
    """llama-server's requests cost more the more it has served (EngineSpec.history_cost, its host
    prompt cache): the local backend starts it afresh before every run, floor or loaded, so its
    log shows at least one start a run (docs/llamacpp.md, "A fresh server for every run")."""
    results = campaign / "results"
    deployments = sorted((results / "deployments").glob("*llamacpp*/server.log"))
    assert len(deployments) == 2  # one per arm
    for log in deployments:
        runs = [
            path
            for path in results.glob("**/runs/*/llamacpp/*/rep*/run.json")
            if json.loads(path.read_text())["deployment_id"] == log.parent.name
        ]
        assert len(runs) == 6  # two floor runs, two loaded and the two floor runs after
        lines = log.read_text(errors="replace").splitlines()
        starts = sum(1 for line in lines if SERVER_START.search(line))
        assert starts >= len(runs), f"{log}: {starts} server starts for {len(runs)} runs"


def test_the_platform_is_fitted_from_the_floor_and_every_run_compared(campaign: Path) -> None:
    platform = json.loads((campaign / "results" / "sim_vs_real" / "platform.json").read_text())
    assert set(platform["engines"]) == {"vllm_v1", "llamacpp"}
    for engine in platform["engines"].values():
        assert all(run.startswith("results/floor/") for run in engine["fit"]["runs"])
        assert engine["step_cost"]["step_s"] + engine["step_cost"]["per_sampled_s"] > 0
    with (campaign / "results" / "sim_vs_real.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["engine"], r["arm"], r["condition"]) for r in rows} == {
        (engine, arm, condition)
        for engine in ("vllm_v1", "llamacpp")
        for arm in ("defaults", "matched")
        for condition in ("rate-0.50", "rate-3.00")
    }
    for row in rows:
        assert float(row["ttft_p50_real"]) > 0 and float(row["ttft_p50_predicted"]) > 0
        assert float(row["throughput_ratio"]) > 0
    assert (campaign / "results" / "figures" / "sim_vs_real.png").stat().st_size > 0


def test_the_bracket_sets_each_deployments_floors_side_by_side(campaign: Path) -> None:
    """config/sim-vs-real.yaml's floor.bracket: each deployment floored before and after its
    loaded runs, in that order, and the comparison judging only those whose floors agree."""
    results = campaign / "results"
    drift = json.loads((results / "sim_vs_real" / "floor_drift.json").read_text())
    deployments = {f"{engine}/{arm}" for engine in ("vllm_v1", "llamacpp") for arm in ARMS}
    assert set(drift["deployments"]) == deployments
    for entry in drift["deployments"].values():
        assert entry["pairs"] == 2  # two shapes, one repetition, every floor run ok
        assert entry["agrees"] == (
            abs(math.log(entry["ttft_ratio"])) <= math.log1p(drift["band"])
            and abs(math.log(entry["itl_ratio"])) <= math.log1p(drift["band"])
        )
    for arm in ARMS:
        for engine in ("vllm_v1", "llamacpp"):
            before = max(_block_times(results, "floor/*/runs", arm, engine))
            loaded = _block_times(results, "runs", arm, engine)
            after = min(_block_times(results, "floor-after/*/runs", arm, engine))
            assert before < min(loaded) and max(loaded) < after, (arm, engine)
    bracket = json.loads((results / "sim_vs_real.json").read_text())["bracket"]
    assert set(bracket["judged"]) | set(bracket["refused"]) == deployments
    assert set(bracket["judged"]) == {d for d, e in drift["deployments"].items() if e["agrees"]}
    assert all(e["quiet"] is None for e in drift["deployments"].values())  # no bar


def _block_times(results: Path, blocks: str, arm: str, engine: str) -> list[int]:
    """When each block of one deployment under results/BLOCKS (runs, floor/*/runs or
    floor-after/*/runs) was written."""
    times = [p.stat().st_mtime_ns for p in results.glob(f"{blocks}/{arm}/{engine}/*/block.json")]
    assert times, f"no block of {arm}/{engine} under {results}/{blocks}"
    return times


def test_the_predicted_side_is_byte_identical_on_rerun(campaign: Path) -> None:
    before = _predicted_digests(campaign)
    done = Workdir(campaign, {}, write=False).snakemake(
        *TARGET, *CONFIGS, "--forcerun", "cpu_platform", timeout=600
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert _predicted_digests(campaign) == before


def test_campaign_commands_read_the_sim_vs_real_campaign(campaign: Path, tmp_path: Path) -> None:
    """`servelab campaign status|plan|redo` with the documented config files (and the short
    overlay) on a copy of the campaign: the eight loaded runs done, and a redone run missing."""
    work = Workdir(campaign, {}, write=False).copy_to(tmp_path / "w")
    files = list(CONFIGS)
    config = load_config(work.path / "config" / "config.yaml", [work.path / f for f in files])
    measured = [run.id for run in target_runs(config, "all")]
    assert len(measured) == 8  # two engines, two arms, two rates, one repetition
    check_campaign_commands(work.path, files, config, measured)
