"""The resolved-configuration gate refuses a mismatch or an unconfirmed value, quoting the line."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from servelab.engines import (
    ResolvedConfigMismatch,
    check_resolved,
    kv_capacity_tokens,
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


# ----------------------------------------------------------------- schedule policy (ablations)


def test_the_schedule_policy_sglang_resolved_is_confirmed_and_a_mismatch_refused():
    """config/ablations/sglang-fcfs.yaml: the matched arm expects fcfs; lpm is SGLang 0.4.1's
    default, read from its own server_args line."""
    fcfs = parse_startup_log(_log("sglang", ["--model-path=m", "--schedule-policy=fcfs"]))
    lpm = parse_startup_log(_log("sglang", ["--model-path=m"]))
    assert (fcfs.schedule_policy, lpm.schedule_policy) == ("fcfs", "lpm")
    common = {"expect_chunked_prefill": True, "expect_chunk_size": 2048}
    check_resolved(fcfs, **common, expect_schedule_policy="fcfs")
    check_resolved(lpm, **common, expect_schedule_policy="lpm")
    check_resolved(lpm, **common)  # not expected: not checked
    with pytest.raises(
        ResolvedConfigMismatch, match="sglang: resolved schedule_policy=lpm, expected fcfs"
    ) as info:
        check_resolved(lpm, **common, expect_schedule_policy="fcfs")
    assert "schedule_policy='lpm'" in str(info.value)  # the server_args line, quoted
    assert f"line {lpm.evidence_lines['schedule_policy']}" in str(info.value)


def test_sglang_falls_back_to_fcfs_without_the_radix_cache_and_the_gate_reads_the_fallback():
    parsed = parse_startup_log(_log("sglang", ["--model-path=m", "--disable-radix-cache"]))
    check_resolved(
        parsed, expect_chunked_prefill=True, expect_chunk_size=2048, expect_schedule_policy="fcfs"
    )
    with pytest.raises(ResolvedConfigMismatch, match="expected lpm") as info:
        check_resolved(
            parsed,
            expect_chunked_prefill=True,
            expect_chunk_size=2048,
            expect_schedule_policy="lpm",
        )
    assert "falls back to fcfs" in str(info.value)  # the note of the implicit reading


def test_a_policy_the_log_does_not_show_is_not_confirmed():
    parsed = parse_startup_log((DATA / "vllm-0.6.4dev-chunked-on-01.log").read_text())
    assert parsed.schedule_policy is None  # no args line in this log
    with pytest.raises(ResolvedConfigMismatch, match="schedule policy not confirmed"):
        check_resolved(
            parsed,
            expect_chunked_prefill=True,
            expect_chunk_size=512,
            expect_schedule_policy="fcfs",
        )


# ----------------------------------------------------------------- KV capacity (ablations)


def test_the_kv_capacity_each_engine_logs_is_read_and_checked():
    """SGLang's max_total_num_tokens; vLLM 0.6.3's GPU blocks times the args line's block size."""
    sglang = parse_startup_log(_log("sglang", ["--model-path=m"]))
    vllm = parse_startup_log(_log("vllm", VLLM_MATCHED))
    assert kv_capacity_tokens(sglang) == (34000, ("max_total_num_tokens",))
    assert vllm.facts["block_size"] == 16
    assert kv_capacity_tokens(vllm) == (34000 // 16 * 16, ("num_gpu_blocks", "block_size"))
    check_resolved(
        sglang, expect_chunked_prefill=True, expect_chunk_size=2048, expect_kv_capacity_tokens=34000
    )
    with pytest.raises(
        ResolvedConfigMismatch, match="allocated kv_capacity_tokens=34000, expected 30272"
    ) as info:
        check_resolved(
            sglang,
            expect_chunked_prefill=True,
            expect_chunk_size=2048,
            expect_kv_capacity_tokens=30272,
        )
    assert "max_total_num_tokens=34000" in str(info.value)  # the summary line, quoted
    with pytest.raises(ResolvedConfigMismatch, match=r"# GPU blocks: 2125"):
        check_resolved(
            vllm, expect_chunked_prefill=True, expect_chunk_size=2048, expect_kv_capacity_tokens=1
        )
    # Within a tolerance: 34000 is 12.3% above 30272.
    check_resolved(
        sglang,
        expect_chunked_prefill=True,
        expect_chunk_size=2048,
        expect_kv_capacity_tokens=30272,
        kv_capacity_tolerance=0.13,
    )
    with pytest.raises(ResolvedConfigMismatch, match=r"within 12\.0%"):
        check_resolved(
            sglang,
            expect_chunked_prefill=True,
            expect_chunk_size=2048,
            expect_kv_capacity_tokens=30272,
            kv_capacity_tolerance=0.12,
        )


def test_a_capacity_the_log_does_not_show_is_not_confirmed():
    parsed = parse_startup_log((DATA / "vllm-vdev-01.log").read_text())
    assert kv_capacity_tokens(parsed) is None
    with pytest.raises(ResolvedConfigMismatch, match="KV capacity not confirmed"):
        check_resolved(
            parsed.__class__(**{**parsed.__dict__, "chunked_prefill": False}),
            expect_chunked_prefill=False,
            expect_chunk_size=None,
            expect_kv_capacity_tokens=1000,
        )
