"""Flags parsed as each engine's own argument parser reads them."""

from __future__ import annotations

import pytest

from servelab.engines import FlagError, parse_flags
from servelab.engines import _cli_tables as tables


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], None),  # not given: None, resolved later by the 32K rule
        (["--enable-chunked-prefill"], True),  # StoreBoolean with const "True"
        (["--enable-chunked-prefill=False"], False),
        (["--enable-chunked-prefill=false"], False),
        (["--enable-chunked-prefill", "True"], True),
        (["--enable-chunked-prefill=TRUE"], True),
        (["--enable_chunked_prefill=False"], False),  # FlexibleArgumentParser: underscores
    ],
)
def test_vllm_store_boolean_chunked_prefill(flags, expected):
    parsed = parse_flags("vllm", flags)
    assert parsed["enable_chunked_prefill"] is expected
    assert parsed.is_given("enable_chunked_prefill") is (expected is not None)


def test_equals_and_space_forms_agree():
    eq = parse_flags("vllm", ["--max-num-batched-tokens=2048", "--max-model-len=16384"])
    sp = parse_flags("vllm", ["--max-num-batched-tokens", "2048", "--max-model-len", "16384"])
    assert eq.args == sp.args
    assert eq["max_num_batched_tokens"] == 2048 and eq["max_model_len"] == 16384


def test_store_true_flags_and_defaults():
    parsed = parse_flags("vllm", ["--enable-prefix-caching"])
    assert parsed["enable_prefix_caching"] is True
    assert parsed.given == {"enable_prefix_caching"}
    default = parse_flags("vllm", [])
    assert default["enable_prefix_caching"] is False
    assert (default["block_size"], default["max_num_seqs"], default["gpu_memory_utilization"]) == (
        16,
        256,
        0.9,
    )
    assert default["scheduling_policy"] == "fcfs" and default["max_num_batched_tokens"] is None


def test_args_hold_every_destination_in_the_engines_own_order():
    parsed = parse_flags("vllm", ["--model=m"])
    assert list(parsed.args) == [entry[1] for entry in tables.VLLM_0_6_3]
    assert list(parsed.args)[:3] == ["host", "port", "uvicorn_log_level"]
    assert list(parsed.args)[-1] == "disable_fastapi_docs"


def test_unknown_flags_are_kept_and_do_not_crash():
    parsed = parse_flags("vllm", ["--model=m", "--no-such-flag=1", "--another", "x"])
    assert parsed.unknown == ("--no-such-flag=1", "--another", "x")
    assert parsed["model"] == "m"


def test_prefix_abbreviation_works_as_in_argparse():
    assert parse_flags("vllm", ["--max-model", "4096"])["max_model_len"] == 4096


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--block-size=12"], "--block-size"),
        (["--max-model-len=abc"], "--max-model-len"),
        (["--enable-chunked-prefill=maybe"], "--enable-chunked-prefill"),
        (["--gpu-memory-utilization=high"], "--gpu-memory-utilization"),
        (["--scheduling-policy=lifo"], "--scheduling-policy"),
    ],
)
def test_bad_values_raise_naming_the_flag(flags, names):
    with pytest.raises(FlagError, match=names):
        parse_flags("vllm", flags)


def test_sglang_flags():
    parsed = parse_flags(
        "sglang",
        [
            "--model-path=meta-llama/Llama-3.1-8B-Instruct",
            "--context-length=16384",
            "--mem-fraction-static=0.85",
            "--chunked-prefill-size",
            "-1",
            "--tp-size=2",
            "--enable-metrics",
        ],
    )
    assert parsed["chunked_prefill_size"] == -1
    assert parsed["tensor_parallel_size"] == 2  # --tp-size is an alias
    assert parsed["mem_fraction_static"] == 0.85 and parsed["enable_metrics"] is True
    assert parsed["schedule_policy"] == "lpm" and parsed["disable_radix_cache"] is False


def test_sglang_requires_model_path_and_refuses_deprecated_flags():
    with pytest.raises(FlagError, match="--model-path"):
        parse_flags("sglang", ["--enable-metrics"])
    with pytest.raises(FlagError, match="--disable-flashinfer"):
        parse_flags("sglang", ["--model-path=m", "--disable-flashinfer"])
    with pytest.raises(FlagError, match="--schedule-policy"):
        parse_flags("sglang", ["--model-path=m", "--schedule-policy=sjf"])


def test_unknown_engine_and_a_single_string_are_refused():
    with pytest.raises(FlagError, match="unknown engine"):
        parse_flags("tgi", [])
    with pytest.raises(FlagError, match="list of strings"):
        parse_flags("vllm", "--enable-prefix-caching")


def _entry(table, option):
    return next(e for e in table if option in e[0])


def test_generated_tables_agree_with_the_source_checked_facts():
    """The resolution rules of docs/engines.md, read independently from the same releases."""
    v = tables.VLLM_0_6_3
    assert _entry(v, "--block-size")[4:] == (16, None, None, (8, 16, 32))
    assert _entry(v, "--enable-chunked-prefill")[2:] == (
        "store_boolean",
        None,
        None,
        "?",
        "True",
        None,
    )
    assert _entry(v, "--enable-prefix-caching")[2] == "store_true"
    assert _entry(v, "--gpu-memory-utilization")[4] == 0.9
    assert _entry(v, "--max-num-seqs")[4] == 256
    assert _entry(v, "--scheduling-policy")[7] == ("fcfs", "priority")
    s = tables.SGLANG_0_4_1
    assert _entry(s, "--chunked-prefill-size")[3:5] == ("int", None)
    assert _entry(s, "--max-prefill-tokens")[4] == 16384
    assert _entry(s, "--schedule-policy")[4::3] == ("lpm", ("lpm", "random", "fcfs", "dfs-weight"))
    assert _entry(s, "--mem-fraction-static")[4] is None
    assert _entry(s, "--disable-radix-cache")[2] == "store_true"
    fields = tables.SGLANG_0_4_1_SERVER_ARGS_FIELDS
    assert fields[0] == "model_path" and fields[-1] == "delete_ckpt_after_loading"
    assert fields.index("chunked_prefill_size") < fields.index("schedule_policy")


def test_engines_imports_no_other_servelab_subpackage():
    import ast
    import subprocess
    import sys

    code = (
        "import sys, servelab.engines, servelab.engines.cli; "
        "print(sorted(m for m in sys.modules if m.startswith('servelab')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    modules = ast.literal_eval(out.stdout.strip())
    assert all(m == "servelab" or m.startswith("servelab.engines") for m in modules), modules
