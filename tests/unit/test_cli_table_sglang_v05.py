"""The SGLang 0.5.23 flag table (`_cli_tables_sglang_v05.py`) parsed with `cmdline.parse_table`:
the whole table builds, including 0.5's own action kinds (`boolean_optional`,
`deprecated_store_true`, `deprecated_store_const`) and value types."""

from __future__ import annotations

from typing import Any

import pytest

from servelab.engines._cli_tables_sglang_v05 import (
    SGLANG_0_5_23,
    SGLANG_0_5_23_SERVER_ARGS_FIELDS,
)
from servelab.engines.base import FlagError
from servelab.engines.cmdline import parse_table

ENGINE = "sglang_v05"


def _parse(flags: list[str], dest: str) -> Any:
    parsed = parse_table(ENGINE, SGLANG_0_5_23, flags)
    assert dest in parsed.given
    assert parsed.unknown == ()
    return parsed.args[dest]


@pytest.mark.parametrize(
    ("flags", "dest", "value"),
    [
        (["--model-path", "x"], "model_path", "x"),
        (["--model", "x"], "model_path", "x"),
        (["--chunked-prefill-size", "2048"], "chunked_prefill_size", 2048),
        (["--chunked-prefill-size=-1"], "chunked_prefill_size", -1),
        (["--mem-fraction-static", "0.85"], "mem_fraction_static", 0.85),
        (["--context-length", "16384"], "context_length", 16384),
        (["--schedule-policy", "lpm"], "schedule_policy", "lpm"),
        (["--disable-radix-cache"], "disable_radix_cache", True),
        (["--cuda-graph-max-bs-decode", "8"], "cuda_graph_max_bs_decode", 8),
        (["--enable-metrics"], "enable_metrics", True),
        (["--max-running-requests", "64"], "max_running_requests", 64),
        (["--dtype", "bfloat16"], "dtype", "bfloat16"),
    ],
)
def test_flag_values(flags: list[str], dest: str, value: Any) -> None:
    assert _parse(flags, dest) == value


def test_defaults() -> None:
    args = parse_table(ENGINE, SGLANG_0_5_23, []).args
    assert args["schedule_policy"] == "fcfs"
    assert args["disable_radix_cache"] is False
    assert args["chunked_prefill_size"] is None  # resolved from GPU memory at start-up
    assert args["mem_fraction_static"] is None
    assert args["page_size"] is None


def test_cuda_graph_max_bs_is_gone_and_ambiguous() -> None:
    # 0.5.23 has no --cuda-graph-max-bs; argparse prefix matching makes it ambiguous between
    # --cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill, so the engine refuses it.
    assert "cuda_graph_max_bs" not in {e[1] for e in SGLANG_0_5_23}
    with pytest.raises(FlagError, match="ambiguous"):
        parse_table(ENGINE, SGLANG_0_5_23, ["--cuda-graph-max-bs", "8"])


@pytest.mark.parametrize(
    "flags",
    [
        ["--chunked-prefill-size", "big"],
        ["--mem-fraction-static", "most"],
        ["--schedule-policy", "sjf"],
        ["--dtype", "bf16"],
    ],
)
def test_bad_value_raises(flags: list[str]) -> None:
    with pytest.raises(FlagError, match=flags[0]):
        parse_table(ENGINE, SGLANG_0_5_23, flags)


def test_server_args_fields() -> None:
    fields = SGLANG_0_5_23_SERVER_ARGS_FIELDS
    assert len(fields) == len(set(fields))
    assert fields[:2] == ("model_path", "tokenizer_path")
    for name in ("chunked_prefill_size", "disable_radix_cache", "schedule_policy"):
        assert name in fields


def test_full_table_builds() -> None:
    parsed = parse_table(ENGINE, SGLANG_0_5_23, ["--model-path", "x"])
    assert parsed.args["schedule_policy"] == "fcfs" and parsed.args["chunked_prefill_size"] is None


@pytest.mark.parametrize(
    ("flags", "dest", "value"),
    [
        # argparse.BooleanOptionalAction: the flag and its --no- form
        (["--enable-tf32-matmul"], "enable_tf32_matmul", True),
        (["--no-enable-tf32-matmul"], "enable_tf32_matmul", False),
        # DeprecatedStoreTrueAction warns and stores True; the engine still starts
        (["--disable-cuda-graph"], "disable_cuda_graph", True),
        # SGLang's human_readable_int: SI x1000 (decimals), IEC x1024 (integers)
        (["--context-length", "16k"], "context_length", 16000),
        (["--context-length", "16Ki"], "context_length", 16384),
        (["--max-total-tokens", "25.6k"], "max_total_tokens", 25600),
        (
            ["--cuda-graph-config", '{"decode": {"max_bs": 8}}'],
            "cuda_graph_config",
            {"decode": {"max_bs": 8}},
        ),
    ],
)
def test_version_05_kinds_and_types(flags: list[str], dest: str, value: Any) -> None:
    assert _parse(flags, dest) == value


@pytest.mark.parametrize(
    "flags",
    [
        ["--context-length", "1.5Ki"],  # no decimals with IEC suffixes
        ["--context-length", "16K"],  # case-sensitive: K is not a suffix
        ["--cuda-graph-config", '{"verify": {}}'],  # unknown phase
        ["--cuda-graph-backend-decode", "tc_piecewise"],  # retired backend
    ],
)
def test_version_05_types_refuse_what_sglang_refuses(flags: list[str]) -> None:
    with pytest.raises(FlagError):
        parse_table(ENGINE, SGLANG_0_5_23, flags)
