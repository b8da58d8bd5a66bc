"""Rendered start-up logs: real line formats, determinism, and parse(render(resolve(flags)))."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from servelab.engines import (
    CONFIG_FIELDS,
    check_resolved,
    parse_startup_log,
    render_startup_log,
    resolve,
)
from servelab.engines import _cli_tables as tables
from servelab.grid import config as grid

T0 = datetime(2024, 10, 14, 12, 0, 0)
L4_MIB = 23034


def _render(engine: str, flags: list[str], **kw) -> str:
    r = resolve(engine, flags, gpu_memory_mib=kw.pop("mib", L4_MIB))
    return render_startup_log(r, kv_capacity_tokens=34000, weights_gib=14.9888, timestamp=T0, **kw)


def _deployments(config: dict) -> list[grid.Deployment]:
    out: dict[str, grid.Deployment] = {}
    for run in grid.runs(config):
        d = grid.deployment_for(config, run.arm, run.engine, run.condition)
        out.setdefault(d.id, d)
    return list(out.values())


def test_round_trip_for_every_deployment_of_the_study(study_config):
    """Both engines in both arms: the parser reads back exactly what was resolved, and the gate
    confirms the arm's expectation."""
    deployments = _deployments(study_config)
    assert {(d.arm, d.engine) for d in deployments} == {
        ("defaults", "vllm"),
        ("defaults", "sglang"),
        ("matched", "vllm"),
        ("matched", "sglang"),
    }
    for d in deployments:
        resolved = resolve(d.engine, d.flags, gpu_memory_mib=study_config["gpu"]["memory_mib"])
        text = render_startup_log(
            resolved, kv_capacity_tokens=34000, weights_gib=14.9888, timestamp=T0
        )
        parsed = parse_startup_log(text)
        assert parsed.engine == d.engine
        assert parsed.version == resolved.printed_version
        for key in (
            "chunked_prefill",
            "chunk_size",
            "prefix_caching",
            "context_len",
            "schedule_policy",
        ):
            assert getattr(parsed, key) == getattr(resolved, key), (d.id, key)
        assert parsed.ready is True and parsed.failure is None
        check_resolved(
            parsed,
            expect_chunked_prefill=d.expect_chunked_prefill,
            expect_chunk_size=d.expect_chunk_size,
        )


@pytest.mark.parametrize(
    ("engine", "flags", "mib"),
    [
        ("vllm", ["--model=m"], L4_MIB),  # 32K rule: on, 512
        ("vllm", ["--model=m", "--max-model-len=32768"], L4_MIB),
        ("vllm", ["--model=m", "--max-model-len=16384", "--enable-chunked-prefill"], L4_MIB),
        ("sglang", ["--model-path=m"], 25000),  # 8192
        ("sglang", ["--model-path=m", "--chunked-prefill-size=-1"], L4_MIB),
        ("sglang", ["--model-path=m", "--disable-radix-cache"], L4_MIB),
    ],
)
def test_round_trip_across_the_resolution_rules(engine, flags, mib):
    resolved = resolve(engine, flags, gpu_memory_mib=mib)
    parsed = parse_startup_log(
        render_startup_log(resolved, kv_capacity_tokens=34000, weights_gib=15.0, timestamp=T0)
    )
    for key in CONFIG_FIELDS:
        want = resolved.printed_version if key == "version" else getattr(resolved, key)
        assert getattr(parsed, key) == want, key


def test_same_inputs_same_bytes_and_flags_matter():
    flags = ["--model=m", "--max-model-len=16384", "--enable-prefix-caching"]
    assert _render("vllm", flags) == _render("vllm", list(flags))
    assert _render("vllm", flags) != _render("vllm", [*flags, "--enable-chunked-prefill"])
    sg = ["--model-path=m"]
    assert _render("sglang", sg) == _render("sglang", list(sg))


def test_vllm_lines_use_the_real_formats():
    text = _render("vllm", ["--model=m", "--max-model-len=16384", "--enable-chunked-prefill"])
    lines = text.splitlines()
    record = re.compile(r"^(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d [\w.]+\.py:\d+\] ")
    assert lines[0] == "INFO 10-14 12:00:00 api_server.py:528] vLLM API server version dev"
    assert sum(1 for line in lines if record.match(line)) >= 20
    engine = next(line for line in lines if "Initializing an LLM engine (vdev)" in line)
    # The 0.6.3 format string has no comma before multi_step_stream_outputs.
    assert "chunked_prefill_enabled=True multi_step_stream_outputs=True, " in engine
    assert engine.endswith("mm_processor_kwargs=None)")
    # Both the frontend and the engine process log the resolved budget.
    assert text.count("Chunked prefill is enabled with max_num_batched_tokens=512.") == 2
    assert "# GPU blocks: 2125, # CPU blocks: 2048" in text
    assert "Maximum concurrency for 16384 tokens per request: 2.08x" in text
    assert "Loading model weights took 14.9888 GB" in text


def test_vllm_args_line_is_the_unresolved_namespace_in_parser_order():
    text = _render("vllm", ["--model=m", "--max-model-len=16384"])
    args = next(line for line in text.splitlines() if "] args: Namespace(" in line)
    names = re.findall(r"[(,] (\w+)=|\((\w+)=", args)
    order = [a or b for a, b in names]
    assert order == [entry[1] for entry in tables.VLLM_0_6_3]
    assert "enable_chunked_prefill=None" in args  # configured, not resolved
    assert "max_num_batched_tokens=None" in args


def test_vllm_32k_auto_enable_prints_the_warning():
    text = _render("vllm", ["--model=m"])
    assert "WARNING 10-14 12:00:01 arg_utils.py:953] Chunked prefill is enabled by default" in text
    off = _render("vllm", ["--model=m", "--enable-chunked-prefill=False"])
    assert "The model has a long context length (131072)." in off


def test_sglang_lines_use_the_real_formats():
    text = _render("sglang", ["--model-path=m", "--context-length=16384"])
    lines = text.splitlines()
    assert lines[0].startswith("[2024-10-14 12:00:00] server_args=ServerArgs(model_path='m', ")
    fields = re.findall(r"(?:\(|, )(\w+)=", lines[0].split("ServerArgs", 1)[1])
    assert fields == list(tables.SGLANG_0_4_1_SERVER_ARGS_FIELDS)
    assert "chunked_prefill_size=2048," in lines[0] and "cuda_graph_max_bs=8," in lines[0]
    assert "mem_fraction_static=0.88," in lines[0]
    summary = next(line for line in lines if "max_total_num_tokens=" in line)
    assert re.fullmatch(
        r"\[2024-10-14 12:00:\d\d TP0\] max_total_num_tokens=34000, max_prefill_tokens=16384, "
        r"max_running_requests=2049, context_len=16384",
        summary,
    )
    assert lines[-1] == "[2024-10-14 12:00:22] The server is fired up and ready to roll!"


def test_bad_runtime_facts_are_refused():
    r = resolve("vllm", ["--model=m", "--max-model-len=16384"], gpu_memory_mib=L4_MIB)
    with pytest.raises(ValueError, match="weights_gib"):
        render_startup_log(r, kv_capacity_tokens=34000, weights_gib=0, timestamp=T0)
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        render_startup_log(r, kv_capacity_tokens=0, weights_gib=15.0, timestamp=T0)
