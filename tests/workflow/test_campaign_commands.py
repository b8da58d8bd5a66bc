"""`servelab campaign plan|status|redo` for real against every shipped config, each after a tiny
campaign of that config run through the real Snakefile with the same `--configfile` list.

The workflow and every CLI command read a config through one merge (`servelab.grid.config.load_config`,
whose `prepare_config` the Snakefile calls too), so a config the workflow runs is one the CLI reads,
with the same grid: the runs the campaign measured are `done` in `status`, not in `plan`, and `redo`
moves one aside so that `status` then says `missing`.

The tiny campaign is one block (the grid's first arm, engine and condition, its repetitions) with
every condition shortened (condition names do not change: arms refer to them). It runs on the
config's own backend where this machine has it: the sim, or, for config/llamacpp.yaml (itself a
tiny campaign), the session's run of it on the local backend with the real llama-server and
Prometheus (tests/campaigns.py). The kubernetes config has no cluster here: its campaign runs on the sim
(the tiny overlay says `backend: sim`), and its commands read the config as shipped plus the same
overlay.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from campaigns import Workdir, check_campaign_commands, llamacpp_campaign

from servelab.campaign.plan import target_runs
from servelab.grid.config import load_config

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# Each shipped config as documented: the files laid over config/config.yaml, in order.
CONFIGFILES: dict[str, tuple[str, ...]] = {
    "config.yaml": (),
    "test.yaml": ("config/test.yaml",),
    "capacity.yaml": ("config/capacity.yaml",),
    "capacity-saturation.yaml": ("config/capacity-saturation.yaml",),
    "current.yaml": ("config/current.yaml",),
    "current-h100.yaml": ("config/current.yaml", "config/current-h100.yaml"),
    "llamacpp.yaml": ("config/llamacpp.yaml",),
    "cpu-pair.yaml": ("config/cpu-pair.yaml",),
    "cpu-study.yaml": ("config/cpu-study.yaml",),
    "cpu-pair-sim.yaml": ("config/cpu-pair.yaml", "config/cpu-pair-sim.yaml"),
    "sim-vs-real.yaml": ("config/cpu-pair.yaml", "config/sim-vs-real.yaml"),
    "kubernetes.example.yaml": ("config/kubernetes.example.yaml",),
}
# Backends this machine cannot serve, and the one the tiny campaign runs on instead.
STAND_IN_BACKEND = {"kubernetes": "sim"}
TINY_DURATION_S = 8
GRAPHS = 8  # agent graphs a tiny run expects (Gamma arrivals, CV 1.5: bursty)
TINY_REPETITIONS = 2


def shipped_configs() -> list[str]:
    return sorted(p.name for p in (REPO / "config").glob("*.yaml") if p.name != "schema.yaml")


# Shipped configs whose tiny campaign is one another test makes anyway: the test that reads it,
# and the lines its file must hold.
ELSEWHERE = {
    "llamacpp.yaml": (
        "tests/workflow/test_campaign_commands.py",
        ("def test_campaign_commands_read_the_llamacpp_campaign(",),
    ),
    # config/cpu-pair.yaml and cpu-study.yaml need the real Python engines: read in the engines
    # tier, after their campaigns, by the test every TwoRealEngines class inherits
    "cpu-pair.yaml": (
        "tests/engines/test_cpu_pair_campaign.py",
        ("(TwoRealEngines):", 'CONFIG = "cpu-pair.yaml"'),
    ),
    "cpu-study.yaml": (
        "tests/engines/test_cpu_study_campaign.py",
        ("(TwoRealEngines):", 'CONFIG = "cpu-study.yaml"'),
    ),
    "sim-vs-real.yaml": (
        "tests/engines/test_sim_vs_real_campaign.py",
        ("def test_campaign_commands_read_the_sim_vs_real_campaign(",),
    ),
}


def test_every_shipped_config_is_checked() -> None:
    assert sorted(CONFIGFILES) == shipped_configs()
    for path, lines in ELSEWHERE.values():
        text = (REPO / path).read_text()
        for line in lines:
            assert line in text, (path, line)
    inherited = "    def test_campaign_commands_read_the_campaign("
    assert inherited in (REPO / "tests" / "campaigns.py").read_text()


def tiny_duration_s(duration_s: float, rate: float) -> float:
    """Short, but long enough that a few agent graphs arrive (a trace with none is refused)."""
    return min(duration_s, max(TINY_DURATION_S, round(GRAPHS / rate)))


def tiny_overlay(merged: dict[str, Any]) -> dict[str, Any]:
    """The overlay that makes a campaign of `merged` tiny: every condition shortened, two
    repetitions, no injected faults or pauses, two warm-ups; a stand-in backend where needed."""
    overlay: dict[str, Any] = {
        "repetitions": TINY_REPETITIONS,
        "conditions": [
            {**c, "duration_s": tiny_duration_s(float(c["duration_s"]), float(c["rate"]))}
            for c in copy.deepcopy(merged["conditions"])
        ],
        "dispatch": {"warmup_requests": 2},
        "campaign": {"faults": [], "pause_between_runs_s": 0},
    }
    if merged["backend"] in STAND_IN_BACKEND:
        overlay["backend"] = STAND_IN_BACKEND[merged["backend"]]
    return overlay


@pytest.mark.xdist_group("llamacpp")  # the worker that makes the campaign reads it
def test_campaign_commands_read_the_llamacpp_campaign(
    llama_server_program: str, prometheus_program: str, tmp_path_factory, tmp_path: Path
) -> None:
    """config/llamacpp.yaml is itself a tiny campaign (one short condition, two repetitions): the
    session's run of it, exactly as documented (tests/campaigns.py), read on a copy."""
    del llama_server_program, prometheus_program
    work = Workdir(llamacpp_campaign(tmp_path_factory), {}, write=False).copy_to(tmp_path / "w")
    files = ["config/llamacpp.yaml"]
    config = load_config(work.path / "config" / "config.yaml", [work.path / f for f in files])
    measured = [run.id for run in target_runs(config, "table5")]
    assert len(measured) == 4  # both arms, two repetitions
    check_campaign_commands(work.path, files, config, measured)


@pytest.mark.parametrize("config_name", [c for c in CONFIGFILES if c not in ELSEWHERE])
def test_campaign_commands_read_what_a_tiny_campaign_of_the_config_measured(
    config_name: str, tmp_path: Path
) -> None:
    work = Workdir(tmp_path, {}, write=False)
    (tmp_path / "config").mkdir()
    for path in (REPO / "config").glob("*.yaml"):
        (tmp_path / "config" / path.name).write_bytes(path.read_bytes())
    shipped = [*CONFIGFILES[config_name]]
    merged = load_config(tmp_path / "config" / "config.yaml", [tmp_path / f for f in shipped])
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_overlay(merged), sort_keys=False))
    files = [*shipped, "tiny.yaml"]
    config = load_config(tmp_path / "config" / "config.yaml", [tmp_path / f for f in files])

    every = [run.id for run in target_runs(config, "all")]
    first = target_runs(config, "all")[0]
    block = [
        f"{first.arm}/{first.engine}/{first.condition}/rep{k}"
        for k in range(1, TINY_REPETITIONS + 1)
    ]
    assert block[0] == every[0] and set(block) <= set(every)
    targets = [f"results/runs/{run_id}/run.json" for run_id in block]
    done = subprocess.run(
        [*work.command(*targets), "--configfile", *files],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    check_campaign_commands(tmp_path, files, config, block)
