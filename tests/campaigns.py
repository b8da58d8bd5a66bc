"""Campaigns the tests run through the real Snakefile, each in a scratch folder of its own, and the
ones several tests share.

A shared campaign is made once per test session, whatever the number of pytest-xdist workers: the
first worker to ask builds it under a file lock in the folder all workers' temporary folders sit
in; the others wait, then read it. A test reads a shared campaign and never writes into it; to
change one, it copies it first (`Workdir.copy_to`: a copy keeps every file's modification time and
Snakemake's own records, so the copy is as complete as the original).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow.parquet as pq
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


def assert_no_server_left(folder: Path) -> None:
    """No server the local backend recorded under `folder`/results/deployments still runs (the
    workflow's onsuccess stops what the local backend started)."""
    from servelab.deploy.local import _server_marker
    from servelab.deploy.processes import alive, read_state

    left = [
        p
        for p in (folder / "results" / "deployments").glob("*/local.json")
        if alive(read_state(p)["pid"], _server_marker(read_state(p)))
    ]
    assert not left, f"servers left running: {left}"


def documented_campaign(
    folder: Path,
    target: str,
    config_files: Sequence[str],
    *,
    overlays: Mapping[str, str] | None = None,
    timeout: float = CAMPAIGN_TIMEOUT_S,
) -> None:
    """`snakemake --cores 1 TARGET --configfile CONFIG_FILES`, exactly as documented, in `folder`:
    config/config.yaml and each of `config_files` (`config/NAME`) copied from the repository, or
    written from `overlays` (path -> text). Asserts it succeeded and left no server running."""
    (folder / "config").mkdir()
    for name in ("config/config.yaml", *config_files):
        text = (overlays or {}).get(name)
        if text is None:
            shutil.copy(REPO / name, folder / name)
        else:
            (folder / name).write_text(text)
    done = Workdir(folder, {}, write=False).snakemake(
        target, "--configfile", *config_files, timeout=timeout
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert_no_server_left(folder)


def llamacpp_campaign(factory: pytest.TempPathFactory) -> Path:
    """`snakemake --cores 1 results/table5.csv --configfile config/llamacpp.yaml`, exactly as
    documented, in a scratch folder (the real llama-server and Prometheus), once per session:
    read it, or copy it to change it. Asserts the workflow left no server running."""

    def build(folder: Path) -> None:
        documented_campaign(folder, "results/table5.csv", ["config/llamacpp.yaml"])

    return shared(factory, "llamacpp", build)


# What the real-engine campaigns' tests read (tests/engines/test_cpu_*_campaign.py)

TABLE5_METRICS = ("ttft_p50", "ttft_p95", "throughput")


def table5_rows(work: Path) -> list[dict[str, str]]:
    with (work / "results" / "table5.csv").open() as handle:
        return list(csv.DictReader(handle))


def resolved_by_arm(work: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Every deployment's resolved.json by (arm, engine)."""
    out = {}
    for path in (work / "results" / "deployments").glob("*/resolved.json"):
        resolved = json.loads(path.read_text())
        out[(path.parent.name.split("-")[0], resolved["engine"])] = resolved
    return out


def check_exact_token_counts(
    work: Path,
    condition: str,
    reps: Sequence[str],
    engines: Sequence[str],
    entrypoint: tuple[str, str],
) -> None:
    """Every measured request of every run served with L + 1 prompt tokens (the BOS) and exactly
    its max_tokens; every run.json ok, from the local backend, naming its model's SHA-256 and its
    server command, which holds `entrypoint` = (engine, text) for that engine only."""
    for rep in reps:
        trace = pq.read_table(work / "results" / "traces" / condition / rep / "trace.parquet")
        length = {
            r["request_id"]: len(r["prompt_token_ids"])
            for r in trace.select(["request_id", "prompt_token_ids"]).to_pylist()
        }
        for arm in ("defaults", "matched"):
            for engine in engines:
                run = work / "results" / "runs" / arm / engine / condition / rep
                rows = pq.read_table(run / "requests.parquet").to_pylist()
                measured = [r for r in rows if not r["warmup"]]
                assert len(measured) == len(length)
                for r in measured:
                    assert r["status"] == "ok", (arm, engine, r["error"])
                    assert r["prompt_tokens"] == length[r["request_id"]] + 1
                    assert r["output_tokens"] == r["max_tokens"]
                record = json.loads((run / "run.json").read_text())
                assert record["status"] == "ok" and record["backend"] == "local"
                command = record["local"]["server_command"]
                assert (entrypoint[1] in command) == (engine == entrypoint[0])
                assert len(record["local"]["model_sha256"]) == 64


def telemetry_series(run: Path) -> dict[str, list[float]]:
    """A run's telemetry.parquet as canonical metric -> its values in order."""
    tel = pq.read_table(run / "telemetry.parquet").to_pydict()
    series: dict[str, list[float]] = {}
    for metric, value in zip(tel["metric"], tel["value"], strict=True):
        series.setdefault(metric, []).append(value)
    return series


@dataclass
class Refusal:
    returncode: int
    logs: str  # every rule log's text
    before: str  # the SHA-256 of the measured run's requests.parquet before and after
    after: str


def run_mismatched_arm(
    campaign: Path,
    dest: Path,
    engine: str,
    setting: dict[str, Any],
    condition: str,
    config_files: Sequence[str],
) -> Refusal:
    """A copy of `campaign` in `dest` run again to Table 5 with the matched arm of `engine` set to
    `setting` (its flags and expect) in config/mismatched.yaml."""
    copy_ = Workdir(campaign, {}, write=False).copy_to(dest)
    measured = copy_.path / "results" / "runs" / "matched" / engine / condition / "rep1"
    before = hashlib.sha256((measured / "requests.parquet").read_bytes()).hexdigest()
    wrong = {"arms": {"matched": {"engines": {engine: setting}}}}
    (copy_.path / "config" / "mismatched.yaml").write_text(yaml.safe_dump(wrong))
    refused = copy_.snakemake(
        "results/table5.csv", "--configfile", *config_files, "config/mismatched.yaml"
    )
    logs = "".join(p.read_text() for p in (copy_.path / "results" / "logs").rglob("*.log"))
    after = hashlib.sha256((measured / "requests.parquet").read_bytes()).hexdigest()
    return Refusal(refused.returncode, logs, before, after)


class TwoRealEngines:
    """The checks every campaign of two real engines on the CPU passes, run through the real
    Snakefile exactly as documented (`snakemake --cores 1 results/table5.csv --configfile
    config/CONFIG`) in a scratch folder, once for the class (`campaign`): Table 5 from the two
    engines in both arms, every request served with exact token counts, `servelab campaign` reading
    it, no server left running. A test module subclasses it (`class Test...`) with its config file,
    engines, the fixtures that provide their programs (a missing one skips the class, fails it under
    CI), the text only one engine's server command holds, and the time the campaign may take; its
    own checks are methods of that class."""

    CONFIG: ClassVar[str]  # config/CONFIG; its stem names the xdist group and the scratch folder
    ENGINES: ClassVar[tuple[str, str]]
    PROGRAMS: ClassVar[tuple[str, ...]]
    ENTRYPOINT: ClassVar[tuple[str, str]]  # (engine, text only its server command holds)
    TIMEOUT_S: ClassVar[float]
    CONDITION = "rate-0.50"
    REPS = ("rep1", "rep2")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        group = Path(cls.CONFIG).stem
        cls.pytestmark = [pytest.mark.usefixtures(*cls.PROGRAMS), pytest.mark.xdist_group(group)]

    @pytest.fixture(scope="class")
    def campaign(self, tmp_path_factory: pytest.TempPathFactory) -> Path:
        work = tmp_path_factory.mktemp(Path(self.CONFIG).stem)
        files = [f"config/{self.CONFIG}"]
        documented_campaign(work, "results/table5.csv", files, timeout=self.TIMEOUT_S)
        return work

    def resolved(self, campaign: Path) -> dict[tuple[str, str], dict[str, Any]]:
        """Every deployment's resolved.json by (arm, engine): one for each arm and engine."""
        resolved = resolved_by_arm(campaign)
        assert set(resolved) == {(a, e) for a in ("defaults", "matched") for e in self.ENGINES}
        return resolved

    def refused_arm_logs(
        self, campaign: Path, dest: Path, engine: str, setting: dict[str, Any]
    ) -> str:
        """The campaign copied to `dest` and run again with the matched arm of `engine` set to
        `setting`: refused (the workflow fails), the measured run untouched; every rule log's
        text."""
        files = [f"config/{self.CONFIG}"]
        refused = run_mismatched_arm(campaign, dest, engine, setting, self.CONDITION, files)
        assert refused.returncode != 0
        assert refused.after == refused.before
        return refused.logs

    def telemetry(
        self, campaign: Path, engine: str, names: set[str]
    ) -> Iterator[tuple[str, str, Path, dict[str, list[float]]]]:
        """(arm, rep, run folder, telemetry series) of every run of `engine`, each holding the
        canonical series `names`."""
        for arm in ("defaults", "matched"):
            for rep in self.REPS:
                run = campaign / "results" / "runs" / arm / engine / self.CONDITION / rep
                series = telemetry_series(run)
                assert names <= set(series), (arm, rep)
                yield arm, rep, run, series

    def test_table5_compares_the_two_real_engines_in_both_arms(self, campaign: Path) -> None:
        rows = table5_rows(campaign)
        assert [(r["condition"], r["metric"]) for r in rows] == [
            (self.CONDITION, metric) for metric in TABLE5_METRICS
        ]
        for row in rows:
            assert float(row["defaults_gap"]) > 0 and float(row["matched_gap"]) > 0
            assert float(row["defaults_ci_low"]) <= float(row["defaults_gap"])

    def test_every_request_is_served_with_exact_token_counts(self, campaign: Path) -> None:
        check_exact_token_counts(
            campaign, self.CONDITION, self.REPS, self.ENGINES, entrypoint=self.ENTRYPOINT
        )

    def test_campaign_commands_read_the_campaign(self, campaign: Path, tmp_path: Path) -> None:
        """`servelab campaign status|plan|redo --configfile config/CONFIG` on a copy of the
        campaign: the eight runs Table 5 measured done, and a redone run missing."""
        check_commands_on_copy(campaign, tmp_path / "w", [f"config/{self.CONFIG}"], "table5", 8)


# The local backend's faults, through the campaign functions the Snakemake rules call
# (tests/integration/test_llamacpp_local_faults.py, tests/engines/test_cpu_engine_faults.py)


def fault_config(overlay: str) -> dict[str, Any]:
    """config/config.yaml with config/`overlay` over it, without retries, validated."""
    from snakemake.utils import update_config

    from servelab.grid import config as grid

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    update_config(cfg, yaml.safe_load((REPO / "config" / overlay).read_text()))
    grid.drop_removed_engines(cfg)
    cfg["campaign"].update(retries=0)
    grid.validate_config(cfg)
    return cfg


def compile_first_trace(root: Path, config: dict[str, Any], condition: str) -> None:
    """The trace of `condition` (the config's first), rep1, under `root`/traces."""
    from servelab.grid import config as grid
    from servelab.workload import compile_trace_files

    first = config["conditions"][0]
    out = root / "traces" / condition / "rep1"
    compile_trace_files(
        condition=grid.Condition(
            id=condition,
            sweep=first["sweep"],
            rate=first["rate"],
            sharing=first["sharing"],
            prompt_tokens=first["prompt_tokens"],
            duration_s=first["duration_s"],
        ),
        rep="rep1",
        seed=grid.trace_seed(config["campaign_seed"], condition, "rep1"),
        workload=config["workload"],
        tokenizer=config["tokenizer"],
        trace_path=out / "trace.parquet",
        manifest_path=out / "manifest.json",
    )


@contextlib.contextmanager
def local_results(root: Path, config: dict[str, Any], condition: str) -> Iterator[Path]:
    """`root` as a results folder holding the first trace of `condition` (compile_first_trace);
    every process the local backend started under it is stopped at the end."""
    from servelab.deploy.local import stop_all

    compile_first_trace(root, config, condition)
    yield root
    stop_all(root)


def deploy_local(results: Path, config: dict[str, Any], deployment: dict[str, Any]) -> Path:
    """`deployment` deployed on the local backend and gated; returns its folder."""
    from servelab.campaign import deploy as campaign_deploy

    folder = results / "deployments" / deployment["deployment_id"]
    campaign_deploy.deploy(
        identity={"backend": "local", "gpu": config["gpu"], "model": config["model"], **deployment},
        kubernetes={},
        manifest_path=str(results / "manifest.yaml"),
        startup_log_path=str(folder / "startup.log"),
        resolved_path=str(folder / "resolved.json"),
    )
    return folder


def run_killed_at(
    results: Path,
    config: dict[str, Any],
    deployment: dict[str, Any],
    condition: str,
    kill_at_s: float,
) -> Path:
    """The defaults arm's rep1 of `condition` run on the deployed server with the fault "fail" at
    `kill_at_s` (the server killed); returns the run's folder."""
    from servelab.campaign import blocks as campaign_blocks

    engine = deployment["engine"]
    run_id = f"defaults/{engine}/{condition}/rep1"
    traces = results / "traces" / condition / "rep1"
    folder = results / "deployments" / deployment["deployment_id"]
    campaign_blocks.execute_run(
        settings={
            "backend": "local",
            "arm": "defaults",
            "engine": engine,
            "condition": condition,
            "rep": "rep1",
            "offered_load_rps": 3.0,
            "gpu": config["gpu"],
            "model": config["model"],
            "dispatch": config["dispatch"],
            "campaign": config["campaign"],
            "telemetry": config["telemetry"],
            "faults": [{"run": run_id, "kind": "fail", "at_s": kill_at_s}],
            "kubernetes": {},
        },
        deployment=deployment,
        results_dir=str(results),
        trace_path=str(traces / "trace.parquet"),
        manifest_path=str(traces / "manifest.json"),
        resolved_path=str(folder / "resolved.json"),
    )
    return results / "runs" / run_id


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


def check_commands_on_copy(
    campaign: Path, dest: Path, files: list[str], target: str, count: int
) -> None:
    """check_campaign_commands on a copy of `campaign` in `dest`, with the config `files`: the
    `count` runs `target` measures done."""
    from servelab.grid.config import load_config

    work = Workdir(campaign, {}, write=False).copy_to(dest)
    config = load_config(work.path / "config" / "config.yaml", [work.path / f for f in files])
    measured = [run.id for run in target_runs(config, target)]
    assert len(measured) == count
    check_campaign_commands(work.path, files, config, measured)
