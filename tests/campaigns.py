"""Campaigns the tests run through the real Snakefile, each in a scratch folder of its own, and the
ones several tests share.

A shared campaign is made once per test session, whatever the number of pytest-xdist workers: the
first worker to ask builds it under a file lock in the folder all workers' temporary folders sit
in; the others wait, then read it. A test reads a shared campaign and never writes into it; to
change one, it copies it first (`Workdir.copy_to`: a copy keeps every file's modification time and
Snakemake's own records, so the copy is as complete as the original).
"""

from __future__ import annotations

import copy
import csv
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from filelock import FileLock

from servelab.campaign.plan import target_runs

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CAMPAIGN_TIMEOUT_S = 900


def study_config() -> dict[str, Any]:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def tiny_config(study: dict[str, Any]) -> dict[str, Any]:
    """One short condition, two repetitions, both engines, the defaults arm only."""
    cfg = copy.deepcopy(study)
    cfg["repetitions"] = 2
    cfg["conditions"] = [
        {"sweep": "rate", "rate": 0.28, "sharing": 0.9, "prompt_tokens": 1024, "duration_s": 40}
    ]
    cfg["arms"] = {"defaults": copy.deepcopy(study["arms"]["defaults"])}
    cfg["dispatch"]["warmup_requests"] = 2
    cfg["campaign"]["faults"] = []
    return cfg


class Workdir:
    """A scratch folder with config/config.yaml, where the repository's Snakefile runs."""

    def __init__(self, path: Path, config: dict[str, Any], *, write: bool = True) -> None:
        self.path = path
        self.config = config
        if write:
            (path / "config").mkdir(parents=True, exist_ok=True)
            self.write_config()

    def write_config(self) -> None:
        (self.path / "config" / "config.yaml").write_text(
            yaml.safe_dump(self.config, sort_keys=False)
        )

    def command(self, *args: str) -> list[str]:
        return [
            str(BIN / "snakemake"),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--cores",
            "1",
            *args,
        ]

    def snakemake(self, *targets: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*targets), cwd=self.path, capture_output=True, text=True, timeout=timeout
        )

    def popen(self, *targets: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(*targets),
            cwd=self.path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: a kill takes its jobs too
        )

    def run_dir(self, run_id: str) -> Path:
        return self.path / "results" / "runs" / run_id

    def copy_to(self, dest: Path) -> Workdir:
        """A copy to change: the same files with the same modification times, and Snakemake's
        records (.snakemake/), so the copy plans nothing the original would not."""
        shutil.copytree(self.path, dest, symlinks=True, dirs_exist_ok=True)
        return Workdir(dest, copy.deepcopy(self.config), write=False)


def shared_root(factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session can see: under pytest-xdist each worker has a
    temporary folder of its own (.../popen-gw0), and their parent is the session's."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """`name`'s folder, built once per session by `build(folder)` (under a lock; a build that
    failed is tried again by the next test that asks, and fails it the same way)."""
    folder = shared_root(factory) / "shared" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    complete = folder / ".complete"
    with FileLock(str(folder) + ".lock"):
        if not complete.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            complete.write_text("")
    return folder


def shared_campaign(
    factory: pytest.TempPathFactory, name: str, config: dict[str, Any], *targets: str
) -> Workdir:
    """A campaign of `config` run to `targets`, shared by the session's tests (read it only)."""

    def build(folder: Path) -> None:
        done = Workdir(folder, config).snakemake(*targets, timeout=CAMPAIGN_TIMEOUT_S)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    return Workdir(shared(factory, name, build), config, write=False)


def llamacpp_campaign(factory: pytest.TempPathFactory) -> Path:
    """`snakemake --cores 1 results/table5.csv --configfile config/llamacpp.yaml`, exactly as
    documented, in a scratch folder (the real llama-server and Prometheus), once per session:
    read it, or copy it to change it. Asserts the workflow left no server running."""
    from servelab.deploy.local import _alive, _read_state, _server_marker

    def build(folder: Path) -> None:
        (folder / "config").mkdir()
        for name in ("config.yaml", "llamacpp.yaml"):
            shutil.copy(REPO / "config" / name, folder / "config" / name)
        done = Workdir(folder, {}, write=False).snakemake(
            "results/table5.csv", "--configfile", "config/llamacpp.yaml", timeout=CAMPAIGN_TIMEOUT_S
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        # the workflow's onsuccess stops what the local backend started; check it did
        left = [
            p
            for p in (folder / "results" / "deployments").glob("*/local.json")
            if _alive(_read_state(p)["pid"], _server_marker(_read_state(p)))
        ]
        assert not left, f"servers left running: {left}"

    return shared(factory, "llamacpp", build)


# `servelab campaign status|plan|redo` against a campaign a test has made (its copy)


def servelab(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(BIN / "servelab"), *args], cwd=work, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"servelab {' '.join(args)}:\n{result.stderr[-3000:]}"
    return result


def status_states(work: Path, files: list[str]) -> dict[str, str]:
    servelab(work, "campaign", "status", "--configfile", *files, "--csv", "status.csv")
    with (work / "status.csv").open(newline="") as handle:
        return {row["run_id"]: row["state"] for row in csv.DictReader(handle)}


def check_campaign_commands(
    work: Path, files: list[str], config: dict[str, Any], measured: list[str]
) -> None:
    """status says `measured` done and every other run missing; plan has the rest to measure;
    redo moves the first measured run aside, and status then says it is missing."""
    every = [run.id for run in target_runs(config, "all")]
    assert set(measured) <= set(every)
    states = status_states(work, files)
    assert list(states) == every
    assert {run_id: states[run_id] for run_id in measured} == dict.fromkeys(measured, "done")
    assert set(states.values()) - {"done"} <= {"missing"}
    assert sum(s == "done" for s in states.values()) == len(measured)

    plan = servelab(work, "campaign", "plan", "--target", "all", "--configfile", *files)
    counts = re.search(r"(\d+) of its (\d+) runs to measure", plan.stdout)
    assert counts, plan.stdout
    assert (int(counts[1]), int(counts[2])) == (len(every) - len(measured), len(every))
    assert f"backend {config['backend']}" in plan.stdout

    redo = servelab(
        work, "campaign", "redo", measured[0], "--why", "a test", "--configfile", *files
    )
    assert redo.stdout.startswith(f"{measured[0]}: moved ")
    assert list((work / "results" / "redone" / measured[0]).glob("*/reason.json"))
    states = status_states(work, files)
    assert (states[measured[0]], states[measured[1]]) == ("missing", "done")
