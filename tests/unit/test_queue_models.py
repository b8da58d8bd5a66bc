"""results/queue_models.csv from small synthetic artifacts, without the workflow: two engines on one
trace (SGLang keeps pace at the floor, vLLM falls behind and its TTFT grows), the floor, the
deployments' KV sizes and one capacity probe; the fluid columns by hand, the closed model's limits
and its calibration on the probe."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from servelab.analysis import queueing
from servelab.analysis.queue_models import (
    COLUMNS,
    SUMMARY_COLUMNS,
    discover_probe_dirs,
    kv_capacity_tokens,
    write_queue_models,
)
from servelab.analysis.synthetic import (
    RunSpec,
    graph_trace_table,
    requests_table,
    write_graph_trace,
    write_run,
)
from servelab.artifacts import write_json
from servelab.grid.config import Condition

CONDITION = Condition("rate-0.25", "rate", 0.25, 0.5, 16, 200.0)
PROBE = Condition("cap-x-r1", "rate", 1.0, 0.5, 16, 60.0)
FLOOR_TTFT, FLOOR_TPOT = 0.2, 0.05
SEED = 11
GRAPHS = 50  # one every 4 s over the 200 s window


def served(table: pa.Table, ttft_at: Any, run_id: str) -> pa.Table:
    """Requests as an engine with TTFT `ttft_at(sent)` and 50 ms per later token serves `table`:
    each request sent when its predecessors finished (plus its tool delay)."""
    rows = table.to_pylist()
    done: dict[str, float] = {}
    out = []
    for row in rows:  # trace order is dependency order
        deps = row["depends_on"]
        sent = (max(done[d] for d in deps) if deps else row["arrival_s"]) + row["tool_delay_s"]
        first = sent + ttft_at(sent)
        times = [first + k * FLOOR_TPOT for k in range(row["max_tokens"])]
        done[row["request_id"]] = times[-1]
        out.append(
            {
                "request_id": row["request_id"],
                "graph_id": row["graph_id"],
                "role": row["role"],
                "sent_s": sent,
                "chunk_times_s": times,
                "max_tokens": row["max_tokens"],
            }
        )
    return requests_table(out, run_id)


def write_fixture(root: Path, *, probe: bool) -> dict[str, Any]:
    table = graph_trace_table([4.0 * g for g in range(GRAPHS)], workers=1)
    trace, manifest = write_graph_trace(
        root / "traces" / CONDITION.id / "rep1", condition=CONDITION, rep="rep1", seed=SEED,
        table=table,
    )  # fmt: skip
    nominal = table.num_rows / CONDITION.duration_s
    runs = []
    for engine, ttft_at in (
        ("sglang", lambda t: FLOOR_TTFT),  # the floor: keeps pace
        ("vllm", lambda t: FLOOR_TTFT + 0.25 * t),  # a backlog growing 0.25 s per s
    ):
        spec = RunSpec(
            "defaults", engine, CONDITION.id, "rep1", seed=SEED, offered_load_rps=nominal
        )
        runs.append(
            write_run(root / "runs" / spec.run_id, spec, served(table, ttft_at, spec.run_id))
        )
    floor = root / "floor.csv"
    with floor.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["deployment_id", "arm", "engine", "floor", "sharing", "prompt_tokens",
                    "ttft_p50_s", "tpot_p50_s"])  # fmt: skip
        for engine in ("sglang", "vllm"):
            w.writerow([f"defaults-{engine}-synthetic", "defaults", engine, "floor-s0.50-L16",
                        "0.50", 16, FLOOR_TTFT, FLOOR_TPOT])  # fmt: skip
    resolved = []
    for engine, facts in (
        ("sglang", {"max_total_num_tokens": 2000}),
        ("vllm", {"kv_cache_tokens": 1600}),
    ):
        path = root / "deployments" / f"defaults-{engine}-synthetic" / "resolved.json"
        write_json(path, {"deployment_id": f"defaults-{engine}-synthetic", "facts": facts})
        resolved.append(path)
    probes: list[str] = []
    if probe:  # vLLM's capacity probe: its own trace, a backlog growing 0.5 s per s
        folder = root / "capacity" / "defaults-vllm-x" / "probe-0"
        probe_table = graph_trace_table([1.0 * g for g in range(60)], workers=1)
        write_graph_trace(
            folder / "traces" / PROBE.id / "rep1", condition=PROBE, rep="rep1", seed=99,
            table=probe_table,
        )  # fmt: skip
        spec = RunSpec("defaults", "vllm", PROBE.id, "rep1", seed=99)
        write_run(
            folder / "runs" / spec.run_id,
            spec,
            served(probe_table, lambda t: FLOOR_TTFT + 0.5 * t, spec.run_id),
        )
        probes = discover_probe_dirs([root / "capacity" / "defaults-vllm-x"])
    return {
        "run_dirs": runs,
        "traces": [(trace, manifest)],
        "floor_csv": floor,
        "resolved": resolved,
        "probe_dirs": probes,
        "table": table,
    }


def write(root: Path, *, probe: bool = False) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    fx = write_fixture(root, probe=probe)
    out = root / "out"
    write_queue_models(
        fx["run_dirs"],
        out / "queue_models.csv",
        out / "queue_models_summary.csv",
        traces=fx["traces"],
        floor_csv=fx["floor_csv"],
        resolved=fx["resolved"],
        probe_dirs=fx["probe_dirs"],
    )
    with (out / "queue_models.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    with (out / "queue_models_summary.csv").open() as fh:
        summary = list(csv.DictReader(fh))
    return rows, summary


def measured_x(rows: list[dict[str, str]], engine: str) -> float:
    return float(next(r for r in rows if r["engine"] == engine)["measured_throughput_rps"])


def test_table_columns_rows_and_summary(tmp_path: Path) -> None:
    rows, summary = write(tmp_path)
    header = (tmp_path / "out" / "queue_models.csv").read_text().splitlines()[0]
    assert header.split(",") == list(COLUMNS)
    assert [r["run_id"] for r in rows] == [
        "defaults/sglang/rate-0.25/rep1",
        "defaults/vllm/rate-0.25/rep1",
    ]
    sglang, vllm = rows
    assert (sglang["saturated"], vllm["saturated"]) == ("false", "true")
    assert float(sglang["offered_rps"]) == pytest.approx(150 / 200.0)
    assert list(summary[0]) == list(SUMMARY_COLUMNS)
    models = [
        *("fluid", "fluid_run", "closed", "given_x", "closed_throughput"),
        *("fluid_run_growth", "closed_growth", "given_x_growth"),
    ]
    assert [(s["runs"], s["model"]) for s in summary][:8] == [("saturated", m) for m in models]
    assert len(summary) == 2 * 8 + 5  # no growth ratios over all runs
    fluid = next(s for s in summary if (s["runs"], s["model"]) == ("all", "fluid"))
    assert fluid["n"] == "1"
    assert float(fluid["mean_ratio"]) == pytest.approx(float(rows[1]["fluid_ratio"]), rel=1e-5)
    assert (tmp_path / "out" / "queue_models.csv.json").is_file()


def test_fluid_columns_by_hand(tmp_path: Path) -> None:
    """Eq. 8 as the analysis computes it (SGLang's p50 + (T/2)·δ/(1 − δ), δ from the pair's
    throughputs) and on the run alone (the floor + (T/2)(Λ/X − 1))."""
    rows, _ = write(tmp_path)
    sglang, vllm = rows
    xs, xv = measured_x(rows, "sglang"), measured_x(rows, "vllm")
    delta = 1 - xv / xs
    assert vllm["fluid_eligible"] == "true" and sglang["fluid_eligible"] == "false"
    expected = FLOOR_TTFT + 100.0 * delta / (1 - delta)
    assert float(vllm["fluid_ttft_p50_s"]) == pytest.approx(expected, rel=1e-5)
    offered = 150 / 200.0
    run_delta = 1 - xv / offered
    expected_run = FLOOR_TTFT + 100.0 * run_delta / (1 - run_delta)
    assert float(vllm["fluid_run_ttft_p50_s"]) == pytest.approx(expected_run, rel=1e-5)
    assert float(vllm["fluid_run_ttft_growth"]) == pytest.approx(offered / xv - 1, rel=1e-5)
    measured = float(vllm["measured_ttft_p50_s"])
    assert float(vllm["fluid_ratio"]) == pytest.approx(expected / measured, rel=1e-5)
    assert float(vllm["measured_ttft_growth"]) == pytest.approx(0.25, rel=1e-4)


def test_closed_model_at_light_load_is_the_floor(tmp_path: Path) -> None:
    """Graphs 4 s apart, each done in 2.2 s: nothing ever shares the engine, so the closed model
    predicts the floor's TTFT and the measured throughput exactly (the run was built so)."""
    rows, _ = write(tmp_path)
    sglang = rows[0]
    assert sglang["closed_source"] == "floor" and sglang["closed_probes"] == "0"
    assert float(sglang["closed_ttft_p50_s"]) == pytest.approx(FLOOR_TTFT)
    assert float(sglang["closed_ratio"]) == pytest.approx(1.0)
    assert float(sglang["closed_throughput_rps"]) == pytest.approx(measured_x(rows, "sglang"))
    assert float(sglang["closed_throughput_ratio"]) == pytest.approx(1.0, rel=1e-5)
    assert float(sglang["fork_join_growth"]) == 0.0
    # the token cache: 2,000 tokens, prompts of 17 (BOS), prefix 9, Ō = 35/3
    assert int(sglang["closed_slots"]) == queueing.engine_slots(
        2000, prompt_tokens=17, prefix_tokens=9, mean_output=35 / 3
    )
    assert sglang["given_x_ttft_p50_s"] == ""  # not saturated


def test_given_x_needs_requests_that_share_the_engine(tmp_path: Path) -> None:
    """The fixture's graphs never overlap in the closed model, so no per-sequence cost slows it
    to vLLM's measured X: no given_x prediction, and the notes say why."""
    rows, _ = write(tmp_path)
    vllm = rows[1]
    assert vllm["saturated"] == "true" and vllm["given_x_ttft_p50_s"] == ""
    assert "no given_x prediction" in (tmp_path / "out" / "queue_models.csv.json").read_text()


def test_capacity_probe_sets_the_saturated_throughput(tmp_path: Path) -> None:
    """The per-sequence cost is calibrated on the probe (its own trace and seed): the closed model
    with it serves the probe's trace at the probe's measured X."""
    rows, summary = write(tmp_path, probe=True)
    vllm = rows[1]
    assert vllm["closed_source"] == "capacity" and vllm["closed_probes"] == "1"
    c = float(vllm["closed_per_seq_s"])
    assert c > 0
    probe_dir = Path(discover_probe_dirs([tmp_path / "capacity" / "defaults-vllm-x"])[0])
    trace = queueing.read_graph_trace(
        str(tmp_path / "capacity/defaults-vllm-x/probe-0/traces/cap-x-r1/rep1/trace.parquet"),
        str(tmp_path / "capacity/defaults-vllm-x/probe-0/traces/cap-x-r1/rep1/manifest.json"),
    )
    engine = queueing.Engine(
        int(vllm["closed_slots"]), FLOOR_TTFT, FLOOR_TPOT, c, trace.mean_output
    )
    from servelab.analysis.reduce import reduce_requests, run_metrics
    from servelab.artifacts import REQUESTS_SCHEMA, read_parquet

    probe_x = run_metrics(
        reduce_requests(read_parquet(probe_dir / "requests.parquet", REQUESTS_SCHEMA), "probe")
    ).throughput
    assert queueing.evaluate(trace, engine).throughput == pytest.approx(probe_x, rel=1e-6)
    assert rows[0]["closed_source"] == "floor"  # SGLang has no probe
    closed = next(s for s in summary if (s["runs"], s["model"]) == ("saturated", "closed"))
    assert closed["n"] == "1"


def test_byte_identical_on_rerun(tmp_path: Path) -> None:
    write(tmp_path / "a", probe=True)
    write(tmp_path / "b", probe=True)
    for name in ("queue_models.csv", "queue_models_summary.csv", "queue_models.csv.json"):
        a = (tmp_path / "a" / "out" / name).read_text()
        b = (tmp_path / "b" / "out" / name).read_text()
        assert a == b, name


def test_kv_capacity_from_the_start_up_facts() -> None:
    assert kv_capacity_tokens({"num_gpu_blocks": 1213}, 16) == 19408
    assert kv_capacity_tokens({"max_total_num_tokens": 30273}, None) == 30273
    assert kv_capacity_tokens({"kv_cache_tokens": 5000, "num_gpu_blocks": 9}, 16) == 5000
    assert kv_capacity_tokens({"n_ctx": 4096}, None) == 4096
    assert kv_capacity_tokens({"num_gpu_blocks": 1213}, None) is None
    assert kv_capacity_tokens({}, 16) is None


def test_no_kv_size_leaves_the_closed_model_empty(tmp_path: Path) -> None:
    fx = write_fixture(tmp_path, probe=False)
    write_json(fx["resolved"][0], {"deployment_id": "defaults-sglang-synthetic", "facts": {}})
    out = tmp_path / "out"
    write_queue_models(
        fx["run_dirs"], out / "q.csv", out / "s.csv", traces=fx["traces"],
        floor_csv=fx["floor_csv"], resolved=fx["resolved"],
    )  # fmt: skip
    with (out / "q.csv").open() as fh:
        sglang = next(csv.DictReader(fh))
    assert sglang["closed_ttft_p50_s"] == "" and sglang["closed_source"] == ""
    assert "no KV cache size" in (out / "q.csv.json").read_text()
    assert sglang["fluid_run_ttft_growth"] == ""  # keeps pace: Eq. 8 does not apply
