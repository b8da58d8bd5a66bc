"""The local backend end to end: the sim server live on 127.0.0.1, a real Prometheus, the real
dispatcher, through the same campaign functions the Snakemake rules call.

Needs the `prometheus` binary (Debian package `prometheus`; .ci/run installs it). Every process
started here is stopped by the module fixture, which then checks none is left.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from servelab.analysis import load_runs
from servelab.artifacts import read_parquet, read_run_json
from servelab.campaign import blocks as campaign_blocks
from servelab.campaign import deploy as campaign_deploy
from servelab.deploy import RunRequest, prompt_cache
from servelab.deploy.local import LocalBackend, stop_all
from servelab.deploy.processes import alive, read_state
from servelab.engines.metrics import canonical_metrics
from servelab.engines.registry import engine_spec
from servelab.grid import config as grid
from servelab.grid import identity
from servelab.grid.config import Condition
from servelab.grid.settings import DispatchSettings, TelemetrySettings
from servelab.telemetry import canonicalize_files
from servelab.workload import compile_trace_files

pytestmark = pytest.mark.usefixtures("prometheus_program")

REPO = Path(__file__).resolve().parents[2]
CONDITION = "rate-0.50"


@pytest.fixture(scope="module")
def study() -> dict:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["dispatch"].update(warmup_requests=4, health_timeout_s=60)
    cfg["campaign"].update(retries=0, pause_between_runs_s=0)
    return cfg


def compile_traces(
    root: Path, study: dict, durations: dict[str, float], *, short_graphs: bool = False
) -> None:
    # short outputs keep each graph to a few seconds on the simulated L4; short graphs (8-token
    # outputs, tool calls of at most a second) to about one
    max_tokens = 8 if short_graphs else 32
    outputs = {"planner": max_tokens, "worker": max_tokens, "aggregator": 2 * max_tokens}
    workload = {**study["workload"], "max_tokens": outputs}
    if short_graphs:
        workload["tool_delay"] = {**workload["tool_delay"], "median_s": 0.1, "max_s": 1.0}
    for rep, duration in durations.items():
        out = root / "traces" / CONDITION / rep
        compile_trace_files(
            condition=Condition(
                id=CONDITION,
                sweep="rate",
                rate=0.5,
                sharing=0.9,
                prompt_tokens=512,
                duration_s=duration,
            ),
            rep=rep,
            seed=grid.trace_seed(1, CONDITION, rep),
            workload=workload,
            tokenizer=study["tokenizer"],
            trace_path=out / "trace.parquet",
            manifest_path=out / "manifest.json",
        )


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, study: dict) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("results")
    compile_traces(root, study, {"rep1": 15.0, "rep2": 5.0})
    yield root
    stop_all(root)
    leftovers = [
        p
        for p in root.glob("deployments/*/local.json")
        if alive(read_state(p)["pid"], read_state(p)["instance_id"])
    ]
    prom = read_state(root / "deployments" / "_prometheus" / "prometheus.json")
    assert not leftovers, leftovers
    assert prom is None or not alive(prom["pid"], "prometheus.yml")


def deployment(study: dict, engine: str) -> dict:
    d = grid.deployment_for(study, "defaults", engine, CONDITION)
    return {
        "deployment_id": d.id,
        "arm": "defaults",
        "engine": engine,
        "flags": list(d.flags),
        "image": study["engines"][engine]["image"],
        "port": study["engines"][engine]["port"],
        "expect_chunked_prefill": d.expect_chunked_prefill,
        "expect_chunk_size": d.expect_chunk_size,
    }


def deploy(root: Path, study: dict, engine: str, backend: str) -> dict:
    dep = deployment(study, engine)
    folder = root / "deployments" / dep["deployment_id"]
    return campaign_deploy.deploy(
        identity={"backend": backend, "gpu": study["gpu"], "model": study["model"], **dep},
        kubernetes={},
        manifest_path=str(root / "unused.yaml"),
        startup_log_path=str(folder / "startup.log"),
        resolved_path=str(folder / "resolved.json"),
    )


def settings(study: dict, engine: str, rep: str, backend: str) -> dict:
    return {
        "backend": backend,
        "arm": "defaults",
        "engine": engine,
        "condition": CONDITION,
        "rep": rep,
        "offered_load_rps": 3.0,
        "gpu": study["gpu"],
        "model": study["model"],
        "dispatch": study["dispatch"],
        "campaign": study["campaign"],
        "telemetry": study["telemetry"],
        "faults": [],
        "kubernetes": {},
    }


def execute(root: Path, study: dict, engine: str, backend: str, rep: str = "rep1") -> Path:
    dep = deployment(study, engine)
    run_dir = root / "runs" / "defaults" / engine / CONDITION / rep
    traces = root / "traces" / CONDITION / rep
    campaign_blocks.execute_run(
        settings=settings(study, engine, rep, backend),
        deployment=dep,
        results_dir=str(root),
        trace_path=str(traces / "trace.parquet"),
        manifest_path=str(traces / "manifest.json"),
        resolved_path=str(root / "deployments" / dep["deployment_id"] / "resolved.json"),
    )
    canonicalize_files(
        engine=engine,
        step_s=study["telemetry"]["step_s"],
        scrape_path=str(run_dir / "scrape.parquet"),
        run_json_path=str(run_dir / "run.json"),
        telemetry_path=str(run_dir / "telemetry.parquet"),
    )
    return run_dir


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_local_run_matches_the_sim_backend_and_passes_the_analysis(
    engine: str, results: Path, study: dict, tmp_path: Path
) -> None:
    resolved = deploy(results, study, engine, "local")  # the shared parser + gate on its log
    assert resolved["backend"] == "local"
    run_dir = execute(results, study, engine, "local")
    record = read_run_json(run_dir / "run.json")
    assert record["status"] == "ok", record
    assert record["backend"] == "local"
    assert record["n_ok"] == record["n_sent"] > 12
    assert record["node"]["start"] == record["node"]["end"]
    lag = record["dispatcher_lag_s"]
    assert 0.0 <= lag["median"] <= lag["p99"] <= lag["max"] < 1.0

    # the same schemas as the sim backend writes for the same run
    sim_root = tmp_path / "sim"
    (sim_root / "traces").mkdir(parents=True)
    (sim_root / "traces" / CONDITION).symlink_to(results / "traces" / CONDITION)
    deploy(sim_root, study, engine, "sim")
    sim_dir = execute(sim_root, study, engine, "sim")
    for name in ("requests.parquet", "scrape.parquet", "telemetry.parquet"):
        assert pq.read_schema(run_dir / name) == pq.read_schema(sim_dir / name), name
    sim_record = read_run_json(sim_dir / "run.json")
    assert set(sim_record) - set(record) == {"telemetry_step_s", "sim"} & set(sim_record)

    # Prometheus covered the whole window with every series the engine exports
    telemetry = read_parquet(
        run_dir / "telemetry.parquet", __import__("servelab.artifacts").artifacts.TELEMETRY_SCHEMA
    )
    assert set(telemetry.column("metric").to_pylist()) == set(canonical_metrics(engine))
    generated = [
        v
        for m, v in zip(
            telemetry.column("metric").to_pylist(),
            telemetry.column("value").to_pylist(),
            strict=True,
        )
        if m == "generation_tokens_total"
    ]
    assert max(generated) > 0

    # the analysis reads it like any other run
    runs = load_runs([run_dir])
    assert runs.parsed == 1 and not runs.skipped and runs.backend == "local"
    metrics = next(iter(runs.runs.values())).metrics
    assert metrics.ttft_p50 > 0 and metrics.tpot_p50 > 0 and metrics.throughput > 0
    assert math.isfinite(next(iter(runs.runs.values())).kv_peak)


def run_request(root: Path, study: dict, engine: str, rep: str, faults: list[dict]) -> RunRequest:
    dep = deployment(study, engine)
    run_dir = root / "runs" / "defaults" / engine / CONDITION / rep
    traces = root / "traces" / CONDITION / rep
    return RunRequest(
        arm="defaults",
        engine=engine,
        condition=CONDITION,
        rep=rep,
        deployment=dep,
        resolved_config={"chunked_prefill": True, "chunk_size": 2048},
        trace_path=str(traces / "trace.parquet"),
        manifest_path=str(traces / "manifest.json"),
        offered_load_rps=3.0,
        dispatch=DispatchSettings.from_section(study["dispatch"]),
        telemetry=TelemetrySettings.from_section(study["telemetry"]),
        success_threshold=0.95,
        attempt=1,
        requests_path=str(run_dir / "requests.parquet"),
        scrape_path=str(run_dir / "scrape.parquet"),
        run_json_path=str(run_dir / "run.json"),
        deployment_dir=str(root / "deployments" / dep["deployment_id"]),
        faults=faults,
    )


def test_reclamation_moves_the_engine_and_interrupts_the_run(results: Path, study: dict) -> None:
    backend = LocalBackend(gpu=study["gpu"], model=study["model"])
    record = backend.run(
        run_request(results, study, "sglang", "rep2", [{"kind": "reclaim", "at_s": 4.0}])
    )
    assert record["status"] == "interrupted"
    start, end = record["node"]["start"], record["node"]["end"]
    assert start["hostname"] == end["hostname"]
    assert start["node_id"] != end["node_id"] and start["instance_id"] != end["instance_id"]
    assert "reclamation" in record["reclaimed_reason"]
    assert campaign_blocks._was_reclaimed(record)
    table = read_parquet(
        Path(run_request(results, study, "sglang", "rep2", []).requests_path),
        __import__("servelab.artifacts").artifacts.REQUESTS_SCHEMA,
    )
    n_trace = sum(1 for w in table.column("warmup").to_pylist() if not w)
    assert (
        n_trace
        == read_run_json(Path(run_request(results, study, "sglang", "rep2", []).run_json_path))[
            "n_sent"
        ]
    )


def test_engine_crash_fails_the_run_and_the_next_run_restarts_it(
    results: Path, study: dict
) -> None:
    backend = LocalBackend(gpu=study["gpu"], model=study["model"])
    failed = backend.run(
        run_request(results, study, "vllm", "rep2", [{"kind": "fail", "at_s": 2.5}])
    )
    assert failed["status"] == "failed"
    assert failed["node"]["start"] == failed["node"]["end"]  # a crash is not a reclamation
    assert not campaign_blocks._was_reclaimed(failed)
    assert failed["n_failed"] > 0
    again = backend.run(run_request(results, study, "vllm", "rep2", []))
    assert again["status"] == "ok"
    assert again["node"]["start"]["node_id"] == failed["node"]["start"]["node_id"]
    assert again["node"]["start"]["instance_id"] != failed["node"]["start"]["instance_id"]


def _served_since_start(results: Path, study: dict, rep: str) -> list[str]:
    """The traces the vLLM deployment's server has served since it last started (local.json)."""
    deployment_dir = Path(run_request(results, study, "vllm", rep, []).deployment_dir)
    return list(read_state(deployment_dir / "local.json")["served_traces"])


def _trace_sha256(results: Path, rep: str) -> str:
    trace = results / "traces" / CONDITION / rep / "trace.parquet"
    return hashlib.sha256(trace.read_bytes()).hexdigest()


def test_a_trace_the_engine_served_before_is_measured_on_a_restarted_engine(
    results: Path, study: dict
) -> None:
    """A retry or a redo sends the same prompts again: the server restarts first, so the run
    meets a prompt cache holding none of them (servelab.deploy.prompt_cache); the restarted
    server has served that trace only."""
    compile_traces(results, study, {"rep3": 6.0}, short_graphs=True)
    backend = LocalBackend(gpu=study["gpu"], model=study["model"])
    first = backend.run(run_request(results, study, "vllm", "rep3", []))
    again = backend.run(run_request(results, study, "vllm", "rep3", []))
    assert first["status"] == again["status"] == "ok"
    assert again["node"]["start"]["instance_id"] != first["node"]["end"]["instance_id"]
    assert _served_since_start(results, study, "rep3") == [_trace_sha256(results, "rep3")]
    # vLLM 0.6.3 counts no cached tokens: recorded, not judged
    assert again["prompt_cache"] == {"cached_tokens": None, "reusable_tokens": None, "warm": None}


def test_an_engine_with_a_history_cost_is_restarted_before_every_trace(
    results: Path, study: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine whose requests cost more the more it has served (EngineSpec.history_cost:
    llama-server's host prompt cache) measures every run on a server that has served nothing
    before it: another trace restarts it too, not only a retry."""
    compile_traces(results, study, {"rep4": 4.0, "rep5": 4.0}, short_graphs=True)
    costly = dataclasses.replace(engine_spec("vllm"), history_cost="a test's history cost")
    monkeypatch.setattr(
        prompt_cache, "engine_spec", lambda name: costly if name == "vllm" else engine_spec(name)
    )
    backend = LocalBackend(gpu=study["gpu"], model=study["model"])
    first = backend.run(run_request(results, study, "vllm", "rep4", []))
    second = backend.run(run_request(results, study, "vllm", "rep5", []))
    assert first["status"] == second["status"] == "ok"
    assert second["node"]["start"]["instance_id"] != first["node"]["end"]["instance_id"]
    assert _served_since_start(results, study, "rep5") == [_trace_sha256(results, "rep5")]


def _files(root: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_reclaimed_block_is_discarded_and_repeated_touching_nothing_else(
    results: Path, study: dict, tmp_path: Path
) -> None:
    """The block's job, on the local backend: rep2's engine is reclaimed mid-run; both reps are
    kept under results/discarded/ and measured again; no other file changes."""
    del results  # the module's processes, which this test's own folder must not touch
    root = tmp_path / "results"
    # four runs of a few graphs each: as short as a block can be
    compile_traces(root, study, {"rep1": 5.0, "rep2": 5.0}, short_graphs=True)
    dep = deployment(study, "sglang")
    deploy(root, study, "sglang", "local")
    config = {**study, "backend": "local", "campaign": {**study["campaign"], "faults": []}}
    run = {"arm": "defaults", "engine": "sglang", "condition": CONDITION, "offered_load_rps": 3.0}
    block = campaign_blocks.BlockPaths(root, "defaults", "sglang", CONDITION)
    traces = [root / "traces" / CONDITION / rep for rep in ("rep1", "rep2")]
    fault = {"run": block.block_id + "/rep2", "kind": "reclaim", "at_s": 2.0}
    # The local backend's live processes (the engine server a reclamation restarts, with its
    # state file and log, and Prometheus): runtime state, not artifacts.
    live = "deployments/" + dep["deployment_id"]
    state = (f"{live}/local", f"{live}/server", "deployments/_prometheus")
    before = {k: v for k, v in _files(root).items() if not k.startswith(state)}
    try:
        record = _reclaimed_block(root, config, dep, run, fault, traces, block)
    finally:
        # this test's own results folder: its server and Prometheus are not the module fixture's
        stop_all(root)
    assert not [
        p
        for p in root.glob("deployments/*/local.json")
        if alive(read_state(p)["pid"], read_state(p)["instance_id"])
    ]
    after = _files(root)
    assert {k: after.get(k) for k in before} == before
    owned = ("runs/defaults/sglang/" + CONDITION + "/", "discarded/defaults/sglang/" + CONDITION)
    assert all(k.startswith(owned + state) for k in set(after) - set(before))
    assert record["discarded"] == ["001"]
    assert {rep: r["status"] for rep, r in record["reps"].items()} == {"rep1": "ok", "rep2": "ok"}
    generation = block.discard_root / "001"
    kept = json.loads((generation / "reason.json").read_text())
    assert kept["interrupted_run"] == fault["run"] and kept["discarded_reps"] == ["rep1", "rep2"]
    assert read_run_json(generation / "rep1" / "run.json")["status"] == "ok"
    interrupted = read_run_json(generation / "rep2" / "measured" / "run.json")
    assert interrupted["status"] == "interrupted" and interrupted["backend"] == "local"
    for rep in ("rep1", "rep2"):
        again = read_run_json(block.run(rep).run_dir / "run.json")
        assert again["status"] == "ok" and again["node"]["start"] == again["node"]["end"]


def _reclaimed_block(root, config, dep, run, fault, traces, block) -> dict:
    return campaign_blocks.execute_block(
        identity={
            "deployment": identity.deployment_identity(config, dep),
            "run": identity.run_identity(config, run),
            "reps": ["rep1", "rep2"],
        },
        operational=identity.operational_settings(config),
        faults=[fault],
        results_dir=str(root),
        traces=[str(t / "trace.parquet") for t in traces],
        manifests=[str(t / "manifest.json") for t in traces],
        resolved_path=str(root / "deployments" / dep["deployment_id"] / "resolved.json"),
        block_json_path=str(block.block_json),
    )
