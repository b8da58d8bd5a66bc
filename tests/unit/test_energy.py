"""Energy and cost per output token (servelab.analysis.energy), results/run_metrics.csv's columns,
the GPU series through telemetry (canonical), and the price settings: a known counter increase
(with and without a reset) gives the right joules per token, a run without the GPU's series gives
null (never 0), and the dollars follow price x window ÷ tokens."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from servelab.analysis.energy import RunCost, gpu_energy_j, ok_output_tokens, run_cost
from servelab.analysis.reduce import reduce_requests, reduce_telemetry
from servelab.analysis.slo import write_run_metrics
from servelab.analysis.synthetic import RunSpec, telemetry_table, write_simple_run
from servelab.artifacts import (
    REQUESTS_SCHEMA,
    SCRAPE_SCHEMA,
    read_parquet,
    read_run_json,
)
from servelab.grid.config import node_usd_per_hour, validate_config
from servelab.grid.settings import CostSettings, KubernetesSettings, RequestSlo, SettingsError
from servelab.telemetry.canonical import GPU_METRIC_MAP, TelemetryWindowError, canonicalize

REPO = Path(__file__).resolve().parents[2]
RUN = "defaults/vllm/rate-0.12/rep1"
L4_SPOT = 0.34057  # config/config.yaml's cited L4 node price, USD/h
N_TTFT = 9  # write_simple_run: 2 * 9 + 6 = 24 ok output tokens in a 600 s window
TOKENS = 2 * N_TTFT + 6


def _energy(samples: list[tuple[float, float]]) -> pa.Table:
    return telemetry_table([(t, "gpu_energy_mj", v) for t, v in samples], RUN, "vllm")


# ----------------------------------------------------------------------------- the counter


def test_joules_are_the_counter_increase_over_the_window() -> None:
    # 12 kJ over the window, sampled every 5 s, the counter far from zero (energy since boot)
    samples = [(5.0 * k, 9.0e9 + 1.0e6 * k) for k in range(13)]
    assert gpu_energy_j(_energy(samples)) == pytest.approx(12_000.0)
    # the order of the rows does not matter
    assert gpu_energy_j(_energy(samples[::-1])) == pytest.approx(12_000.0)


def test_a_counter_reset_counts_the_new_value_in_full() -> None:
    """A driver reload zeroes DCGM's counter: the increase before the drop, then the value after
    it (PromQL `increase`'s reading of a reset)."""
    samples = [(0.0, 5_000_000.0), (5.0, 6_000_000.0), (10.0, 400_000.0), (15.0, 1_400_000.0)]
    # 1e6 mJ before the reset, 0.4e6 counted in full at it, 1e6 after: 2.4e6 mJ = 2400 J
    assert gpu_energy_j(_energy(samples)) == pytest.approx(2400.0)


@pytest.mark.parametrize(
    "telemetry",
    [
        None,  # no telemetry.parquet
        telemetry_table([(0.0, "kv_cache_usage", 0.5)], RUN, "vllm"),  # no GPU series (sim)
        telemetry_table([(0.0, "gpu_energy_mj", 1e9)], RUN, "vllm"),  # one sample: no increase
    ],
)
def test_without_the_energy_series_there_is_no_figure_never_zero(telemetry: pa.Table) -> None:
    assert math.isnan(gpu_energy_j(telemetry))
    cost = RunCost(window_s=600.0, output_tokens=1000.0, gpu_energy_j=gpu_energy_j(telemetry))
    assert math.isnan(cost.j_per_output_token)
    assert not math.isnan(cost.usd_per_million_output_tokens(L4_SPOT))  # the price still applies


def test_the_price_arithmetic() -> None:
    cost = RunCost(window_s=600.0, output_tokens=150_000.0, gpu_energy_j=45_000.0)
    assert cost.j_per_output_token == pytest.approx(0.3)
    # $0.34057/h x 1/6 h = $0.0567617 for 150k tokens: $0.378411 per million
    assert cost.usd_per_million_output_tokens(L4_SPOT) == pytest.approx(
        0.34057 * (600 / 3600) / 150_000 * 1e6
    )
    assert cost.usd_per_million_output_tokens(L4_SPOT) == pytest.approx(0.378411, rel=1e-6)
    assert math.isnan(cost.usd_per_million_output_tokens(None))
    no_tokens = RunCost(window_s=600.0, output_tokens=0.0, gpu_energy_j=45_000.0)
    assert math.isnan(no_tokens.j_per_output_token)
    assert math.isnan(no_tokens.usd_per_million_output_tokens(L4_SPOT))


def test_pooling_is_a_ratio_of_sums_and_needs_every_energy() -> None:
    a = RunCost(window_s=600.0, output_tokens=1000.0, gpu_energy_j=300.0)
    b = RunCost(window_s=300.0, output_tokens=3000.0, gpu_energy_j=500.0)
    pooled = RunCost.pooled([a, b])
    assert pooled.j_per_output_token == pytest.approx(800.0 / 4000.0)  # not the mean of 0.3, 0.17
    assert pooled.usd_per_million_output_tokens(3.6) == pytest.approx(3.6 * 0.25 / 4000 * 1e6)
    missing = RunCost(window_s=60.0, output_tokens=10.0, gpu_energy_j=math.nan)
    assert math.isnan(RunCost.pooled([a, missing]).j_per_output_token)


def test_the_tokens_are_the_ok_requests_output_tokens_warm_ups_included(tmp_path: Path) -> None:
    run_dir = write_simple_run(tmp_path / "r", RunSpec("defaults", "vllm", "c", "rep1"), [0.4] * 9)
    table = read_parquet(run_dir / "requests.parquet", REQUESTS_SCHEMA)
    req = reduce_requests(table, "r")
    assert ok_output_tokens(req) == TOKENS
    # a request that failed is not counted, whatever it streamed
    failed = table.set_column(
        table.schema.get_field_index("status"),
        "status",
        pa.array(["error"] + ["ok"] * (table.num_rows - 1)),
    )
    assert ok_output_tokens(reduce_requests(failed, "r")) == TOKENS - 2
    cost = run_cost(read_run_json(run_dir / "run.json"), req, None)
    assert (cost.window_s, cost.output_tokens) == (600.0, TOKENS)


# ----------------------------------------------------------------------------- run_metrics.csv


def test_run_metrics_csv_gains_energy_and_cost_columns(tmp_path: Path) -> None:
    counter = [(60.0 * k, 7.0e9 + 2.4e6 * k) for k in range(11)]  # 24 kJ over the 600 s window
    with_gpu = write_simple_run(
        tmp_path / "a", RunSpec("defaults", "vllm", "c", "rep1"), [0.4] * N_TTFT,
        gpu_energy_mj=counter,
    )  # fmt: skip
    sim_like = write_simple_run(
        tmp_path / "b", RunSpec("defaults", "vllm", "c", "rep2"), [0.4] * N_TTFT
    )
    no_telemetry = write_simple_run(
        tmp_path / "c", RunSpec("defaults", "vllm", "c", "rep3"), [0.4] * N_TTFT
    )
    (no_telemetry / "telemetry.parquet").unlink()  # a results folder without it still reads
    dirs = [with_gpu, sim_like, no_telemetry]
    out = write_run_metrics(dirs, tmp_path / "m.csv", slo=RequestSlo(), usd_per_node_hour=L4_SPOT)
    rows = {r["rep"]: r for r in csv.DictReader(out.open())}
    usd = f"{L4_SPOT * (600 / 3600) / TOKENS * 1e6:.6g}"
    assert rows["rep1"]["output_tokens"] == str(TOKENS)
    assert rows["rep1"]["gpu_energy_j"] == "24000"
    assert rows["rep1"]["j_per_output_token"] == f"{24000 / TOKENS:.6g}"
    assert rows["rep1"]["usd_per_million_output_tokens"] == usd
    for rep in ("rep2", "rep3"):  # no GPU series: empty (null), never 0
        assert rows[rep]["gpu_energy_j"] == rows[rep]["j_per_output_token"] == ""
        assert rows[rep]["usd_per_million_output_tokens"] == usd
    sidecar = json.loads(Path(f"{out}.json").read_text())
    assert sidecar["cost"] == {"node_usd_per_hour": L4_SPOT}
    assert {"j_per_output_token", "usd_per_million_output_tokens"} <= set(sidecar["definitions"])
    # no price configured for the campaign's GPU: no dollar figure either
    free = write_run_metrics(dirs, tmp_path / "f.csv", slo=RequestSlo())
    assert {r["usd_per_million_output_tokens"] for r in csv.DictReader(free.open())} == {""}


# ----------------------------------------------------------------------------- telemetry


def _scrape(series: dict[str, list[tuple[float, float]]]) -> pa.Table:
    rows = [
        {"run_id": RUN, "t_s": t, "source_metric": name, "value": v}
        for name, points in series.items()
        for t, v in points
    ]
    return pa.Table.from_pylist(rows, schema=SCRAPE_SCHEMA)


def _engine_series(duration: float = 60.0) -> dict[str, list[tuple[float, float]]]:
    from servelab.engines.metrics import METRIC_MAP

    grid = [5.0 * k for k in range(int(duration // 5) + 1)]
    return {source: [(t, 1.0) for t in grid] for source in set(METRIC_MAP["vllm"].values())}


def _canonical(scrape: pa.Table, *, full: bool = True) -> pa.Table:
    return canonicalize(
        scrape,
        engine="vllm",
        run_id=RUN,
        duration_s=60.0,
        step_s=5.0,
        what="scrape",
        require_full_window=full,
    )


def test_the_gpu_series_map_to_canonical_names_when_they_cover_the_window() -> None:
    grid = [5.0 * k for k in range(13)]
    energy = GPU_METRIC_MAP["gpu_energy_mj"]
    power = GPU_METRIC_MAP["gpu_power_w"]
    scrape = _scrape(
        {
            **_engine_series(),
            energy: [(t, 1e9 + 7e4 * t) for t in grid],
            power: [(t, 70.0) for t in grid],
        }
    )
    table = _canonical(scrape)
    metrics = table.column("metric").to_pylist()
    assert metrics.count("gpu_energy_mj") == metrics.count("gpu_power_w") == 13
    assert gpu_energy_j(table) == pytest.approx(7e4 * 60 / 1000)  # 70 W for 60 s: 4.2 kJ


def test_the_closing_samples_count_events_but_not_gauges_or_idle_energy() -> None:
    """Past the window's end (60 s here; the closing samples at 65 and 70 s): a count of events
    keeps them, since what the engine counted in the last step arrives there; a gauge loses them
    (an idle engine); the energy counter ends at the window's end, interpolated."""
    from servelab.engines.metrics import METRIC_MAP

    late = [5.0 * k for k in range(15)]  # 0 to 70 s
    preemptions = METRIC_MAP["vllm"]["preemptions_total"]
    waiting = METRIC_MAP["vllm"]["requests_waiting"]
    energy = GPU_METRIC_MAP["gpu_energy_mj"]
    series = {
        **_engine_series(),
        preemptions: [(t, 0.0 if t < 62 else 3.0) for t in late],
        waiting: [(t, 4.0 if t <= 60 else 0.0) for t in late],
        # 70 W to 57.5 s, then idle at 10 W: the samples around the end are 55 and 65 s
        energy: [(t, 1e9 + 7e4 * min(t, 57.5) + 1e4 * max(t - 57.5, 0.0)) for t in late[::-1]],
    }
    series[energy] = [p for p in series[energy] if p[0] != 60.0]
    table = _canonical(_scrape(series))
    rows = table.to_pylist()
    kept = {m: [r["t_s"] for r in rows if r["metric"] == m] for m in {r["metric"] for r in rows}}
    assert kept["preemptions_total"][-1] == 70.0
    assert reduce_telemetry(table)[1] == 3.0  # counted in the run's last step, seen at 65 s
    assert kept["requests_waiting"][-1] == 60.0
    assert kept["gpu_energy_mj"][-1] == 60.0
    # interpolated between 55 s and 65 s: (7e4 × 2.5 + 1e4 × 7.5) / 10 × 5 = 125 J past 55 s
    assert gpu_energy_j(table) == pytest.approx((7e4 * 55 + 125_000) / 1000)


def test_a_partial_or_missing_gpu_series_is_left_out_never_an_error() -> None:
    energy = GPU_METRIC_MAP["gpu_energy_mj"]
    late = [(5.0 * k, 1e9 + 1e5 * k) for k in range(6, 13)]  # the first 30 s missing
    table = _canonical(_scrape({**_engine_series(), energy: late}))
    assert "gpu_energy_mj" not in table.column("metric").to_pylist()
    assert math.isnan(gpu_energy_j(table))  # an undercount is not reported
    # a run that did not complete keeps what its window holds, as for the engine's series
    kept = _canonical(_scrape({**_engine_series(), energy: late}), full=False)
    assert kept.column("metric").to_pylist().count("gpu_energy_mj") == 7
    # the engine's own series are still required whole
    broken = _engine_series()
    broken[next(iter(broken))] = broken[next(iter(broken))][6:]
    with pytest.raises(TelemetryWindowError):
        _canonical(_scrape({**broken, energy: late}))


def test_a_scrape_without_gpu_series_maps_as_before() -> None:
    """The sim's and local backend's scrape.parquet: no GPU rows, the same canonical table."""
    table = _canonical(_scrape(_engine_series()))
    assert not {"gpu_energy_mj", "gpu_power_w"} & set(table.column("metric").to_pylist())


# ----------------------------------------------------------------------------- settings


def test_the_node_price_is_by_gpu_and_absent_for_other_gpus() -> None:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    validate_config(config)
    assert node_usd_per_hour(config) == L4_SPOT
    cpu = {**config, "gpu": {"name": "CPU", "memory_mib": 65536}}
    assert node_usd_per_hour(cpu) is None  # a CPU campaign merged over the study's: no price
    bare = {**config, "analysis": {k: v for k, v in config["analysis"].items() if k != "cost"}}
    assert node_usd_per_hour(bare) is None
    assert CostSettings.from_config({"node_usd_per_hour": {"H100-80GB": 2}}).price("H100-80GB") == 2
    with pytest.raises(SettingsError, match="usd"):
        CostSettings.from_config({"usd": 1})


def test_the_gpu_selector_names_the_engines_node_and_pod() -> None:
    settings = KubernetesSettings()
    assert settings.gpu_metrics_selector_for("d", node="gke-n1", pod="d-abc") == {"node": "gke-n1"}
    multi = KubernetesSettings.from_section(
        {"gpu_metrics_selector": {"node": "{node}", "exported_pod": "{pod}"}}
    )
    assert multi.gpu_metrics_selector_for("d", node="n", pod="d-abc") == {
        "node": "n",
        "exported_pod": "d-abc",
    }
    assert KubernetesSettings.from_section({"gpu_metrics_selector": {}}).gpu_metrics_selector == {}
