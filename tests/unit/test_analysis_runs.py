"""Loading run artifacts: found/parsed/skipped, and clear errors for bad input and bad pooling."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from servelab.analysis import PoolingError, discover_run_dirs, load_runs, read_restart_record
from servelab.analysis.summary import Analysis
from servelab.analysis.synthetic import RunSpec, write_simple_run
from servelab.artifacts import ArtifactError


def _run(root: Path, arm: str, engine: str, cond: str, rep: str, **spec_kw) -> Path:
    spec = RunSpec(arm, engine, cond, rep, seed=int(rep[-1]), **spec_kw)
    return write_simple_run(root / "runs" / arm / engine / cond / rep, spec, [1.0, 2.0, 3.0])


def test_found_parsed_skipped_are_counted_and_logged(tmp_path: Path, caplog) -> None:
    dirs = [
        _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep1"),
        _run(tmp_path, "defaults", "sglang", "rate-0.12", "rep1"),
        _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep2", status="failed"),
        _run(tmp_path, "defaults", "sglang", "rate-0.12", "rep2", status="interrupted"),
    ]
    (dirs[2] / "requests.parquet").write_bytes(b"garbage: a failed run's files are never read")
    with caplog.at_level(logging.INFO, logger="servelab.analysis"):
        rs = load_runs(dirs)
    assert (rs.found, rs.parsed, len(rs.skipped)) == (4, 2, 2)
    assert [s.run_id for s in rs.skipped] == [
        "defaults/sglang/rate-0.12/rep2",
        "defaults/vllm/rate-0.12/rep2",
    ]
    assert rs.skipped[1].status == "failed"
    assert "run logs: 4 found, 2 parsed, 2 skipped" in caplog.text
    assert "defaults/vllm/rate-0.12/rep2" in caplog.text


def test_discover_run_dirs_only_takes_complete_runs(tmp_path: Path) -> None:
    a = _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep1")
    (tmp_path / "runs" / "defaults" / "vllm" / "rate-0.12" / "rep2").mkdir()
    assert discover_run_dirs(tmp_path / "runs") == [a]
    with pytest.raises(ArtifactError, match="no such directory"):
        discover_run_dirs(tmp_path / "nowhere")


def test_truncated_parquet_names_the_file(tmp_path: Path) -> None:
    d = _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep1")
    path = d / "requests.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ArtifactError, match=r"requests\.parquet: not a readable Parquet file") as e:
        load_runs([d])
    assert str(path) in str(e.value)


def test_run_json_missing_fields_names_the_file_and_fields(tmp_path: Path) -> None:
    d = _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep1")
    record = json.loads((d / "run.json").read_text())
    del record["backend"], record["offered_load_rps"]
    (d / "run.json").write_text(json.dumps(record))
    with pytest.raises(
        ArtifactError, match=r"run\.json: missing field\(s\) backend, offered_load_rps"
    ):
        load_runs([d])


def test_run_json_identity_must_be_consistent(tmp_path: Path) -> None:
    d = _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep1")
    record = json.loads((d / "run.json").read_text())
    record["rep"] = "rep2"
    (d / "run.json").write_text(json.dumps(record))
    with pytest.raises(ArtifactError, match="does not match its parts"):
        load_runs([d])


def test_two_backends_are_refused_naming_the_runs(tmp_path: Path) -> None:
    dirs = [
        _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep1", backend="sim"),
        _run(tmp_path, "defaults", "sglang", "rate-0.12", "rep1", backend="kubernetes"),
    ]
    with pytest.raises(PoolingError, match="different backends") as e:
        load_runs(dirs)
    msg = str(e.value)
    assert "kubernetes: defaults/sglang/rate-0.12/rep1" in msg
    assert "sim: defaults/vllm/rate-0.12/rep1" in msg


def test_repetitions_with_different_configurations_are_not_pooled(tmp_path: Path) -> None:
    dirs = [
        _run(tmp_path, "matched", "vllm", "rate-0.28", "rep1", chunk_size=2048),
        _run(tmp_path, "matched", "vllm", "rate-0.28", "rep2", chunk_size=512),
    ]
    rs = load_runs(dirs)
    with pytest.raises(
        PoolingError, match=r"refusing to pool runs of matched/vllm/rate-0\.28"
    ) as e:
        rs.group("matched", "vllm", "rate-0.28")
    assert "matched/vllm/rate-0.28/rep1" in str(e.value)
    assert "matched/vllm/rate-0.28/rep2" in str(e.value)


def test_paired_runs_must_share_the_trace(tmp_path: Path) -> None:
    v = _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep1")
    s = write_simple_run(
        tmp_path / "s",
        RunSpec("defaults", "sglang", "rate-0.12", "rep1", seed=99),
        [1.0, 2.0],
    )
    rs = load_runs([v, s])
    with pytest.raises(PoolingError, match="different traces"):
        Analysis(rs).gap("defaults", "rate-0.12", "ttft_p50")


def test_the_same_run_twice_is_refused(tmp_path: Path) -> None:
    d = _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep1")
    with pytest.raises(ArtifactError, match="given twice"):
        load_runs([d, d])


def test_missing_telemetry_only_matters_when_needed(tmp_path: Path) -> None:
    d = _run(tmp_path, "defaults", "vllm", "rate-0.12", "rep1")
    (d / "telemetry.parquet").unlink()
    assert load_runs([d], telemetry=False).parsed == 1
    with pytest.raises(ArtifactError, match=r"telemetry\.parquet: no such file"):
        load_runs([d])


def test_restart_record_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "restart.json"
    events = {"deleted": 0, "terminated": 5, "scheduled": 5, "pull_started": 6, "pulled": 9,
              "container_started": 10, "ready": 130}  # fmt: skip
    path.write_text(json.dumps({"engine": "vllm", "rep": "rep1", "events": events}))
    rec = read_restart_record(path)
    assert rec.phases == {"terminate": 5, "schedule": 0, "image_pull": 3, "unmeasured": 2,
                          "initialise": 120}  # fmt: skip
    assert rec.total_s == 130
    path.write_text(json.dumps({"engine": "vllm", "rep": "rep1", "events": {**events, "ready": 4}}))
    with pytest.raises(ArtifactError, match=r"restart\.json: event 'ready' \(4\.0\) precedes"):
        read_restart_record(path)
    path.write_text(json.dumps({"engine": "vllm", "events": events}))
    with pytest.raises(ArtifactError, match=r"restart\.json: missing field\(s\) rep"):
        read_restart_record(path)
