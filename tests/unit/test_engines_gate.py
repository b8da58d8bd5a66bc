"""The resolved-configuration gate refuses a mismatch or an unconfirmed value, quoting the line."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from servelab.engines import (
    ResolvedConfigMismatch,
    check_resolved,
    parse_startup_log,
    render_startup_log,
    resolve,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "engine-logs"
T0 = datetime(2024, 10, 14, 12, 0, 0)


def _log(engine: str, flags: list[str]) -> str:
    r = resolve(engine, flags, gpu_memory_mib=23034)
    return render_startup_log(r, kv_capacity_tokens=34000, weights_gib=15.0, timestamp=T0)


VLLM_DEFAULTS = [
    "--model=m",
    "--max-model-len=16384",
    "--enable-prefix-caching",
    "--enable-chunked-prefill=False",
]
VLLM_MATCHED = [
    "--model=m",
    "--max-model-len=16384",
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
    "--max-num-batched-tokens=2048",
]


def test_matching_configurations_pass():
    check_resolved(
        parse_startup_log(_log("vllm", VLLM_DEFAULTS)),
        expect_chunked_prefill=False,
        expect_chunk_size=None,
    )
    check_resolved(
        parse_startup_log(_log("vllm", VLLM_MATCHED)),
        expect_chunked_prefill=True,
        expect_chunk_size=2048,
    )
    check_resolved(
        parse_startup_log(_log("sglang", ["--model-path=m"])),
        expect_chunked_prefill=True,
        expect_chunk_size=2048,
    )
    # A size of None accepts any chunk size as long as chunking is on.
    check_resolved(
        parse_startup_log(_log("vllm", VLLM_MATCHED)),
        expect_chunked_prefill=True,
        expect_chunk_size=None,
    )


def test_a_vllm_defaults_deployment_fails_the_matched_expectation_quoting_the_engine_line():
    parsed = parse_startup_log(_log("vllm", VLLM_DEFAULTS))
    with pytest.raises(ResolvedConfigMismatch) as info:
        check_resolved(parsed, expect_chunked_prefill=True, expect_chunk_size=2048)
    msg = str(info.value)
    assert "vllm: resolved chunked_prefill=False, expected True" in msg
    assert parsed.evidence["chunked_prefill"] in msg  # the exact start-up log line
    assert f"line {parsed.evidence_lines['chunked_prefill']}" in msg


def test_a_wrong_chunk_size_quotes_the_chunk_line():
    parsed = parse_startup_log(_log("vllm", [*VLLM_MATCHED[:-1], "--max-num-batched-tokens=4096"]))
    with pytest.raises(
        ResolvedConfigMismatch, match="resolved chunk_size=4096, expected 2048"
    ) as info:
        check_resolved(parsed, expect_chunked_prefill=True, expect_chunk_size=2048)
    assert "Chunked prefill is enabled with max_num_batched_tokens=4096." in str(info.value)


def test_sglang_on_a_large_gpu_fails_the_l4_expectation_quoting_server_args():
    text = (DATA / "sglang-0.4.1-01.log").read_text()  # 80 GB GPU: chunk 8192
    parsed = parse_startup_log(text)
    with pytest.raises(
        ResolvedConfigMismatch, match="resolved chunk_size=8192, expected 2048"
    ) as info:
        check_resolved(parsed, expect_chunked_prefill=True, expect_chunk_size=2048)
    assert "chunked_prefill_size=8192" in str(info.value)
    assert "server_args=ServerArgs(" in str(info.value)


def test_not_shown_is_not_confirmed():
    parsed = parse_startup_log((DATA / "vllm-vdev-01.log").read_text())  # engine line cut
    assert parsed.chunked_prefill is None
    for expect in (True, False):
        with pytest.raises(ResolvedConfigMismatch, match="not confirmed"):
            check_resolved(parsed, expect_chunked_prefill=expect, expect_chunk_size=None)
    # Chunking confirmed on but the size not shown: refused when a size is expected.
    on_no_size = parse_startup_log(
        (DATA / "vllm-0.6.4dev-chunked-on-01.log")
        .read_text()
        .replace("Chunked prefill is enabled with max_num_batched_tokens=512.", "(removed)")
    )
    assert (on_no_size.chunked_prefill, on_no_size.chunk_size) == (True, None)
    with pytest.raises(ResolvedConfigMismatch, match="chunk size not confirmed"):
        check_resolved(on_no_size, expect_chunked_prefill=True, expect_chunk_size=512)


def test_an_implicit_reading_is_quoted_with_its_note():
    parsed = parse_startup_log((DATA / "vllm-0.6.2-chunked-off-01.log").read_text())
    with pytest.raises(ResolvedConfigMismatch, match="implicit") as info:
        check_resolved(parsed, expect_chunked_prefill=True, expect_chunk_size=None)
    assert "Initializing an LLM engine (v0.6.1.dev238+ge2c6e0a82)" in str(info.value)


def test_an_inconsistent_expectation_is_a_caller_error():
    parsed = parse_startup_log(_log("vllm", VLLM_DEFAULTS))
    with pytest.raises(ValueError, match="only meaningful"):
        check_resolved(parsed, expect_chunked_prefill=False, expect_chunk_size=2048)
