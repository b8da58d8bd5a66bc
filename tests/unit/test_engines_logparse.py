"""The start-up log parser on real logs (expected parses from the fixtures' README) and on
synthetic variants of every parser trap listed there."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.engines import CONFIG_FIELDS, UnknownEngineLog, detect_engine, parse_startup_log

DATA = Path(__file__).resolve().parents[1] / "data" / "engine-logs"


def _read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


# The expected parse of each real log in tests/data/engine-logs, field by field ("not printed" -> None).
EXPECTED = {
    "vllm-0.6.4dev-chunked-off-01.log": {
        "engine": "vllm",
        "version": "0.6.4.dev26+g92d86da2.d20241017",
        "chunked_prefill": False,
        "chunk_size": None,
        "prefix_caching": False,
        "context_len": 2048,
        "schedule_policy": None,
        "facts": {
            "num_gpu_blocks": 37300,
            "num_cpu_blocks": 7281,
            "max_concurrency": 291.41,
            "weights_gib": 0.2389,
            "tensor_parallel_size": 1,
        },
        "ready": True,
    },
    "vllm-0.6.4dev-chunked-on-01.log": {
        "engine": "vllm",
        "version": "0.6.4.dev26+g92d86da2.d20241017",
        "chunked_prefill": True,
        "chunk_size": 512,
        "prefix_caching": False,
        "context_len": 40960,
        "schedule_policy": None,
        "facts": {
            "num_gpu_blocks": 2575,
            "num_cpu_blocks": 2048,
            "max_concurrency": 1.01,
            "weights_gib": 14.9888,
            "tensor_parallel_size": 1,
        },
        "ready": True,
    },
    "vllm-0.6.2-chunked-off-01.log": {
        "engine": "vllm",
        "version": "0.6.1.dev238+ge2c6e0a82",
        "chunked_prefill": False,
        "chunk_size": None,
        "prefix_caching": False,
        "context_len": 8192,
        "schedule_policy": None,
        "facts": {
            "num_gpu_blocks": 13330,
            "num_cpu_blocks": 2048,
            "weights_gib": 14.9595,
            "tensor_parallel_size": 1,
        },
        "ready": True,
    },
    "vllm-vdev-01.log": {
        "engine": "vllm",
        "version": "dev",
        "chunked_prefill": None,
        "chunk_size": None,
        "prefix_caching": None,
        "context_len": 8192,
        "schedule_policy": None,
        "facts": {"tensor_parallel_size": 2},
        "ready": False,
    },
    "sglang-0.4.1-01.log": {
        "engine": "sglang",
        "version": None,
        "chunked_prefill": True,
        "chunk_size": 8192,
        "prefix_caching": True,
        "context_len": 131072,
        "schedule_policy": "lpm",
        "facts": {
            "mem_fraction_static": 0.88,
            "max_total_num_tokens": 444500,
            "max_prefill_tokens": 16384,
            "max_running_requests": 2049,
            "tp_size": 1,
            "cuda_graph_max_bs": 160,
        },
        "ready": True,
    },
    "sglang-0.4.2-chunk2048-01.log": {
        "engine": "sglang",
        "version": None,
        "chunked_prefill": True,
        "chunk_size": 2048,
        "prefix_caching": True,
        "context_len": 131072,
        "schedule_policy": "lpm",
        "facts": {
            "mem_fraction_static": 0.88,
            "cuda_graph_max_bs": 8,
            "max_total_num_tokens": 105531,
            "max_prefill_tokens": 16384,
            "max_running_requests": 2049,
            "tp_size": 1,
        },
        "ready": True,
    },
}


def test_every_log_fixture_has_an_expected_parse():
    # llama-server's, vLLM-CPU's and SGLang-CPU's captured logs have golden parses of their own
    # (test_llamacpp_engine.py, test_vllm_cpu_engine.py, test_sglang_cpu_engine.py); the
    # excerpts, goldens of their reading
    # (test_log_excerpts.py); the current releases' logs have hand-read expectations in
    # expected/ (test_current_release_logs.py)
    logs = [
        p.name
        for p in DATA.glob("*.log")
        if not p.name.startswith(("llamacpp-", "vllm-cpu-", "sglang-cpu-"))
        and "-excerpt-" not in p.name
        and not (DATA / "expected" / f"{p.name}.json").exists()
    ]
    assert sorted(logs) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_log_parses_as_the_fixture_table_says(name):
    text = _read(name)
    assert text.startswith("# source: ")
    parsed = parse_startup_log(text)
    want = EXPECTED[name]
    got = {k: getattr(parsed, k) for k in ("engine", *CONFIG_FIELDS)}
    assert got == {k: want[k] for k in ("engine", *CONFIG_FIELDS)}
    assert dict(parsed.facts) == want["facts"]
    assert parsed.ready is want["ready"]
    assert parsed.failure is None
    # The engine is detected from the text, and giving it explicitly changes nothing.
    assert detect_engine(text) == want["engine"]
    assert parse_startup_log(text, engine=want["engine"]) == parsed


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_evidence_is_the_exact_line_holding_the_value(name):
    text = _read(name)
    lines = text.splitlines()
    parsed = parse_startup_log(text)
    shown = [k for k in CONFIG_FIELDS if getattr(parsed, k) is not None]
    assert set(shown) <= set(parsed.evidence)
    for key, line in parsed.evidence.items():
        assert lines[parsed.evidence_lines[key] - 1] == line
    for key in shown:
        value = getattr(parsed, key)
        if isinstance(value, bool) or key == "version":
            continue
        assert str(value) in parsed.evidence[key]
    # Values the log does not show have no evidence at all.
    for key in CONFIG_FIELDS:
        if getattr(parsed, key) is None:
            assert key not in parsed.evidence


def test_implicit_reading_of_a_version_without_the_chunked_field_is_marked():
    parsed = parse_startup_log(_read("vllm-0.6.2-chunked-off-01.log"))
    assert parsed.chunked_prefill is False
    assert parsed.notes["chunked_prefill"].startswith("implicit")
    assert (
        "Initializing an LLM engine (v0.6.1.dev238+ge2c6e0a82)"
        in parsed.evidence["chunked_prefill"]
    )
    # Direct readings carry no note.
    direct = parse_startup_log(_read("vllm-0.6.4dev-chunked-off-01.log"))
    assert "chunked_prefill" not in direct.notes


def test_configured_args_are_not_resolved_values():
    """SGLang prints context_length=None (configured) and context_len=131072 (resolved)."""
    parsed = parse_startup_log(_read("sglang-0.4.1-01.log"))
    assert "context_length=None" in parsed.evidence["chunk_size"]
    assert parsed.context_len == 131072
    assert parsed.evidence["context_len"].startswith(
        "[2025-01-23 19:35:27 TP0] max_total_num_tokens="
    )


def test_to_json_is_one_object_with_sorted_keys():
    import json

    parsed = parse_startup_log(_read("vllm-0.6.4dev-chunked-on-01.log"))
    text = parsed.to_json()
    obj = json.loads(text)
    assert list(obj) == sorted(obj)
    assert obj["chunk_size"] == 512 and obj["chunked_prefill"] is True
    assert obj["evidence"]["chunk_size"].endswith(
        "Chunked prefill is enabled with max_num_batched_tokens=512."
    )


# ------------------------------------------------------------------- synthetic trap variants

ENGINE_LINE_063 = (  # vLLM 0.6.3's format string filled in (docs/engines.md)
    "INFO 10-14 12:00:06 llm_engine.py:237] Initializing an LLM engine (v{version}) with config: "
    "model='meta-llama/Llama-3.1-8B-Instruct', speculative_config=None, "
    "tokenizer='meta-llama/Llama-3.1-8B-Instruct', skip_tokenizer_init=False, "
    "tokenizer_mode=auto, revision=None, override_neuron_config=None, rope_scaling=None, "
    "rope_theta=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
    "max_seq_len=16384, download_dir=None, load_format=LoadFormat.AUTO, tensor_parallel_size=1, "
    "pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=None, "
    "enforce_eager=False, kv_cache_dtype=auto, quantization_param_path=None, device_config=cuda, "
    "decoding_config=DecodingConfig(guided_decoding_backend='outlines'), "
    "observability_config=ObservabilityConfig(otlp_traces_endpoint=None, "
    "collect_model_forward_time=False, collect_model_execute_time=False), seed=0, "
    "served_model_name=meta-llama/Llama-3.1-8B-Instruct, use_v2_block_manager=True, "
    "num_scheduler_steps=1, chunked_prefill_enabled={chunked} multi_step_stream_outputs=True, "
    "enable_prefix_caching={prefix}, use_async_output_proc=True, use_cached_outputs=True, "
    "mm_processor_kwargs=None)"
)


def _engine_line(version: str = "dev", chunked: str = "False", prefix: str = "True") -> str:
    return ENGINE_LINE_063.format(version=version, chunked=chunked, prefix=prefix)


@pytest.mark.parametrize(
    "version",
    [
        "dev",
        "0.6.1.dev238+ge2c6e0a82",
        "0.6.4.dev26+g92d86da2.d20241017",
        "0.6.3.post2.dev76+g51c24c97",
        "999.999.999",
        "0.6.3",
    ],
)
def test_any_version_string_is_reported_as_printed(version):
    parsed = parse_startup_log(_engine_line(version) + "\n")
    assert parsed.version == version
    server = f"INFO 10-14 12:00:00 api_server.py:528] vLLM API server version {version}\n"
    assert parse_startup_log(server + _engine_line(version) + "\n").version == version


def test_missing_comma_quirk_of_063_is_read_both_ways():
    on = parse_startup_log(_engine_line(chunked="True") + "\n")
    off = parse_startup_log(_engine_line(chunked="False") + "\n")
    assert (on.chunked_prefill, off.chunked_prefill) == (True, False)
    assert (
        "chunked_prefill_enabled=True multi_step_stream_outputs=True"
        in on.evidence["chunked_prefill"]
    )


def test_066_field_order_with_the_field_after_prefix_caching():
    # vLLM 0.6.6 moved the field after enable_prefix_caching, with a comma (synthetic, from the
    # 0.6.6 line shape quoted in public issues).
    line = (
        "INFO 01-14 03:08:50 llm_engine.py:234] Initializing an LLM engine (v0.6.6) with config: "
        "model='m', speculative_config=None, tokenizer='m', skip_tokenizer_init=False, "
        "tokenizer_mode=auto, max_seq_len=131072, tensor_parallel_size=1, seed=0, "
        "served_model_name=m, num_scheduler_steps=1, multi_step_stream_outputs=True, "
        "enable_prefix_caching=True, chunked_prefill_enabled=True, use_async_output_proc=True, "
        "disable_mm_preprocessor_cache=False, mm_processor_kwargs=None, pooler_config=None, "
        'compilation_config={"splitting_ops":[],"capture_sizes":[256,248]}, use_cached_outputs=False, \n'
        "INFO 01-14 03:08:50 config.py:1020] Chunked prefill is enabled with max_num_batched_tokens=8192.\n"
    )
    parsed = parse_startup_log(line)
    assert (parsed.chunked_prefill, parsed.prefix_caching, parsed.context_len) == (
        True,
        True,
        131072,
    )
    assert parsed.chunk_size == 8192


def test_v0_v1_banner_and_bracketed_logger_format_of_later_versions():
    text = (
        "(EngineCore pid=148408) INFO 07-28 10:02:58 [core.py:116] Initializing a V1 LLM engine "
        "(v0.1.dev19057+g494d9737e) with config: model='m', max_seq_len=448, seed=0, "
        "enable_prefix_caching=False, chunked_prefill_enabled=True, use_async_output_proc=True, \n"
        "INFO 03-13 03:06:18 llm_engine.py:232] Initializing a V0 LLM engine (v0.7.1) with config: "
        "model='m', max_seq_len=8000, seed=0, enable_prefix_caching=False, "
        "chunked_prefill_enabled=False, use_async_output_proc=True, mm_processor_kwargs=None\n"
    )
    first = parse_startup_log(text.splitlines(keepends=True)[0])
    assert first.engine == "vllm_v1"  # the V1 engine line is the V1 family's own
    assert (first.version, first.chunked_prefill, first.context_len) == (
        "0.1.dev19057+g494d9737e",
        True,
        448,
    )
    with pytest.raises(UnknownEngineLog, match="several vLLM release families"):
        detect_engine(text)
    # two start-ups read as V0's (its reader takes both engine lines): the last counts, the
    # disagreement is noted
    both = parse_startup_log(text, engine="vllm")
    assert (both.version, both.chunked_prefill, both.context_len) == ("0.7.1", False, 8000)
    assert "2 different values" in both.notes["chunked_prefill"]


def _args_line(**overrides: str) -> str:
    fields = {
        "model": "'meta-llama/Llama-3.1-8B-Instruct'",
        "max_model_len": "None",
        "max_num_batched_tokens": "None",
        "enable_chunked_prefill": "None",
        "enable_prefix_caching": "False",
        "scheduling_policy": "'fcfs'",
        "disable_log_requests": "False",
    }
    fields.update(overrides)
    body = ", ".join(f"{k}={v}" for k, v in fields.items())
    return f"INFO 10-14 12:00:00 api_server.py:529] args: Namespace(host=None, port=8000, {body})\n"


def test_configured_none_in_the_args_line_is_never_read_as_resolved():
    parsed = parse_startup_log(
        "INFO 10-14 12:00:00 api_server.py:528] vLLM API server version dev\n" + _args_line()
    )
    assert parsed.engine == "vllm" and parsed.version == "dev"
    assert (parsed.chunked_prefill, parsed.chunk_size, parsed.context_len) == (None, None, None)
    assert (
        parsed.prefix_caching is None
    )  # the args value is configured; only the engine line resolves
    assert parsed.schedule_policy == "fcfs"  # vLLM 0.6.3 uses it verbatim: read, with a note
    assert "verbatim" in parsed.notes["schedule_policy"]


def test_chunk_size_from_an_explicit_args_value_when_the_chunk_line_is_absent():
    text = _args_line(enable_chunked_prefill="True", max_num_batched_tokens="2048") + _engine_line(
        chunked="True"
    )
    parsed = parse_startup_log(text)
    assert (parsed.chunked_prefill, parsed.chunk_size) == (True, 2048)
    assert "args: Namespace(" in parsed.evidence["chunk_size"]
    assert "explicitly" in parsed.notes["chunk_size"]
    # ...but not when chunked prefill is off: no chunk size is reported then.
    off = parse_startup_log(_args_line(max_num_batched_tokens="16384") + _engine_line())
    assert (off.chunked_prefill, off.chunk_size) == (False, None)


def test_failed_vllm_startup_reports_the_resolved_config_and_the_failure():
    # Synthetic: the real 0.6.3 error text of worker.py::raise_if_cache_size_invalid.
    text = (
        "INFO 10-14 12:00:00 api_server.py:528] vLLM API server version dev\n"
        + _args_line()
        + "WARNING 10-14 12:00:01 arg_utils.py:953] Chunked prefill is enabled by default for "
        "models with max_model_len > 32K. Currently, chunked prefill might not work with some "
        "features or models. If you encounter any issues, please disable chunked prefill by "
        "setting --enable-chunked-prefill=False.\n"
        "INFO 10-14 12:00:01 config.py:1005] Chunked prefill is enabled with max_num_batched_tokens=512.\n"
        + _engine_line(chunked="True", prefix="False").replace(
            "max_seq_len=16384", "max_seq_len=131072"
        )
        + "\nProcess SpawnProcess-1:\nTraceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/worker/worker.py", line 475, in raise_if_cache_size_invalid\n'
        "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens "
        "that can be stored in KV cache (34512). Try increasing `gpu_memory_utilization` or "
        "decreasing `max_model_len` when initializing the engine.\n"
    )
    parsed = parse_startup_log(text)
    assert (parsed.chunked_prefill, parsed.chunk_size, parsed.context_len) == (True, 512, 131072)
    assert parsed.ready is False
    assert parsed.failure is not None and "Traceback" in parsed.failure


def test_failed_sglang_startup_reports_the_resolved_config_and_the_failure():
    server_args = _read("sglang-0.4.2-chunk2048-01.log").splitlines()[1]
    text = (
        server_args
        + "\n2025-02-04 21:21:40 [2025-02-04 05:21:40 TP0] Init torch distributed begin.\n"
        "2025-02-04 21:21:41 [2025-02-04 05:21:41 TP0] Scheduler hit an exception: Traceback "
        "(most recent call last):\n"
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    )
    parsed = parse_startup_log(text)
    assert (parsed.engine, parsed.chunked_prefill, parsed.chunk_size) == ("sglang", True, 2048)
    assert parsed.context_len is None  # the summary line never came
    assert parsed.ready is False and parsed.failure is not None


def test_cpu_backend_prints_only_cpu_blocks():
    text = _engine_line() + "\nINFO 10-14 12:00:09 cpu_executor.py:214] # CPU blocks: 2730\n"
    parsed = parse_startup_log(text)
    assert parsed.facts["num_cpu_blocks"] == 2730
    assert "num_gpu_blocks" not in parsed.facts


@pytest.mark.parametrize(
    "prefix",
    [
        "runner-llm-1  | ",  # docker compose
        "2025-02-04 21:21:33 ",  # Docker Desktop
        "2024-10-14T12:00:00.123456789Z ",  # kubectl logs --timestamps
        "\x1b[32m",  # colour codes
    ],
)
def test_prefixed_lines_parse_like_plain_ones(prefix):
    text = _read("vllm-0.6.4dev-chunked-on-01.log")
    prefixed = "".join(prefix + line for line in text.splitlines(keepends=True))
    plain, got = parse_startup_log(text), parse_startup_log(prefixed)
    for key in CONFIG_FIELDS:
        assert getattr(got, key) == getattr(plain, key)
    assert got.evidence["chunk_size"] == prefix + plain.evidence["chunk_size"]


def test_tqdm_carriage_returns_split_records_from_bars():
    text = _read("vllm-0.6.4dev-chunked-on-01.log")
    # A bar redrawn with \r, the record following on the same physical line.
    glued = text.replace(
        "\nINFO 10-18 10:08:47 config.py:1023]",
        "\rLoading: 100%|██████████| 4/4 [00:02<00:00]\rINFO 10-18 10:08:47 config.py:1023]",
    )
    assert glued != text
    parsed = parse_startup_log(glued)
    assert (parsed.chunked_prefill, parsed.chunk_size) == (True, 512)


def test_engine_line_cut_mid_value_leaves_the_value_unknown():
    line = _engine_line(chunked="True")
    cut_at_seq = line[: line.index("max_seq_len=16384") + len("max_seq_len=16")] + "\n"
    parsed = parse_startup_log(cut_at_seq)
    assert parsed.context_len is None  # "16" is a cut value, not 16
    assert parsed.chunked_prefill is None and parsed.prefix_caching is None
    cut_at_flag = line[
        : line.index("chunked_prefill_enabled=Tr") + len("chunked_prefill_enabled=Tr")
    ]
    parsed = parse_startup_log(cut_at_flag + "\n")
    assert parsed.context_len == 16384 and parsed.chunked_prefill is None


def test_cut_066_line_is_not_read_as_the_062_implicit_off():
    # 0.6.6 prints chunked_prefill_enabled AFTER multi_step_stream_outputs: a line cut between them
    # lacks the field because of the cut, not the version.
    line = (
        "INFO 01-14 03:08:50 llm_engine.py:234] Initializing an LLM engine (v0.6.6) with config: "
        "model='m', max_seq_len=131072, seed=0, served_model_name=m, num_scheduler_steps=1, "
        "multi_step_stream_outputs=True, enable_prefix_caching=False, chunk\n"
    )
    parsed = parse_startup_log(line)
    assert parsed.chunked_prefill is None and parsed.prefix_caching is False
    # Even a cut that lands right after a nested config's ")" is recognised as a cut.
    nested = _engine_line().split(", observability_config=")[0] + "\n"
    assert nested.rstrip().endswith(")")
    assert parse_startup_log(nested).chunked_prefill is None


def test_split_line_leaves_the_split_fields_unknown():
    # As in vLLM PR #9532's paste: the engine line broken inside "chunked_prefill_enabled".
    line = _engine_line(version="999.999.999", chunked="False", prefix="True")
    split = line.replace("chunked_prefill_enabled", "ch\nunked_prefill_enabled") + "\n"
    parsed = parse_startup_log(split)
    assert parsed.version == "999.999.999" and parsed.context_len == 16384
    assert parsed.chunked_prefill is None and parsed.prefix_caching is None


def test_last_line_without_newline_may_be_cut():
    text = "INFO 10-14 12:00:00 api_server.py:528] vLLM API server version 0.6"
    assert parse_startup_log(text, engine="vllm").version is None
    assert parse_startup_log(text + "\n").version == "0.6"


def test_sglang_chunking_disabled_and_radix_cache_disabled():
    server_args = _read("sglang-0.4.1-01.log").splitlines()[1]
    disabled = server_args.replace("chunked_prefill_size=8192", "chunked_prefill_size=-1").replace(
        "disable_radix_cache=False", "disable_radix_cache=True"
    )
    parsed = parse_startup_log(disabled + "\n")
    assert (parsed.chunked_prefill, parsed.chunk_size) == (False, None)
    assert parsed.prefix_caching is False
    assert parsed.schedule_policy == "fcfs"  # SGLang's own lpm -> fcfs fallback
    assert "schedule_policy='lpm'" in parsed.notes["schedule_policy"]


def test_sglang_summary_line_wins_over_server_args_when_they_disagree():
    text = _read("sglang-0.4.2-chunk2048-01.log").replace(
        "max_total_num_tokens=105531, chunked_prefill_size=2048",
        "max_total_num_tokens=105531, chunked_prefill_size=1024",
    )
    parsed = parse_startup_log(text)
    assert parsed.chunk_size == 1024
    assert "max_total_num_tokens=105531" in parsed.evidence["chunk_size"]
    assert "2048" in parsed.notes["chunk_size"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world\n",
        _read("vllm-V0-metrics-01.txt"),
        (DATA / "README.md").read_text(),
        "Chunked prefill is enabled with max_num_batched_tokens=512.\n",  # no logger record
    ],
)
def test_text_from_neither_engine_is_refused(text):
    with pytest.raises(UnknownEngineLog, match=r"not a vLLM, SGLang or llama\.cpp start-up log"):
        parse_startup_log(text)


def test_a_given_engine_must_match_the_text():
    with pytest.raises(UnknownEngineLog, match="looks like an SGLang log"):
        parse_startup_log(_read("sglang-0.4.1-01.log"), engine="vllm")
    with pytest.raises(UnknownEngineLog, match="unknown engine"):
        parse_startup_log(_read("sglang-0.4.1-01.log"), engine="tgi")


def test_errors_after_readiness_are_not_startup_failures():
    text = _read("vllm-0.6.4dev-chunked-on-01.log")
    later = text + "ERROR 10-18 10:10:00 serving_completion.py:133] Error in completion stream\n"
    parsed = parse_startup_log(later)
    assert parsed.ready is True and parsed.failure is None
    before = text.replace(
        "INFO 10-18 10:08:52 gpu_executor.py:122]",
        "ERROR 10-18 10:08:52 engine.py:160] RuntimeError('CUDA error')\nINFO 10-18 10:08:52 gpu_executor.py:122]",
    )
    failed = parse_startup_log(before)
    assert failed.failure is not None and "CUDA error" in failed.failure
