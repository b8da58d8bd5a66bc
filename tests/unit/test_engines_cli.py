"""`servelab resolve-config`: JSON on stdout, exit codes, clear errors."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from servelab.engines.cli import register

DATA = Path(__file__).resolve().parents[1] / "data" / "engine-logs"


def main(argv: list[str]) -> int:
    """The engines' subcommand alone (servelab.cli.main imports every subpackage's CLI)."""
    parser = argparse.ArgumentParser(prog="servelab")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_registered_in_the_servelab_cli(capsys):
    from servelab.cli import main as servelab_main

    assert servelab_main(["resolve-config", str(DATA / "sglang-0.4.2-chunk2048-01.log")]) == 0
    assert json.loads(capsys.readouterr().out)["chunk_size"] == 2048
    assert servelab_main(["resolve-config", str(DATA / "README.md")]) == 2


def test_prints_one_json_object_for_a_vllm_log(capsys):
    assert main(["resolve-config", str(DATA / "vllm-0.6.4dev-chunked-on-01.log")]) == 0
    out = capsys.readouterr().out
    obj = json.loads(out)
    assert list(obj) == sorted(obj)
    assert {k: obj[k] for k in ("engine", "version", "chunked_prefill", "chunk_size")} == {
        "engine": "vllm",
        "version": "0.6.4.dev26+g92d86da2.d20241017",
        "chunked_prefill": True,
        "chunk_size": 512,
    }
    assert obj["schedule_policy"] is None  # not shown: null, never a default
    assert (
        "Chunked prefill is enabled with max_num_batched_tokens=512."
        in obj["evidence"]["chunk_size"]
    )


def test_engine_can_be_given(capsys):
    assert main(["resolve-config", "--engine", "sglang", str(DATA / "sglang-0.4.1-01.log")]) == 0
    assert json.loads(capsys.readouterr().out)["chunk_size"] == 8192


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["README.md"], "not a vLLM, SGLang or llama.cpp start-up log"),
        (["vllm-V0-metrics-01.txt"], "not a vLLM, SGLang or llama.cpp start-up log"),
        (["--engine", "vllm", "sglang-0.4.1-01.log"], "looks like an SGLang log"),
        (["no-such-file.log"], "cannot read"),
    ],
)
def test_errors_exit_non_zero_with_a_message(capsys, args, message):
    argv = [
        "resolve-config",
        *[a if a.startswith("--") or a in ("vllm", "sglang") else str(DATA / a) for a in args],
    ]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err


def test_a_directory_is_unreadable(capsys, tmp_path):
    assert main(["resolve-config", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_console_script_runs(tmp_path):
    import subprocess
    import sys

    exe = shutil.which("servelab", path=str(Path(sys.executable).parent))
    assert exe is not None
    log = tmp_path / "startup.log"
    log.write_bytes((DATA / "vllm-vdev-01.log").read_bytes())
    done = subprocess.run(
        [exe, "resolve-config", str(log)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["version"] == "dev"


def test_an_unknown_engine_choice_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["resolve-config", "--engine", "tgi", str(DATA / "vllm-vdev-01.log")])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
