"""End-to-end tests of the simulator's artifact API on a small compiled trace (servelab.sim.run)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from servelab.artifacts import (
    REQUESTS_SCHEMA,
    SCRAPE_SCHEMA,
    TRACE_SCHEMA,
    read_parquet,
    read_run_json,
)
from servelab.engines import METRIC_MAP, parse_startup_log
from servelab.grid.config import Condition, arm_conditions, deployment_for
from servelab.sim.run import sim_deploy, sim_platform, simulate_run_files
from servelab.workload import compile_trace_files

CONDITION, REP = "rate-0.28", "rep1"  # a small stand-in trace under the grid's condition id


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory, _study_config: dict) -> Path:
    out = tmp_path_factory.mktemp("trace")
    compile_trace_files(
        condition=Condition(
            id=CONDITION,
            sweep="rate",
            rate=0.3,
            sharing=0.9,
            prompt_tokens=512,
            duration_s=40.0,
        ),
        rep=REP,
        seed=12345,
        workload=_study_config["workload"],
        tokenizer=_study_config["tokenizer"],
        trace_path=out / "trace.parquet",
        manifest_path=out / "manifest.json",
    )
    return out


def run(
    cfg: dict,
    trace: Path,
    out: Path,
    *,
    arm: str = "defaults",
    engine: str = "vllm",
    **overrides: Any,
) -> dict[str, Any]:
    dep = deployment_for(cfg, arm, engine, CONDITION)
    kwargs: dict[str, Any] = dict(
        trace_path=trace / "trace.parquet",
        manifest_path=trace / "manifest.json",
        arm=arm,
        engine=engine,
        condition=CONDITION,
        rep=REP,
        flags=list(dep.flags),
        gpu_name="L4",
        gpu_memory_mib=23034,
        model_preset="llama-3.1-8b",
        deployment_id=dep.id,
        warmup_requests=20,
        request_timeout_s=300.0,
        stream_interval=1,
        telemetry_step_s=5.0,
        success_threshold=0.95,
        offered_load_rps=1.8,
        attempt=1,
        faults=[],
        requests_path=out / "requests.parquet",
        scrape_path=out / "scrape.parquet",
        run_json_path=out / "run.json",
    )
    kwargs.update(overrides)
    return simulate_run_files(**kwargs)


def rows(out: Path) -> list[dict[str, Any]]:
    return read_parquet(out / "requests.parquet", REQUESTS_SCHEMA).to_pylist()


@pytest.mark.parametrize("arm", ["defaults", "matched"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_resolved_configuration_follows_the_engines_rules(
    tmp_path: Path, study_config: dict, arm: str, engine: str
) -> None:
    for cond in sorted(
        set(arm_conditions(study_config, arm, engine)) & {"rate-0.28", "length-8192"}
    ):
        dep = deployment_for(study_config, arm, engine, cond)
        log = tmp_path / f"{arm}-{engine}-{cond}.log"
        resolved = sim_deploy(
            engine=engine,
            flags=list(dep.flags),
            gpu_name="L4",
            gpu_memory_mib=23034,
            model_preset="llama-3.1-8b",
            deployment_id=dep.id,
            startup_log_path=log,
            timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        )
        parsed = parse_startup_log(log.read_text(), engine)
        assert parsed.chunked_prefill is dep.expect_chunked_prefill is resolved.chunked_prefill
        assert parsed.chunk_size == dep.expect_chunk_size == resolved.chunk_size
        assert parsed.context_len == 16384 and parsed.prefix_caching is True


def test_identical_inputs_give_byte_identical_outputs(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    for engine in ("vllm", "sglang"):
        a, b = tmp_path / f"{engine}-a", tmp_path / f"{engine}-b"
        run(study_config, small_trace, a, engine=engine)
        run(study_config, small_trace, b, engine=engine)
        for name in ("requests.parquet", "scrape.parquet", "run.json"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), (engine, name)


def test_outputs_do_not_depend_on_the_process_hash_seed(
    tmp_path: Path, small_trace: Path, study_config: dict, repo: Path
) -> None:
    import os
    import subprocess
    import sys

    # the CLI runs the config's platform (sim.platform: on by default); so does this run
    platform = sim_platform(study_config)
    assert platform.settings.enabled
    run(study_config, small_trace, tmp_path / "here", engine="vllm", platform=platform)
    cmd = [sys.executable, "-m", "servelab.cli", "sim", "run", "--config"]
    cmd += [str(repo / "config" / "config.yaml"), "--arm", "defaults", "--engine", "vllm"]
    cmd += ["--condition", CONDITION, "--rep", REP, "--trace", str(small_trace)]
    cmd += ["--out", str(tmp_path / "there")]
    env = dict(os.environ, PYTHONHASHSEED="4242")
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=120)
    for name in ("requests.parquet", "scrape.parquet"):
        assert (tmp_path / "here" / name).read_bytes() == (tmp_path / "there" / name).read_bytes()
    here = read_run_json(tmp_path / "here" / "run.json")
    there = read_run_json(tmp_path / "there" / "run.json")
    assert here.pop("offered_load_rps") == 1.8  # the CLI takes Λ from the config instead
    there.pop("offered_load_rps")
    assert here == there


def test_run_artifacts_follow_the_contract(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    record = run(study_config, small_trace, tmp_path)
    on_disk = read_run_json(tmp_path / "run.json")
    assert on_disk == record
    assert record["backend"] == "sim" and record["status"] == "ok"
    assert record["node"]["start"] == record["node"]["end"]
    assert record["resolved_config"]["chunked_prefill"] is False
    reqs = rows(tmp_path)
    warm = [r for r in reqs if r["warmup"]]
    trace = [r for r in reqs if not r["warmup"]]
    assert len(warm) == 20 and {r["role"] for r in warm} == {"warmup"}
    assert {r["graph_id"] for r in warm} == {-1}
    t0 = max(r["chunk_times_s"][-1] for r in warm)
    assert record["trace_start_s"] == pytest.approx(t0)
    assert min(r["scheduled_s"] for r in trace) >= t0
    assert record["n_sent"] == len(trace) == record["n_ok"]
    for r in trace:  # ignore_eos: exactly max_tokens; vLLM streams one token per chunk
        assert r["status"] == "ok" and r["error"] is None
        assert r["output_tokens"] == r["max_tokens"] == len(r["chunk_times_s"])
        assert r["prompt_tokens"] == 512 + 1  # BOS
        assert r["sent_s"] == r["scheduled_s"]
        assert np.all(np.diff(r["chunk_times_s"]) >= 0) and r["chunk_times_s"][0] > r["sent_s"]
    scrape = read_parquet(tmp_path / "scrape.parquet", SCRAPE_SCHEMA).to_pylist()
    names = {s["source_metric"] for s in scrape}
    assert set(METRIC_MAP["vllm"].values()) - {None} <= names
    times = sorted({s["t_s"] for s in scrape})
    assert times[0] == 0.0 and np.allclose(np.diff(times), 5.0)
    # the window's closing sample: the first telemetry time at or after the end
    window = record["end_unix_s"] - record["start_unix_s"]
    assert times[-2] < window <= times[-1] < window + 5.0
    # so the counters hold the whole run: every token the requests were sent, to the last step
    generated = [s["value"] for s in scrape if s["source_metric"] == "vllm:generation_tokens_total"]
    assert generated[0] == 0.0
    assert generated[-1] == sum(r["output_tokens"] for r in reqs)


def test_graph_release_semantics_are_honoured(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    record = run(study_config, small_trace, tmp_path, engine="sglang")
    t0 = record["trace_start_s"]
    spec = {
        r["request_id"]: r
        for r in read_parquet(small_trace / "trace.parquet", TRACE_SCHEMA).to_pylist()
    }
    got = {r["request_id"]: r for r in rows(tmp_path) if not r["warmup"]}
    assert set(got) == set(spec)
    for rid, r in got.items():
        s = spec[rid]
        if not s["depends_on"]:
            assert r["scheduled_s"] == pytest.approx(t0 + s["arrival_s"] + s["tool_delay_s"])
        else:
            done = max(got[d]["chunk_times_s"][-1] for d in s["depends_on"])
            assert r["scheduled_s"] == pytest.approx(done + s["tool_delay_s"])


def test_sglang_streams_one_chunk_per_stream_interval(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    run(study_config, small_trace, tmp_path, engine="sglang", stream_interval=4)
    for r in rows(tmp_path):
        if r["warmup"]:
            continue
        assert sum(r["chunk_tokens"]) == r["output_tokens"]
        assert all(n == 4 for n in r["chunk_tokens"][:-1]) and 1 <= r["chunk_tokens"][-1] <= 4


def test_requests_past_the_timeout_time_out(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    record = run(study_config, small_trace, tmp_path, request_timeout_s=3.0)
    timed_out = [r for r in rows(tmp_path) if r["status"] == "timeout"]
    assert timed_out and record["n_failed"] == len(timed_out)
    for r in timed_out:
        assert r["output_tokens"] is None
        assert all(t <= r["sent_s"] + 3.0 for t in r["chunk_times_s"])


def test_reclamation_interrupts_the_run_and_changes_the_node(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    record = run(study_config, small_trace, tmp_path, faults=[{"kind": "reclaim", "at_s": 20.0}])
    assert record["status"] == "interrupted"
    assert record["node"]["start"] != record["node"]["end"]
    assert record["end_unix_s"] - record["start_unix_s"] == pytest.approx(20.0)
    assert all(r["sent_s"] <= 20.0 for r in rows(tmp_path))


def test_engine_failure_fails_the_run(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    record = run(study_config, small_trace, tmp_path, faults=[{"kind": "fail"}])
    assert record["status"] == "failed" and record["n_ok"] == 0
    assert all(r["status"] == "error" for r in rows(tmp_path) if not r["warmup"])


def test_warm_ups_take_the_configured_prompt_length(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    """`warmup_prompt_tokens` sets every warm-up prompt's length (the floor's batch of long
    contexts); unset, the protocol's 128 tokens, and the same warm-ups as before it existed."""
    default, longer = tmp_path / "default", tmp_path / "longer"
    record = run(study_config, small_trace, default)
    longer_record = run(study_config, small_trace, longer, warmup_prompt_tokens=700)
    warm = [r for r in rows(default) if r["warmup"]]
    warm_long = [r for r in rows(longer) if r["warmup"]]
    assert len(warm) == len(warm_long) == 20
    # as the engine counts them: the prompt and the BOS the model adds (llama-3.1-8b has one)
    assert {r["prompt_tokens"] for r in warm} == {128 + 1}
    assert {r["prompt_tokens"] for r in warm_long} == {700 + 1}
    assert record["sim"]["warmup_prompt_tokens"] == 128
    assert longer_record["sim"]["warmup_prompt_tokens"] == 700
    # longer warm-ups take longer: the trace starts later
    assert longer_record["trace_start_s"] > record["trace_start_s"]
    with pytest.raises(ValueError, match="warmup_prompt_tokens"):
        run(study_config, small_trace, tmp_path / "bad", warmup_prompt_tokens=0)


def test_warm_ups_are_sent_their_spacing_apart(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    """`warmup_spacing_s` sends the k-th warm-up at k x the spacing, as the live dispatcher
    does; recorded in run.json only when set, so a run from before it reads the same."""
    at_once = run(study_config, small_trace, tmp_path / "once")
    spaced = run(study_config, small_trace, tmp_path / "spaced", warmup_spacing_s=0.01)
    warm = [r for r in rows(tmp_path / "spaced") if r["warmup"]]
    assert [r["scheduled_s"] for r in warm] == pytest.approx([0.01 * k for k in range(20)])
    assert [r["sent_s"] for r in warm] == pytest.approx([0.01 * k for k in range(20)])
    assert {r["sent_s"] for r in rows(tmp_path / "once") if r["warmup"]} == {0.0}
    assert spaced["sim"]["warmup_spacing_s"] == 0.01
    assert "warmup_spacing_s" not in at_once["sim"]
    with pytest.raises(ValueError, match="warmup_spacing_s"):
        run(study_config, small_trace, tmp_path / "bad", warmup_spacing_s=-0.1)


def test_bad_inputs_are_refused_with_the_key_named(
    tmp_path: Path, small_trace: Path, study_config: dict
) -> None:
    with pytest.raises(ValueError, match=r"faults\[0\]\.kind"):
        run(study_config, small_trace, tmp_path, faults=[{"kind": "meteor"}])
    with pytest.raises(ValueError, match="condition"):
        run(study_config, small_trace, tmp_path, condition="rate-0.40")
    assert not (tmp_path / "run.json").exists()


def test_cli_runs_one_condition(tmp_path: Path, small_trace: Path, repo: Path) -> None:
    from servelab.cli import main

    rc = main(
        [
            "sim", "run", "--config", str(repo / "config" / "config.yaml"), "--arm", "matched",
            "--engine", "sglang", "--condition", CONDITION, "--rep", REP,
            "--trace", str(small_trace), "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert rc == 0
    assert pq.read_table(tmp_path / "requests.parquet").num_rows > 20
    assert read_run_json(tmp_path / "run.json")["arm"] == "matched"
