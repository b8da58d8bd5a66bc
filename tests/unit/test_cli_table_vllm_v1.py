"""The vLLM 0.33.0 (V1) flag table parses command lines as `vllm serve` does."""

from __future__ import annotations

import pytest

from servelab.engines._cli_tables_vllm_v1 import VLLM_0_33_0
from servelab.engines.base import FlagError
from servelab.engines.cmdline import parse_table


def _parse(*flags: str):
    return parse_table("vllm_v1", VLLM_0_33_0, list(flags))


def test_table_is_plain_literals_in_the_shared_format() -> None:
    assert all(len(entry) == 8 for entry in VLLM_0_33_0)
    dests = [entry[1] for entry in VLLM_0_33_0]
    assert len(dests) == len(set(dests))
    assert dests[0] == "model_tag"


def test_defaults_when_nothing_is_given() -> None:
    args = _parse().args
    assert args["model_tag"] is None
    assert args["model"] == "Qwen/Qwen3-0.6B"
    # None = "let the engine decide" (EngineArgs resolves these after parsing).
    assert args["enable_chunked_prefill"] is None
    assert args["enable_prefix_caching"] is None
    assert args["max_num_batched_tokens"] is None
    assert args["max_num_seqs"] is None
    assert args["max_model_len"] is None
    assert args["block_size"] is None
    assert args["async_scheduling"] is None
    assert args["gpu_memory_utilization"] == 0.92
    assert args["scheduling_policy"] == "fcfs"
    assert args["dtype"] == "auto"
    assert args["served_model_name"] is None
    assert _parse().given == frozenset()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--enable-chunked-prefill", True),
        ("--no-enable-chunked-prefill", False),
        ("--disable-chunked-prefill", False),
    ],
)
def test_chunked_prefill_enable_disable(flag: str, value: bool) -> None:
    parsed = _parse(flag)
    assert parsed.args["enable_chunked_prefill"] is value
    assert "enable_chunked_prefill" in parsed.given


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--enable-prefix-caching", True),
        ("--no-enable-prefix-caching", False),
        ("--disable-prefix-caching", False),
    ],
)
def test_prefix_caching_enable_disable(flag: str, value: bool) -> None:
    assert _parse(flag).args["enable_prefix_caching"] is value


def test_values() -> None:
    parsed = _parse(
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max-num-batched-tokens=2048",
        "--max-num-seqs",
        "128",
        "--gpu-memory-utilization",
        "0.9",
        "--max-model-len",
        "16384",
        "--scheduling-policy",
        "priority",
        "--dtype",
        "bfloat16",
        "--served-model-name",
        "x",
        "--block-size",
        "16",
    )
    args = parsed.args
    assert args["model_tag"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert args["max_num_batched_tokens"] == 2048
    assert args["max_num_seqs"] == 128
    assert args["gpu_memory_utilization"] == 0.9
    assert args["max_model_len"] == 16384
    assert args["scheduling_policy"] == "priority"
    assert args["dtype"] == "bfloat16"
    assert args["served_model_name"] == ["x"]
    assert args["block_size"] == 16
    assert parsed.unknown == ()
    assert "model" not in parsed.given


def test_human_readable_ints() -> None:
    args = _parse("--max-num-batched-tokens", "2K", "--max-model-len", "auto").args
    assert args["max_num_batched_tokens"] == 2048
    assert args["max_model_len"] == -1
    assert _parse("--max-model-len=16k").args["max_model_len"] == 16000


def test_model_option() -> None:
    parsed = _parse("--model", "m", "--max-num-seqs=4")
    assert parsed.args["model"] == "m"
    assert parsed.args["model_tag"] is None
    assert parsed.given == frozenset({"model", "max_num_seqs"})


@pytest.mark.parametrize(
    "flags",
    [
        ("--max-num-seqs", "many"),
        ("--scheduling-policy", "lifo"),
        ("--dtype", "fp8"),
        ("--gpu-memory-utilization", "most"),
        ("--enable-chunked-prefill=False",),
    ],
)
def test_bad_values_raise(flags: tuple[str, ...]) -> None:
    with pytest.raises(FlagError):
        _parse(*flags)


def test_unknown_flags_are_kept() -> None:
    assert _parse("--no-such-flag").unknown == ("--no-such-flag",)
