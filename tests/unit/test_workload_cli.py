"""`servelab trace compile|validate|show` smoke tests (in-process, on a shortened condition)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from servelab.artifacts import file_sha256, write_json
from servelab.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    for cond in config["conditions"]:
        cond["duration_s"] = 20
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def compiled(config_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trace") / "length-512" / "rep1"
    code = main(
        [
            "trace",
            "compile",
            "--config",
            str(config_path),
            "--condition",
            "length-512",
            "--rep",
            "rep1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


def test_compile_writes_both_files(compiled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (compiled / "trace.parquet").is_file() and (compiled / "manifest.json").is_file()
    manifest = json.loads((compiled / "manifest.json").read_text())
    assert manifest["condition"] == "length-512" and manifest["prompt_tokens"] == 512


def test_validate_passes_a_good_trace(compiled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "validate", str(compiled)]) == 0
    out = capsys.readouterr().out
    assert "all 6 checks passed" in out and "FAILED" not in out


def test_validate_exits_1_naming_the_failed_check(compiled: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    for name in ("trace.parquet", "manifest.json"):
        (tmp_path / name).write_bytes((compiled / name).read_bytes())
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["workload"]["tool_delay"]["max_s"] = 0.01
    manifest["trace_sha256"] = file_sha256(tmp_path / "trace.parquet")
    write_json(tmp_path / "manifest.json", manifest)
    assert main(["trace", "validate", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "tool_delays_bounded        FAILED: request g" in out and "1 check(s) failed" in out


def test_validate_of_a_missing_trace_is_an_error(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["trace", "validate", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_show_summarises(compiled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "show", str(compiled), "--rows", "3"]) == 0
    out = capsys.readouterr().out
    manifest = json.loads((compiled / "manifest.json").read_text())
    assert f"{manifest['n_graphs']} graphs, {manifest['n_requests']} requests" in out
    assert "g00000-planner" in out and "g00000-w2" in out and "g00000-w3" not in out
    assert "gap CV" in out and "tool delay" in out


def test_compile_of_an_unknown_condition_names_it(
    config_path: Path, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    code = main(
        [
            "trace",
            "compile",
            "--config",
            str(config_path),
            "--condition",
            "rate-7.00",
            "--rep",
            "rep1",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 2
    assert "rate-7.00" in capsys.readouterr().err
