"""The engine registry: a toy third engine, defined entirely in this test, goes through the config
schema, flag parsing, resolution, the start-up-log parser and `servelab resolve-config`, telemetry
mapping, and the analysis and figures, with no code change anywhere else."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servelab import cli
from servelab.analysis import figdata
from servelab.analysis.pipeline import build_analysis, write_figures
from servelab.analysis.synthetic import RunSpec, write_simple_run
from servelab.engines import (
    METRIC_MAP,
    EngineSpec,
    LogFormat,
    ResolvedConfig,
    RuntimeLimits,
    UnknownEngineLog,
    canonical_values,
    check_resolved,
    detect_engine,
    engine_names,
    parse_flags,
    parse_metrics_text,
    parse_startup_log,
    registered,
    resolve,
)
from servelab.engines.base import EngineFlags, ResolutionError
from servelab.engines.logtext import BOOL, LogLine, Reader, field
from servelab.engines.registry import register, unregister
from servelab.grid.config import ConfigError, validate_config
from servelab.grid.settings import AnalysisSettings
from servelab.telemetry.prometheus import promql_queries

# ------------------------------------------------------------------------ the toy engine

# (option strings, dest, kind, type, default, nargs, const, choices), as _cli_tables.py has them.
TOY_FLAGS = (
    (("--model",), "model", "store", "str", "toy-model", None, None, None),
    (("--port",), "port", "store", "int", 9000, None, None, None),
    (("--prefill-chunk",), "prefill_chunk", "store", "int", None, None, None, None),
    (("--ctx",), "ctx", "store", "int", None, None, None, None),
    (("--no-prefix-reuse",), "no_prefix_reuse", "store_true", None, False, 0, True, None),
)


def _toy_resolve(
    f: EngineFlags, *, gpu_memory_mib: int, max_pos: int, version: str, gpu_name: str = ""
) -> ResolvedConfig:
    a = f.args
    # The toy's own rule: it chunks prefill at 1024 tokens unless told otherwise; 0 turns it off.
    chunk = 1024 if a["prefill_chunk"] is None else int(a["prefill_chunk"])
    if chunk < 0:
        raise ResolutionError(f"--prefill-chunk={chunk}: must be >= 0")
    ctx = int(a["ctx"] or max_pos)
    return ResolvedConfig(
        engine="toy",
        version=version,
        printed_version="1.0",
        model=a["model"],
        served_model_name=a["model"],
        dtype="float32",
        tensor_parallel_size=1,
        gpu_memory_mib=gpu_memory_mib,
        chunked_prefill=chunk > 0,
        chunked_prefill_rule="flag" if a["prefill_chunk"] is not None else "toy-default",
        chunk_size=chunk or None,
        token_budget=chunk or ctx,
        prefix_caching=not a["no_prefix_reuse"],
        context_len=ctx,
        schedule_policy="fcfs",
        max_num_seqs=None,
        max_running_requests=4,
        max_total_tokens=None,
        block_size=None,
        memory_fraction=0.5,
        cuda_graph_max_bs=None,
        overlap_schedule=None,
        flags=f.flags,
    )


def _toy_limits(resolved: ResolvedConfig, kv_capacity_tokens: int) -> RuntimeLimits:
    return RuntimeLimits(kv_capacity_tokens, None, 4, resolved.context_len, None)


TOY_RECORD = re.compile(r"^toy\[(?P<level>INFO|ERROR)\] (?P<msg>.*)$")


def _toy_read(lines: list[LogLine]) -> Reader:
    r = Reader()
    for line in lines:
        if line.msg is None:
            continue
        if m := re.match(r"toyserve (\S+) starting$", line.msg):
            r.put("version", m.group(1), line)
        elif line.msg.startswith("settings: "):
            if f := field(line.msg, "chunk", r"\d+"):
                size = int(f.group(1))
                r.put("chunked_prefill", size > 0, line)
                if size:
                    r.put("chunk_size", size, line)
            if f := field(line.msg, "prefix_reuse", BOOL):
                r.put("prefix_caching", f.group(1) == "True", line)
            if f := field(line.msg, "ctx", r"\d+"):
                r.put("context_len", int(f.group(1)), line)
            if f := field(line.msg, "slots", r"\d+"):
                r.put("slots", int(f.group(1)), line)
    return r


TOY = EngineSpec(
    name="toy",
    title="Toy",
    version="1.0",
    printed_version="1.0",
    flag_table=TOY_FLAGS,
    resolve=_toy_resolve,
    runtime_limits=_toy_limits,
    log=LogFormat(
        record=TOY_RECORD,
        markers=(re.compile(r"toyserve \S+ starting$"), re.compile(r"settings: ")),
        marker_words=re.compile(r"toyserve|settings: "),
        marker_hint="'toyserve X starting', 'settings: ...'",
        ready=re.compile(r"toy\[INFO\] listening on "),
        read=_toy_read,
        facts=("slots",),
    ),
    metric_map={
        "requests_running": "toy:busy_slots",
        "requests_waiting": "toy:queued",
        "prompt_tokens_total": "toy:prompt_tokens_total",
    },
    metric_series={
        "toy:busy_slots": "gauge",
        "toy:queued": "gauge",
        "toy:prompt_tokens_total": "counter",
    },
    entrypoint=("toyserve",),
)

TOY_LOG = """\
toy[INFO] toyserve 1.0 starting
toy[INFO] settings: (chunk=512, prefix_reuse=True, ctx=8192, slots=4)
toy[INFO] listening on 127.0.0.1:9000
"""


@pytest.fixture()
def toy() -> Iterator[EngineSpec]:
    with registered(TOY) as spec:
        yield spec


# ---------------------------------------------------------------------- the registry itself


def test_registry_lists_the_built_in_engines_in_order() -> None:
    # the study's two, llama.cpp (real only: the sim backend does not run it), then the current
    # releases' families
    assert engine_names() == ("vllm", "sglang", "vllm_v1", "sglang_v05", "llamacpp")


def test_registered_engine_is_listed_then_removed() -> None:
    with registered(TOY):
        assert engine_names()[-1] == "toy" and len(engine_names()) == 6
        assert METRIC_MAP["toy"]["requests_waiting"] == "toy:queued"
    assert "toy" not in engine_names()
    assert "toy" not in METRIC_MAP


def test_a_name_is_registered_once_and_built_ins_stay(toy: EngineSpec) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(TOY)
    with pytest.raises(ValueError, match="built in"):
        unregister("vllm")


def test_spec_refuses_a_metric_map_naming_an_unexported_series() -> None:
    with pytest.raises(ValueError, match="toy:missing"):
        EngineSpec(
            **{
                **TOY.__dict__,
                "metric_map": {"requests_running": "toy:missing"},
            }
        )


# --------------------------------------------------------------- engine facts, all generic


def test_toy_flags_and_resolution(toy: EngineSpec) -> None:
    parsed = parse_flags("toy", ["--prefill-chunk=2048", "--no-prefix-reuse", "--bogus"])
    assert parsed["prefill_chunk"] == 2048
    assert parsed.is_given("no_prefix_reuse")
    assert parsed.unknown == ("--bogus",)
    resolved = resolve("toy", ["--prefill-chunk", "0"], gpu_memory_mib=1000)
    assert resolved.chunked_prefill is False and resolved.chunk_size is None
    default = resolve("toy", [], gpu_memory_mib=1000, model_max_position_embeddings=4096)
    assert (default.chunk_size, default.context_len) == (1024, 4096)
    with pytest.raises(ResolutionError, match=r"toy at 1\.0 \(toy\) only"):
        resolve("toy", [], gpu_memory_mib=1000, version="2.0")


def test_toy_log_is_detected_and_parsed(toy: EngineSpec) -> None:
    assert detect_engine(TOY_LOG) == "toy"
    parsed = parse_startup_log(TOY_LOG)
    assert parsed.engine == "toy"
    assert (parsed.version, parsed.chunked_prefill, parsed.chunk_size) == ("1.0", True, 512)
    assert (parsed.prefix_caching, parsed.context_len) == (True, 8192)
    assert parsed.facts == {"slots": 4}
    assert parsed.ready is True
    assert parsed.evidence_lines["chunk_size"] == 2
    # the gate quotes the toy's own line
    with pytest.raises(ValueError, match=r"settings: \(chunk=512"):
        check_resolved(parsed, expect_chunked_prefill=True, expect_chunk_size=2048)


def test_a_vllm_log_is_not_taken_for_the_toy(toy: EngineSpec) -> None:
    text = (
        Path(__file__).parents[1] / "data/engine-logs/vllm-0.6.4dev-chunked-on-01.log"
    ).read_text()
    assert detect_engine(text) == "vllm"
    with pytest.raises(UnknownEngineLog, match=r"not a Toy start-up log.*looks like an vLLM log"):
        parse_startup_log(text, engine="toy")


def test_without_the_toy_its_log_is_refused_naming_the_engines() -> None:
    with pytest.raises(UnknownEngineLog, match=r"not a vLLM, SGLang or llama\.cpp start-up log"):
        parse_startup_log(TOY_LOG)


def test_resolve_config_cli_detects_the_toy_log(
    toy: EngineSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "startup.log"
    log.write_text(TOY_LOG)
    assert cli.main(["resolve-config", str(log)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "toy" and out["chunk_size"] == 512
    assert cli.main(["resolve-config", str(log), "--engine", "toy"]) == 0


def test_toy_metrics_map_to_canonical_telemetry(toy: EngineSpec) -> None:
    text = (
        "# TYPE toy:busy_slots gauge\ntoy:busy_slots 3\n"
        "# TYPE toy:queued gauge\ntoy:queued 7\n"
        "# TYPE toy:prompt_tokens counter\ntoy:prompt_tokens_total 120\n"
    )
    values = canonical_values("toy", parse_metrics_text(text))
    # what the toy does not export (KV usage) is absent, not zero
    assert values == {
        "prompt_tokens_total": 120.0,
        "requests_running": 3.0,
        "requests_waiting": 7.0,
    }
    queries = promql_queries("toy", {"job": "toy"})
    assert set(queries) == {"toy:busy_slots", "toy:queued", "toy:prompt_tokens_total"}


# ------------------------------------------------------------------------- the config schema


def test_config_schema_accepts_a_registered_engine(study_config: dict[str, Any]) -> None:
    config = copy.deepcopy(study_config)
    # the toy has no simulated model: it runs live, beside vLLM (at most two engines)
    config["backend"] = "local"
    del config["engines"]["sglang"]
    for arm in config["arms"].values():
        del arm["engines"]["sglang"]
    config["engines"]["toy"] = {
        "version": "1.0",
        "image": "example.org/toy@sha256:" + "0" * 64,
        "port": 9000,
        "flags": ["--prefill-chunk=2048"],
    }
    config["arms"]["defaults"]["engines"]["toy"] = {
        "flags": [],
        "expect": {"chunked_prefill": True, "chunk_size": 1024},
    }
    with pytest.raises(ConfigError, match=r"engines.*'toy'"):
        validate_config(config)
    with registered(TOY):
        validate_config(config)
        with pytest.raises(ConfigError, match="sim backend has no simulated toy"):
            validate_config({**config, "backend": "sim"})
        three = copy.deepcopy(config)
        three["engines"]["sglang"] = study_config["engines"]["sglang"]
        with pytest.raises(ConfigError, match=r"compares two engines.*got 3"):
            validate_config(three)


# ------------------------------------------------------------------- analysis and figures


def _write_runs(root: Path) -> list[Path]:
    dirs = []
    for engine, ttft in (("vllm", 2.0), ("sglang", 0.5), ("toy", 1.0)):
        for rep in ("rep1", "rep2"):
            spec = RunSpec("defaults", engine, "rate-0.12", rep, seed=int(rep[-1]))
            run_dir = root / spec.run_id
            scale = 1.0 + 0.1 * int(rep[-1])
            write_simple_run(run_dir, spec, [ttft * scale * (1 + k / 50) for k in range(30)])
            dirs.append(run_dir)
    return dirs


def test_analysis_and_figures_take_the_toy(toy: EngineSpec, tmp_path: Path) -> None:
    run_dirs = _write_runs(tmp_path / "runs")
    # three engines' runs: the analysis compares two, so it must be told which
    with pytest.raises(ValueError, match=r"compares two engines.*not 3"):
        build_analysis(run_dirs, telemetry=False)
    an = build_analysis(
        run_dirs, telemetry=False, settings=AnalysisSettings(engines=("vllm", "toy"))
    )
    assert {r.engine for r in an.runset.runs.values()} == {"vllm", "sglang", "toy"}
    # Table 3 (workload realisation) counts every run of the grid, the toy's included
    assert max(row["runs"] for row in an.table3_rows()) == 6
    data = figdata.figure_data(an)
    panel = next(p for p in data["figure11"]["panels"] if p["condition"] == "rate-0.12")
    assert list(panel["series"]) == ["defaults/vllm", "defaults/toy"]
    assert panel["series"]["defaults/toy"]["n_reps"] == 2
    assert "defaults/toy" in data["figure12"]["tail_ratio"]
    assert an.engine_pair == ("vllm", "toy")
    paths = write_figures(
        run_dirs,
        tmp_path / "figures",
        formats=("png",),
        settings=AnalysisSettings(engines=("vllm", "toy")),
    )
    assert paths and all(p.stat().st_size > 0 for p in paths)


def test_analysis_refuses_a_run_of_an_unregistered_engine(tmp_path: Path) -> None:
    with registered(TOY):
        run_dirs = _write_runs(tmp_path / "runs")
    with pytest.raises(ValueError, match="engine 'toy' is not one of"):
        build_analysis(run_dirs, telemetry=False)
