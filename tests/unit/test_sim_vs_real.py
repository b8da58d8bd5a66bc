"""results/sim_vs_real.csv: the real and predicted runs reduced by the same functions, the
repetition interval, the ratio, the saturation rate and the goals."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servelab.analysis.sim_vs_real import (
    RunPair,
    compare_runs,
    saturation_rate,
    write_sim_vs_real,
)
from servelab.artifacts import REQUESTS_SCHEMA, SCRAPE_SCHEMA, write_json, write_parquet


def write_run(
    folder: Path,
    *,
    ttft: float,
    gap: float,
    n: int,
    span_s: float,
    offered: float,
    waiting: float,
    backlog_s: float = 0.0,
    status: str = "ok",
    per_graph: int = 1,
) -> Path:
    """A run of `n` requests sent evenly over `span_s`, each answering after `ttft` (plus
    `backlog_s` more for each request before it: a queue that grows) with 4 tokens `gap` apart,
    and a waiting gauge at `waiting`; `per_graph` consecutive requests make one agent graph."""
    rows = []
    for i in range(n):
        sent = span_s * i / n
        times = [sent + ttft + i * backlog_s + k * gap for k in range(4)]
        rows.append(
            {
                "run_id": "r",
                "request_id": f"g{i}-p",
                "graph_id": i // per_graph,
                "role": "planner",
                "warmup": False,
                "scheduled_s": sent,
                "sent_s": sent,
                "written_s": sent,
                "chunk_times_s": times,
                "chunk_tokens": [1, 1, 1, 1],
                "prompt_tokens": 10,
                "output_tokens": 4,
                "max_tokens": 4,
                "status": "ok",
                "error": None,
            }
        )
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet(
        folder / "requests.parquet", pa.Table.from_pylist(rows, REQUESTS_SCHEMA), REQUESTS_SCHEMA
    )
    end = max(2.0, max(r["chunk_times_s"][-1] for r in rows))
    scrape = pa.Table.from_pylist(
        [
            {
                "run_id": "r",
                "t_s": float(t),
                "source_metric": "vllm:num_requests_waiting",
                "value": waiting,
            }
            for t in range(3)
        ]
        # the window's closing sample, past its end: an idle engine, not the run's queue
        + [
            {
                "run_id": "r",
                "t_s": end + 1.0,
                "source_metric": "vllm:num_requests_waiting",
                "value": 0,
            }
        ],
        SCRAPE_SCHEMA,
    )
    write_parquet(folder / "scrape.parquet", scrape, SCRAPE_SCHEMA)
    write_json(
        folder / "run.json",
        {"offered_load_rps": offered, "status": status, "start_unix_s": 0.0, "end_unix_s": end},
    )
    return folder


def pairs(tmp_path: Path) -> list[RunPair]:
    out = []
    # Rate 1: both keep pace. Rate 4: the real engine falls behind (its queue grows by 0.5 s a
    # request, so its window triples), the prediction keeps pace.
    for rate, backlog in ((1.0, 0.0), (4.0, 0.5)):
        for rep, ttft in (("rep1", 0.10), ("rep2", 0.14)):
            real = write_run(
                tmp_path / "real" / f"{rate}" / rep,
                ttft=ttft,
                gap=0.01,
                n=int(20 * rate),
                span_s=20.0,
                offered=rate * 1.0,
                waiting=2.0,
                backlog_s=backlog,
            )
            predicted = write_run(
                tmp_path / "pred" / f"{rate}" / rep,
                ttft=0.09,
                gap=0.012,
                n=int(20 * rate),
                span_s=20.0,
                offered=rate * 1.0,
                waiting=1.0,
            )
            out.append(
                RunPair("vllm_v1", "defaults", f"rate-{rate:.2f}", rep, rate, 20.0, real, predicted)
            )
    return out


def test_each_row_has_the_real_mean_its_repetition_interval_the_prediction_and_the_ratio(
    tmp_path: Path,
) -> None:
    rows, summary, waiting = compare_runs(pairs(tmp_path))
    light = next(r for r in rows if r["rate"] == 1.0)
    assert light["reps"] == 2
    # graph 0 is excluded from the latency sample (the analysis's own rule): 19 requests of 19
    # graphs a repetition
    assert (light["sample_requests"], light["sample_graphs"]) == (38, 38)
    assert light["ttft_p50_real"] == pytest.approx(0.12)
    assert (light["ttft_p50_real_min"], light["ttft_p50_real_max"]) == pytest.approx((0.10, 0.14))
    assert light["ttft_p50_predicted"] == pytest.approx(0.09)
    assert light["ttft_p50_ratio"] == pytest.approx(0.09 / 0.12)
    assert light["itl_p99_ratio"] == pytest.approx(1.2)
    assert light["waiting_mean_real"] == 2.0 and light["waiting_mean_predicted"] == 1.0
    assert {(w["rep"], w["t_s"]) for w in waiting if w["condition"] == "rate-1.00"} == {
        (rep, float(t)) for rep in ("rep1", "rep2") for t in range(3)
    }
    series = summary["series"][0]
    assert series["engine"] == "vllm_v1" and series["arm"] == "defaults"


def test_a_real_run_that_is_not_ok_leaves_the_comparison_with_its_prediction(
    tmp_path: Path,
) -> None:
    made = pairs(tmp_path)
    refused = made[0]  # rate 1, rep1 (TTFT 0.10)
    write_run(
        refused.real_dir,
        ttft=0.10,
        gap=0.01,
        n=20,
        span_s=20.0,
        offered=1.0,
        waiting=2.0,
        status="failed",
    )
    rows, _summary, _waiting = compare_runs(made)
    light = next(r for r in rows if r["rate"] == 1.0)
    assert (light["reps"], light["not_ok"]) == (1, 1)
    assert (light["sample_requests"], light["sample_graphs"]) == (19, 19)  # the kept run's alone
    assert light["ttft_p50_real"] == pytest.approx(0.14)


def test_a_row_counts_the_requests_and_graphs_its_latency_percentiles_rest_on(
    tmp_path: Path,
) -> None:
    # three graphs of six requests a repetition: graph 0 leaves the latency sample
    made = []
    for rep in ("rep1", "rep2"):
        runs = [
            write_run(
                tmp_path / side / rep,
                ttft=0.1,
                gap=0.01,
                n=18,
                span_s=12.0,
                offered=3.0,
                waiting=0.0,
                per_graph=6,
            )
            for side in ("real", "pred")
        ]
        made.append(RunPair("llamacpp", "defaults", "rate-0.50", rep, 0.5, 12.0, *runs))
    rows, _summary, _waiting = compare_runs(made)
    assert (rows[0]["sample_requests"], rows[0]["sample_graphs"]) == (24, 4)


def test_the_saturation_rate_is_where_x_stops_keeping_pace() -> None:
    # keeps pace at 1 and 2 (ratio 1.0), 0.5 at 4: crosses 0.97 at 2 + 2 x 0.03 / 0.5
    assert saturation_rate([1, 2, 4], [1.0, 2.0, 2.0], [1.0, 2.0, 4.0], 0.97) == pytest.approx(2.12)
    assert math.isnan(saturation_rate([1, 2], [1.0, 2.0], [1.0, 2.0], 0.97))
    assert saturation_rate([1, 2], [0.5, 1.0], [1.0, 2.0], 0.97) == 1


def test_the_goals_are_checked_and_a_miss_is_reported(tmp_path: Path) -> None:
    _rows, summary, _waiting = compare_runs(pairs(tmp_path))
    series = summary["series"][0]
    checks = {(c["condition"], c["metric"]): c for c in series["checks"]}
    # TTFT p50 predicted 0.09 against 0.12: 25% low, at the edge of the goal
    assert checks[("rate-1.00", "ttft_p50")]["ratio"] == pytest.approx(0.75)
    # X at the rate the real engine could not keep: the prediction is twice as fast, a miss
    assert checks[("rate-4.00", "throughput")]["met"] is False
    assert series["saturation_predicted"] is None  # the prediction never saturated
    assert series["saturation_met"] is False
    # TTFT goals apply only up to 90% of the real saturation rate
    assert ("rate-4.00", "ttft_p50") not in checks


def test_the_files_are_byte_identical_on_rerun(tmp_path: Path) -> None:
    made = pairs(tmp_path)
    outputs = []
    for attempt in ("a", "b"):
        out = tmp_path / attempt
        write_sim_vs_real(
            made,
            out_csv=out / "sim_vs_real.csv",
            out_json=out / "sim_vs_real.json",
            out_waiting=out / "waiting.csv",
            out_figure=out / "sim_vs_real.png",
        )
        outputs.append(
            [
                (out / n).read_bytes()
                for n in ("sim_vs_real.csv", "sim_vs_real.json", "waiting.csv", "sim_vs_real.png")
            ]
        )
    assert outputs[0] == outputs[1]
    with (tmp_path / "a" / "sim_vs_real.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert [r["condition"] for r in table] == ["rate-1.00", "rate-4.00"]
    assert {"ttft_p95_real_min", "tpot_p50_ratio", "throughput_predicted"} <= set(table[0])
    assert json.loads((tmp_path / "a" / "sim_vs_real.json").read_text())["keeps_pace"] == 0.97


def streams_table(tmp_path: Path, streams: dict[str, list[float]]) -> pa.Table:
    """A run's requests.parquet (read back) whose requests got one token at each of their times."""
    rows = [
        {
            "run_id": "r",
            "request_id": rid,
            "graph_id": 1,
            "role": "worker",
            "warmup": False,
            "scheduled_s": 0.0,
            "sent_s": 0.0,
            "written_s": 0.0,
            "chunk_times_s": times,
            "chunk_tokens": [1] * len(times),
            "prompt_tokens": 10,
            "output_tokens": len(times),
            "max_tokens": 10,
            "status": "ok",
            "error": None,
        }
        for rid, times in streams.items()
    ]
    path = tmp_path / "requests.parquet"
    write_parquet(path, pa.Table.from_pylist(rows, REQUESTS_SCHEMA), REQUESTS_SCHEMA)
    return pq.read_table(path)


def test_iterations_are_read_from_when_the_tokens_reached_the_client(tmp_path: Path) -> None:
    from servelab.analysis.sim_vs_real import iteration_profile, iterations

    # three requests decoding together every 10 ms (their tokens 0.1 ms apart), then one alone
    # every 4 ms
    streams = {}
    for k in range(3):
        together = [0.010 * i + 0.0001 * k for i in range(5)]
        alone = [0.05 + 0.004 * i for i in range(4)] if k == 0 else []
        streams[f"r{k}"] = together + alone
    table = streams_table(tmp_path, streams)
    starts, tokens = iterations(table)
    assert tokens.tolist() == [3, 3, 3, 3, 3, 1, 1, 1, 1]
    assert starts[:2] == pytest.approx([0.0, 0.010])
    profile = iteration_profile(table)
    assert profile["2-3"] == {"iterations": 5, "median_gap_s": pytest.approx(0.010)}
    assert profile["1"] == {"iterations": 3, "median_gap_s": pytest.approx(0.004)}


def test_a_step_written_slot_by_slot_is_one_iteration(tmp_path: Path) -> None:
    """llama-server writes each slot's token from its own HTTP thread, so one pass's tokens reach
    the clients up to milliseconds apart: four slots' tokens 0.6 ms apart, a pass every 10 ms,
    are one iteration a pass (cutting at every gap over 0.5 ms made four)."""
    from servelab.analysis.sim_vs_real import iterations

    streams = {f"slot{k}": [0.010 * i + 0.0006 * k for i in range(6)] for k in range(4)}
    starts, tokens = iterations(streams_table(tmp_path, streams))
    assert tokens.tolist() == [4] * 6
    assert starts == pytest.approx([0.010 * i for i in range(6)])


def test_the_bracket_judges_only_the_deployments_its_record_judges(tmp_path: Path) -> None:
    made = pairs(tmp_path)
    made += [dataclasses.replace(p, arm="matched") for p in made]  # the same runs, another arm
    # matched's floors agree, but its engine's floor was noisier than the bar: not judged
    agreed = {"pairs": 8, "ttft_ratio": 1.02, "itl_ratio": 0.99, "agrees": True}
    drift = {
        "band": 0.05,
        "max_noise": 0.045,
        "deployments": {
            "vllm_v1/defaults": {**agreed, "quiet": True, "judged": True},
            "vllm_v1/matched": {**agreed, "quiet": False, "judged": False},
        },
    }
    _rows, plain, _waiting = compare_runs(made)
    _rows, summary, _waiting = compare_runs(made, floor_drift=drift)
    assert "bracket" not in plain and "judged" not in plain["series"][0]
    by_arm = {s["arm"]: s for s in summary["series"]}
    assert by_arm["defaults"]["judged"] is True and by_arm["matched"]["judged"] is False
    assert by_arm["matched"]["floors"] == {
        "pairs": 8,
        "ttft_ratio": 1.02,
        "itl_ratio": 0.99,
        "agrees": True,
        "quiet": False,
    }
    # the refused deployment's checks are kept, but the goal counts the judged one alone
    assert by_arm["matched"]["checks"] == by_arm["defaults"]["checks"]
    judged = by_arm["defaults"]
    assert summary["bracket"] == {
        "band": 0.05,
        "max_noise": 0.045,
        "judged": ["vllm_v1/defaults"],
        "refused": ["vllm_v1/matched"],
        "met": judged["met"] + judged["saturation_met"],
        "checked": judged["checked"] + 1,
    }
    # a deployment the bracket has no record of (its floor after was never made) is refused
    drift["deployments"]["vllm_v1/matched"]["judged"] = True
    drift["deployments"].pop("vllm_v1/defaults")
    _rows, summary, _waiting = compare_runs(made, floor_drift=drift)
    assert summary["bracket"]["refused"] == ["vllm_v1/defaults"]
    assert summary["bracket"]["judged"] == ["vllm_v1/matched"]
    assert by_arm["defaults"]["floors"]["pairs"] == 8
