"""Protected measurements (campaign_blocks.execute_block, campaign_deploy.deploy): a forced re-run publishes the
sealed measurement again, a changed identity moves it aside with its reason (never deletes it),
and every start-up log of a real engine is kept. The backend is a stand-in that counts its runs;
the campaign's own logic is what is tested."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servelab.artifacts import REQUESTS_SCHEMA, SCRAPE_SCHEMA, write_json, write_parquet
from servelab.artifacts.runrecord import build_run_record
from servelab.campaign import blocks as campaign_blocks
from servelab.campaign import deploy as campaign_deploy
from servelab.deploy import Deployed
from servelab.grid import identity

CONDITION = "rate-0.28"


class CountingBackend:
    """Writes a complete, passing measurement per attempt and counts them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.runs: list[str] = []

    def deploy(self, deployment: dict, *, manifest_path: str, startup_log_path: str) -> Deployed:
        Path(startup_log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(startup_log_path).write_text(f"start-up {len(self.runs)}\n")
        return Deployed.read(startup_log_path)

    def run(self, request: Any) -> dict[str, Any]:
        self.runs.append(request.run_id)
        write_parquet(request.requests_path, REQUESTS_SCHEMA.empty_table())
        write_parquet(request.scrape_path, SCRAPE_SCHEMA.empty_table())
        record = build_run_record(
            arm=request.arm,
            engine=request.engine,
            condition=request.condition,
            rep=request.rep,
            seed=1,
            trace_sha256="0" * 64,
            backend=self.name,
            deployment_id="d1",
            resolved_config=request.resolved_config,
            start_unix_s=0.0,
            end_unix_s=1.0,
            offered_load_rps=request.offered_load_rps,
            requests=REQUESTS_SCHEMA.empty_table(),
            success_threshold=request.success_threshold,
            attempt=request.attempt,
            node={"start": "n1", "end": "n1"},
        )
        record.update(status="ok", measured=len(self.runs))
        write_json(request.run_json_path, record)
        return record


@pytest.fixture
def setup(tmp_path: Path, study_config: dict[str, Any]) -> dict[str, Any]:
    root = tmp_path / "results"
    trace = root / "traces" / CONDITION / "rep1"
    trace.mkdir(parents=True)
    (trace / "trace.parquet").write_bytes(b"a trace")
    (trace / "manifest.json").write_text(json.dumps({"seed": 1}))
    resolved = root / "deployments" / "d1" / "resolved.json"
    write_json(resolved, {"chunked_prefill": False, "chunk_size": None, "deployment_id": "d1"})
    return {"root": root, "trace": trace, "resolved": resolved, "config": study_config}


def measure(setup: dict[str, Any], backend: CountingBackend, config: dict[str, Any]) -> dict:
    config = {**config, "backend": backend.name}
    run = {"arm": "defaults", "engine": "vllm", "condition": CONDITION, "offered_load_rps": 1.0}
    deployment = {"deployment_id": "d1", "arm": "defaults", "engine": "vllm", "flags": []}
    block = campaign_blocks.BlockPaths(setup["root"], "defaults", "vllm", CONDITION)
    return campaign_blocks.execute_block(
        identity={
            "deployment": identity.deployment_identity(config, deployment),
            "run": identity.run_identity(config, run),
            "reps": ["rep1"],
        },
        operational=identity.operational_settings(
            {**config, "campaign": {**config["campaign"], "pause_between_runs_s": 0}}
        ),
        faults=[],
        results_dir=str(setup["root"]),
        traces=[str(setup["trace"] / "trace.parquet")],
        manifests=[str(setup["trace"] / "manifest.json")],
        resolved_path=str(setup["resolved"]),
        block_json_path=str(block.block_json),
    )


def run_dir(setup: dict[str, Any]) -> Path:
    return setup["root"] / "runs" / "defaults" / "vllm" / CONDITION / "rep1"


@pytest.fixture(autouse=True)
def use_backend(monkeypatch: pytest.MonkeyPatch) -> dict[str, CountingBackend]:
    backends: dict[str, CountingBackend] = {}

    def get_backend(name: str, **_: Any) -> CountingBackend:
        return backends.setdefault(name, CountingBackend(name))

    monkeypatch.setattr(campaign_deploy, "get_backend", get_backend)
    monkeypatch.setattr(campaign_blocks, "get_backend", get_backend)
    return backends


def test_a_forced_re_run_publishes_the_sealed_measurement(setup, use_backend) -> None:
    measure(setup, CountingBackend("kubernetes"), setup["config"])
    first = (run_dir(setup) / "run.json").stat().st_ino
    for name in campaign_blocks.RUN_FILES:  # what Snakemake does before a forced job
        (run_dir(setup) / name).unlink()
    measure(setup, CountingBackend("kubernetes"), setup["config"])
    assert use_backend["kubernetes"].runs == ["defaults/vllm/rate-0.28/rep1"]
    assert (run_dir(setup) / "run.json").stat().st_ino == first


def test_a_changed_identity_moves_the_real_measurement_aside(setup, use_backend) -> None:
    measure(setup, CountingBackend("kubernetes"), setup["config"])
    old_key = (run_dir(setup) / "measured" / "measurement.key").read_text().strip()
    changed = {
        **setup["config"],
        "dispatch": {**setup["config"]["dispatch"], "request_timeout_s": 7},
    }
    measure(setup, CountingBackend("kubernetes"), changed)
    assert len(use_backend["kubernetes"].runs) == 2
    kept = setup["root"] / "superseded" / "defaults" / "vllm" / CONDITION / "rep1" / "001"
    reason = json.loads((kept / "reason.json").read_text())
    assert reason["measurement_key"] == old_key
    assert reason["new_measurement_key"] != old_key
    assert json.loads((kept / "measured" / "run.json").read_text())["measured"] == 1
    assert json.loads((run_dir(setup) / "run.json").read_text())["measured"] == 2


def test_an_operational_change_measures_nothing_again(setup, use_backend) -> None:
    measure(setup, CountingBackend("kubernetes"), setup["config"])
    changed = {**setup["config"], "campaign": {**setup["config"]["campaign"], "retries": 7}}
    measure(setup, CountingBackend("kubernetes"), changed)
    assert len(use_backend["kubernetes"].runs) == 1
    assert not (setup["root"] / "superseded").exists()


def test_a_simulated_measurement_of_another_identity_is_dropped(setup, use_backend) -> None:
    measure(setup, CountingBackend("sim"), setup["config"])
    changed = {
        **setup["config"],
        "dispatch": {**setup["config"]["dispatch"], "request_timeout_s": 7},
    }
    measure(setup, CountingBackend("sim"), changed)
    assert len(use_backend["sim"].runs) == 2
    assert not (setup["root"] / "superseded").exists()


@pytest.mark.parametrize(("backend", "kept"), [("kubernetes", ["001", "002"]), ("sim", [])])
def test_every_start_up_log_of_a_real_engine_is_kept(setup, backend, kept, monkeypatch) -> None:
    monkeypatch.setattr(campaign_deploy, "parse_startup_log", lambda text, engine: _Parsed())
    monkeypatch.setattr(campaign_deploy, "check_resolved", lambda parsed, **_: None)
    folder = setup["root"] / "deployments" / "d2"
    for _ in range(2):
        campaign_deploy.deploy(
            identity={
                "backend": backend,
                "gpu": {},
                "model": {},
                "deployment_id": "d2",
                "engine": "vllm",
                "expect_chunked_prefill": False,
                "expect_chunk_size": None,
            },
            kubernetes={},
            manifest_path="unused.yaml",
            startup_log_path=str(folder / "startup.log"),
            resolved_path=str(folder / "resolved.json"),
        )
        (folder / "startup.log").unlink()  # what Snakemake does before it runs the job again
    startups = folder / "startups"
    names = sorted(p.name for p in startups.iterdir()) if startups.exists() else []
    assert names == kept
    for name in names:  # each a copy of one start-up's log, in order
        assert (startups / name / "startup.log").read_text().startswith("start-up")


class _Parsed:
    chunked_prefill = False
    chunk_size = None

    def to_json(self) -> str:
        return json.dumps({"engine": "vllm", "chunked_prefill": False, "chunk_size": None})
