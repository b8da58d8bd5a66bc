"""The llama.cpp (llama-server 0c1e570) engine: flags, resolution against the real start-up logs of
the same flags, the log parser against its goldens, the gate, detection, /metrics and the CLI.

The fixtures in tests/data/engine-logs/llamacpp-* were captured from the real build by
tools/capture_llamacpp_logs.py; each log's `# source:` line names the flags it was started with,
which the mechanism tests resolve and compare with what the log shows. The flag table against
the real binary's --help is tests/integration/test_llamacpp_binary.py.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from servelab.deploy.tiny_model import TinyModelSpec
from servelab.engines import (
    ENGINE_METRICS,
    METRIC_MAP,
    FlagError,
    ResolutionError,
    ResolvedConfigMismatch,
    UnknownEngineLog,
    canonical_metrics,
    canonical_values,
    check_resolved,
    detect_engine,
    engine_names,
    engine_spec,
    llamacpp,
    parse_flags,
    parse_metrics_text,
    parse_startup_log,
    probe_disagreement,
    resolve,
    runtime_limits,
    startup_log_flags,
)
from servelab.engines.cli import register
from servelab.engines.llamacpp import SERVER_START, log_seconds
from servelab.engines.registry import product_of

TESTS = Path(__file__).resolve().parents[1]
DATA = TESTS / "data" / "engine-logs"
GOLDEN = TESTS / "golden" / "llamacpp"
LOGS = sorted(p.name for p in DATA.glob("llamacpp-*.log"))
READY_LOGS = [name for name in LOGS if "missing-model" not in name]
OTHER_LOGS = sorted(p.name for p in DATA.glob("*.log") if not p.name.startswith("llamacpp-"))
METRICS_TEXT = DATA / "llamacpp-0c1e570-metrics-01.txt"
N_CTX_TRAIN = TinyModelSpec().context_length  # the captured model's GGUF llama.context_length


def _read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def _flags_of(name: str) -> list[str]:
    """The flags a captured log was started with, from its `# source:` line."""
    first = _read(name).splitlines()[0]
    m = re.search(r"; flags: (.*?), then --model PATH", first)
    assert m, f"{name}: no flags in its # source: line"
    return [] if m.group(1) == "(none)" else m.group(1).split()


def _resolve(flags: list[str]) -> Any:
    return resolve("llamacpp", flags, gpu_memory_mib=1, model_max_position_embeddings=N_CTX_TRAIN)


def test_registered_third_with_its_entrypoint_and_a_simulated_log() -> None:
    assert engine_names() == ("vllm", "sglang", "vllm_v1", "sglang_v05", "llamacpp")
    spec = engine_spec("llamacpp")
    assert spec.entrypoint == ("llama-server",)
    assert spec.stream_interval == 1
    assert spec.render_startup_log is not None  # the simulated llama.cpp (servelab.sim.llamacpp)
    assert spec.printed_version == "b1-0c1e570"


# ------------------------------------------------------------------------------------ parsing


def test_every_fixture_has_a_golden_and_no_golden_is_stale() -> None:
    assert LOGS, "no llamacpp fixtures"
    stems = {name.removeprefix("llamacpp-").removesuffix(".log") for name in LOGS}
    assert stems == {p.stem for p in GOLDEN.glob("*.json")}


@pytest.mark.parametrize("name", LOGS)
def test_parsing_a_captured_log_gives_its_golden(name: str) -> None:
    parsed = parse_startup_log(_read(name))
    golden = json.loads((GOLDEN / f"{name.removeprefix('llamacpp-')[:-4]}.json").read_text())
    assert llamacpp.mask_timestamps(parsed) == golden
    # the masked evidence is the file's own line, at the line number given
    lines = _read(name).splitlines()
    for key, text in parsed.evidence.items():
        assert lines[parsed.evidence_lines[key] - 1] == text, key


@pytest.mark.parametrize("name", LOGS)
def test_llama_server_logs_are_detected_and_refused_as_other_engines(name: str) -> None:
    text = _read(name)
    assert detect_engine(text) == "llamacpp"
    for other in ("vllm", "sglang"):
        with pytest.raises(UnknownEngineLog, match=r"looks like an? llama\.cpp log"):
            parse_startup_log(text, engine=other)


@pytest.mark.parametrize("name", OTHER_LOGS)
def test_vllm_and_sglang_logs_are_not_taken_for_llama_server(name: str) -> None:
    text = _read(name)
    try:
        engine = detect_engine(text)
    except UnknownEngineLog as exc:  # some logs do not tell their release family apart
        assert "release family" in str(exc)
    else:
        assert product_of(engine) == name.split("-")[0]
    with pytest.raises(UnknownEngineLog, match=r"not a llama\.cpp start-up log"):
        parse_startup_log(text, engine="llamacpp")


def test_the_default_verbosity_does_not_confirm_chunking_and_the_gate_refuses_it() -> None:
    parsed = parse_startup_log(_read("llamacpp-0c1e570-lv3-defaults.log"))
    assert _flags_of("llamacpp-0c1e570-lv3-defaults.log") == []
    assert parsed.facts["verbosity"] < llamacpp.VERBOSITY_SHOWING_N_BATCH
    assert "n_batch" not in parsed.facts
    assert parsed.chunked_prefill is None and parsed.chunk_size is None
    assert parsed.context_len == parsed.facts["n_ctx_slot"]  # the slot line is printed at 3
    with pytest.raises(ResolvedConfigMismatch, match="not confirmed"):
        check_resolved(parsed, expect_chunked_prefill=True, expect_chunk_size=None)


def test_n_batch_is_printed_from_verbosity_4() -> None:
    for name in READY_LOGS:
        parsed = parse_startup_log(_read(name))
        shown = "n_batch" in parsed.facts
        assert shown == (parsed.facts["verbosity"] >= llamacpp.VERBOSITY_SHOWING_N_BATCH), name


@pytest.mark.parametrize(
    ("flags", "probe"),
    [
        ([], ["--log-verbosity=4"]),
        (["--batch-size=256", "-lv", "2"], ["--batch-size=256", "-lv", "2", "--log-verbosity=4"]),
        (["--log-verbosity=4"], None),
        (["--verbosity", "5"], None),
    ],
)
def test_a_start_up_probe_adds_verbosity_4_only_where_the_flags_hide_n_batch(
    flags: list[str], probe: list[str] | None
) -> None:
    assert llamacpp.startup_probe_flags(flags) == probe
    assert startup_log_flags("llamacpp", flags) == (flags if probe is None else probe)
    if probe is not None:  # the probe's flags resolve to the same configuration, verbosity aside
        assert _resolve(probe).to_dict() | {"flags": None} == _resolve(flags).to_dict() | {
            "flags": None
        }
        assert llamacpp.server_settings(_resolve(probe)).verbosity == 4


def test_engines_whose_log_shows_their_resolution_need_no_probe() -> None:
    for engine in ("vllm", "vllm_v1", "sglang", "sglang_v05"):
        flags = ["--max-num-batched-tokens=256"] if engine.startswith("vllm") else []
        assert engine_spec(engine).startup_probe is None
        assert startup_log_flags(engine, flags) == flags


def test_the_real_logs_of_one_configuration_at_two_verbosities_agree() -> None:
    """What the measured start (verbosity 3) and its probe (4) both show is compared: the real logs
    of the default flags agree; a probe with other slots and context does not."""
    measured = parse_startup_log(_read("llamacpp-0c1e570-lv3-defaults.log"))
    probe = parse_startup_log(_read("llamacpp-0c1e570-lv4-defaults.log"))
    assert probe.facts["verbosity"] != measured.facts["verbosity"]
    assert probe_disagreement(probe, measured) == ""
    other = parse_startup_log(_read("llamacpp-0c1e570-lv4-np2-ctx4096.log"))
    assert probe_disagreement(other, measured).split("; ") == [
        "context_len: probe 2048, measured 8192",
        "kv_unified: probe False, measured True",
        "n_ctx_slot: probe 2048, measured 8192",
        "n_slots: probe 2, measured 4",
    ]


def test_the_gate_refuses_a_mismatch_quoting_the_n_batch_line() -> None:
    name = "llamacpp-0c1e570-lv4-batch256.log"
    parsed = parse_startup_log(_read(name))
    check_resolved(parsed, expect_chunked_prefill=True, expect_chunk_size=256)
    with pytest.raises(ResolvedConfigMismatch) as refused:
        check_resolved(parsed, expect_chunked_prefill=True, expect_chunk_size=2048)
    line_no = parsed.evidence_lines["chunk_size"]
    n_batch_line = _read(name).splitlines()[line_no - 1]
    assert "llama_context: n_batch" in n_batch_line
    assert f"start-up log line {line_no}: {n_batch_line.strip()!r}" in str(refused.value)
    assert "resolved chunk_size=256, expected 2048" in str(refused.value)

    off = parse_startup_log(_read("llamacpp-0c1e570-lv4-np2-ctx4096.log"))
    with pytest.raises(ResolvedConfigMismatch, match=r"resolved chunked_prefill=False") as why:
        check_resolved(off, expect_chunked_prefill=True, expect_chunk_size=None)
    assert "llama_context: n_batch" in str(why.value)
    assert "n_ctx_slot = 2048" in str(why.value)  # the note names the slot context


def test_a_failed_start_up_is_reported_with_its_first_error_line() -> None:
    parsed = parse_startup_log(_read("llamacpp-0c1e570-lv3-missing-model.log"))
    assert parsed.ready is False
    assert parsed.failure is not None and " E " in parsed.failure
    assert "/nonexistent/model.gguf" in parsed.failure


# --------------------------------------------------------------- resolution vs the real logs


@pytest.mark.parametrize("name", READY_LOGS)
def test_resolve_gives_what_the_real_log_of_the_same_flags_shows(name: str) -> None:
    parsed = parse_startup_log(_read(name))
    r = _resolve(_flags_of(name))
    facts = parsed.facts
    assert r.context_len == parsed.context_len == facts["n_ctx_slot"]
    assert r.max_running_requests == r.max_num_seqs == facts["n_slots"]
    assert r.prefix_caching == ("--no-cache-prompt" not in r.flags)
    if "n_batch" in facts:  # printed at --log-verbosity >= 4
        assert facts["n_ctx_train"] == N_CTX_TRAIN
        assert r.max_total_tokens == facts["n_ctx"]
        assert r.token_budget == facts["n_batch"]
        assert (r.chunked_prefill, r.chunk_size) == (parsed.chunked_prefill, parsed.chunk_size)
        limits = runtime_limits(r, kv_capacity_tokens=10**9)
        assert limits.kv_capacity_tokens == facts["n_ctx"]
        assert limits.max_running_requests == facts["n_seq_max"]
        assert limits.prompt_limit == facts["n_ctx_slot"] - 1


def test_resolution_rules_the_fixtures_do_not_show() -> None:
    # three non-unified slots: n_ctx_seq = pad256(4096 / 3) = 1536, n_ctx = 3 * 1536
    r = _resolve(["-np", "3", "-c", "4096"])
    assert (r.context_len, r.max_total_tokens, r.token_budget) == (1536, 4608, 2048)
    assert r.chunked_prefill is False
    # auto slots force a unified KV cache even against --no-kv-unified
    assert _resolve(["--no-kv-unified"]).max_total_tokens == N_CTX_TRAIN
    # n_batch is capped by n_ctx; n_ubatch by n_batch
    r = _resolve(["-np", "1", "-c", "1024"])
    assert (r.token_budget, r.chunked_prefill, r.chunk_size) == (1024, False, None)
    # n_ctx 0 with fit on and two non-unified slots: n_ctx_train per slot
    r = _resolve(["-np", "2"])
    assert (r.max_total_tokens, r.context_len) == (2 * N_CTX_TRAIN, N_CTX_TRAIN)
    assert _resolve(["-np", "2", "--fit", "off"]).context_len == N_CTX_TRAIN // 2
    # a slot never exceeds the training context; --kv-unified-per-slot sizes and caps
    assert _resolve(["-np", "1", "-c", "16384"]).context_len == N_CTX_TRAIN
    r = _resolve(["-np", "2", "-kvu", "--kv-unified-per-slot", "1000"])
    assert (r.max_total_tokens, r.context_len) == (2048, 1000)
    assert _resolve(["--embedding", "-b", "4096", "-ub", "256"]).token_budget == 256
    # served model name: the first alias in order, else the model path
    assert _resolve(["-a", "zeta, alpha", "-m", "/m.gguf"]).served_model_name == "alpha"
    assert _resolve(["-m", "/m.gguf"]).served_model_name == "/m.gguf"
    with pytest.raises(ResolutionError, match="--parallel=0"):
        _resolve(["-np", "0"])
    with pytest.raises(ResolutionError, match="--parallel=300"):
        _resolve(["-np", "300"])


# ------------------------------------------------------------------------------------- flags


def test_flags_are_read_as_llama_server_reads_them() -> None:
    f = parse_flags("llamacpp", [])
    assert (f["ctx_size"], f["batch_size"], f["ubatch_size"], f["parallel"]) == (0, 2048, 512, -1)
    assert (f["cache_prompt"], f["kv_unified"], f["cont_batching"], f["verbosity"]) == (
        True,
        False,
        True,
        3,
    )
    f = parse_flags(
        "llamacpp", ["--no-cache-prompt", "-kvu", "-nocb", "--batch_size", "256", "-ub", "64"]
    )
    assert (f["cache_prompt"], f["kv_unified"], f["cont_batching"]) == (False, True, False)
    assert (f["batch_size"], f["ubatch_size"]) == (256, 64)
    assert {"cache_prompt", "kv_unified", "cont_batching", "batch_size"} <= f.given
    # a boolean option takes no value: the next token is not its value
    f = parse_flags("llamacpp", ["--cache-prompt", "false", "--frobnicate", "3"])
    assert f["cache_prompt"] is True
    assert f.unknown == ("false", "--frobnicate", "3")
    assert parse_flags("llamacpp", ["-np", "-1", "-n", "-1"])["parallel"] == -1
    # servelab's config form --name=value is the two tokens the backend passes to llama-server
    f = parse_flags("llamacpp", ["--ctx-size=4096", "--batch-size=256"])
    assert (f["ctx_size"], f["batch_size"]) == (4096, 256)
    assert f.unknown == ()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cache-prompt=true"], "is a switch and takes no value"),
        (["--ctx", "4096"], "abbreviation"),
        (["-c", "many"], "invalid int value"),
        (["-fa", "maybe"], "invalid choice"),
    ],
)
def test_what_llama_server_refuses_is_refused(flags: list[str], message: str) -> None:
    with pytest.raises(FlagError, match=message):
        parse_flags("llamacpp", flags)


# ----------------------------------------------------------------------------------- metrics


def test_the_captured_metrics_map_to_canonical_values_without_kv_usage() -> None:
    text = METRICS_TEXT.read_text(encoding="utf-8")
    header = re.search(r"their usages: (\[.*\])\); flags", text.splitlines()[0])
    assert header, "the # source: line gives the requests' usages"
    usages = json.loads(header.group(1))
    assert len(usages) == 2
    # every series the server wrote, as its # TYPE lines name it, is listed with its type (the
    # per-draft-position series appears only with speculative decoding)
    typed = dict(re.findall(r"^# TYPE (\S+) (\w+)$", text, flags=re.M))
    listed = dict(ENGINE_METRICS["llamacpp"])
    del listed["llamacpp:spec_decode_num_accepted_tokens_per_pos_total"]
    assert typed == listed
    samples = parse_metrics_text(text)
    values = canonical_values("llamacpp", samples)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert values == {
        "generation_tokens_total": sum(u["completion_tokens"] for u in usages),
        # llama-server counts the prompt tokens it processed, not those reused from the cache
        "prompt_tokens_total": sum(u["prompt_tokens"] for u in usages) - cached,
        "prompt_tokens_cached_total": cached,
        "requests_running": 0,
        "requests_waiting": 0,
    }
    by_name = {s.name: s.value for s in samples}
    assert by_name["llamacpp:prompt_tokens_cached_total"] == cached > 0
    for absent in ("kv_cache_usage", "preemptions_total", "prefix_cache_hit_rate"):
        assert absent not in METRIC_MAP["llamacpp"]
    assert canonical_metrics("llamacpp") == sorted(values)


# --------------------------------------------------------------------------------------- CLI


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="servelab")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.mark.parametrize("engine_arg", [[], ["--engine", "llamacpp"]])
def test_resolve_config_reads_a_captured_log(engine_arg: list[str], capsys: Any) -> None:
    name = "llamacpp-0c1e570-lv4-batch256.log"
    assert _cli(["resolve-config", *engine_arg, str(DATA / name)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        **parse_startup_log(_read(name)).to_dict(),
        "product": "llamacpp",
        "family": None,
    }
    assert (out["engine"], out["chunk_size"], out["version"]) == ("llamacpp", 256, "b1-0c1e570")


@pytest.mark.parametrize("name", READY_LOGS)
def test_each_captured_start_opens_with_its_start_line_and_stamps_count_up(name: str) -> None:
    """A captured start's first record is the line that opens every start (`SERVER_START`), and
    no other is; `log_seconds` reads each record's M.SS.mmm.uuu stamp as seconds since the start,
    never going back, and gives None for a line with no stamp (the `# source:` header)."""
    lines = _read(name).splitlines()
    assert log_seconds(lines[0]) is None
    stamped = [line for line in lines if log_seconds(line) is not None]
    assert SERVER_START.search(stamped[0])
    assert not any(SERVER_START.search(line) for line in stamped[1:])
    seconds = [log_seconds(line) for line in stamped]
    assert seconds == sorted(seconds) and seconds[-1] > seconds[0]


def test_log_seconds_reads_minutes_seconds_milliseconds_and_microseconds() -> None:
    assert log_seconds("1.02.127.603 I srv  llama_server: model loaded") == pytest.approx(62.127603)
    assert log_seconds("0.00.000.001 W cmn  x") == pytest.approx(1e-6)
    assert log_seconds("version 1.02.127.603 I") is None  # not a record's stamp
