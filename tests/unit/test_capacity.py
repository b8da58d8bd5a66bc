"""The capacity search (servelab.capacity.method): the bisection's geometric midpoint and stopping rule on a
known threshold, the saturation probe's bracket and a probe's pass/fail read from run artifacts with
known metrics, the worst-case cost, and, on the sim backend with short runs, that the bisection's
bracket agrees with an exhaustive sweep over a fine rate grid on the same seeds."""

from __future__ import annotations

import copy
import csv
import io
from functools import cache
from pathlib import Path

import pytest
import yaml

from servelab.analysis.synthetic import RunSpec, write_simple_run
from servelab.capacity.method import (
    Search,
    bracket_of,
    capacity_csv,
    evaluate_probe,
    next_rate,
    probe_id,
    saturation_bracket,
    worst_case_cost_s,
)
from servelab.capacity.step import deploy_search, measure_probe
from servelab.grid.config import ConfigError
from servelab.grid.settings import CapacitySettings

REPO = Path(__file__).resolve().parents[2]


def _config(**capacity: object) -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["capacity"] = {
        "shapes": [{"name": "tiny", "sharing": 0.5, "prompt_tokens": 1024, "duration_s": 120}],
        "bracket": [0.1, 1.0],
        "tolerance": 0.05,
        "max_probes": 12,
        "repetitions": 1,
        "keeps_pace": 0.7,
        "limits": {"ttft_p99_s": 2.0},
        **capacity,
    }
    return config


def _search(settings: CapacitySettings, passes, bracket=None) -> dict:
    """Run the search against a pass/fail function; returns the final state."""
    state = {"bracket": list(bracket) if bracket else None, "probes": []}
    for _ in range(100):
        action, rate = next_rate(state, settings)
        if action == "done":
            return state
        if action == "saturation":
            state["probes"].append({"rate": rate, "saturation": True, "passed": None})
            state["bracket"] = [0.1, 1.0]
            continue
        state["probes"].append({"rate": rate, "passed": passes(rate)})
    raise AssertionError("the search did not stop")


@pytest.mark.parametrize("threshold", [0.137, 0.3137, 0.77])
def test_bisection_brackets_a_known_threshold_within_the_tolerance(threshold: float) -> None:
    settings = CapacitySettings.from_config(_config(tolerance=0.02, max_probes=30))
    state = _search(settings, lambda r: r <= threshold, bracket=(0.1, 1.0))
    low, high = bracket_of(state)
    assert low is not None and high is not None
    assert low <= threshold < high and (high - low) / high < 0.02
    assert len(state["probes"]) <= 2 + 10  # the two ends, then log2(ln(10)/0.02)-ish halvings


def test_the_search_stops_at_the_bracket_or_after_max_probes() -> None:
    settings = CapacitySettings.from_config(_config(tolerance=0.001, max_probes=5))
    below = _search(settings, lambda r: False, bracket=(0.1, 1.0))
    assert [p["rate"] for p in below["probes"]] == [0.1] and bracket_of(below) == (None, 0.1)
    above = _search(settings, lambda r: True, bracket=(0.1, 1.0))
    assert [p["rate"] for p in above["probes"]] == [0.1, 1.0] and bracket_of(above) == (1.0, None)
    capped = _search(settings, lambda r: r < 0.5, bracket=(0.1, 1.0))
    assert len(capped["probes"]) == 5  # max_probes, though the tolerance is not reached


def test_without_a_bracket_a_saturation_probe_comes_first() -> None:
    settings = CapacitySettings.from_config(_config(bracket=None, saturation_rate=3.0))
    assert next_rate({"bracket": None, "probes": []}, settings) == ("saturation", 3.0)


def test_each_probe_halves_the_bracket_in_log_rate() -> None:
    """The midpoint is geometric: rates span decades, and relative tolerance is what stops."""
    settings = CapacitySettings.from_config(_config(tolerance=0.001))
    state = {"bracket": [0.1, 1.0], "probes": [{"rate": 0.1, "passed": True}]}
    state["probes"].append({"rate": 1.0, "passed": False})
    assert next_rate(state, settings) == ("probe", 0.31623)  # sqrt(0.1 * 1.0), not 0.55
    state["probes"].append({"rate": 0.31623, "passed": False})
    assert next_rate(state, settings) == ("probe", 0.17783)  # sqrt(0.1 * 0.31623)


def _probe_run(run_dir: Path, *, end_s: float, rep: str = "rep1") -> Path:
    """A run of ten trace requests (TTFT 0.5 s) whose last chunk arrives at `end_s`: X = 10/end_s."""
    spec = RunSpec("defaults", "sglang", "cap-tiny-r0.1", rep)
    return write_simple_run(run_dir, spec, [0.5] * 9, end_s=end_s)


def test_a_probe_that_falls_behind_its_offered_load_fails(tmp_path: Path) -> None:
    settings = CapacitySettings.from_config(_config(keeps_pace=0.7, limits={"ttft_p99_s": 2.0}))
    # ten requests in 1000 s: X = 0.01/s. Offered 10 / duration_s.
    run = _probe_run(tmp_path / "r", end_s=1000.0)
    kept = evaluate_probe([run], settings, duration_s=1000.0)  # X = offered
    behind = evaluate_probe([run], settings, duration_s=500.0)  # X = offered / 2 < 0.7 offered
    assert kept["passed"] and kept["reps"][0]["keeps_pace"]
    assert kept["reps"][0]["within_limits"]
    assert behind["reps"][0]["offered_rps"] == pytest.approx(0.02)
    assert not behind["reps"][0]["keeps_pace"] and behind["reps"][0]["within_limits"]
    assert not behind["passed"]


def test_a_probe_over_its_latency_limit_fails_though_it_keeps_pace(tmp_path: Path) -> None:
    settings = CapacitySettings.from_config(_config(keeps_pace=0.7, limits={"ttft_p99_s": 0.4}))
    result = evaluate_probe([_probe_run(tmp_path / "r", end_s=1000.0)], settings, duration_s=1000.0)
    assert result["reps"][0]["keeps_pace"] and not result["reps"][0]["within_limits"]
    assert not result["passed"]


def test_the_saturation_probe_brackets_its_median_completed_graph_rate(tmp_path: Path) -> None:
    runs = [
        _probe_run(tmp_path / f"r{i}", end_s=end_s, rep=f"rep{i}")
        for i, end_s in enumerate((100.0, 400.0, 200.0), start=1)
    ]
    # X = 0.1, 0.025, 0.05 requests/s; 5 requests per graph: median 0.01 graphs/s
    assert saturation_bracket(runs, requests_per_graph=5) == [0.0025, 0.0125]


def test_probe_ids_name_the_shape_and_rate_and_seed_the_trace() -> None:
    shape = CapacitySettings.from_config(_config()).shape("tiny")
    assert probe_id(shape, 0.273442) == "cap-tiny-r0.27344"
    assert probe_id(shape, 3.0, saturation=True) == "cap-tiny-sat3"
    with pytest.raises(ConfigError, match="no shape named 'wide'"):
        CapacitySettings.from_config(_config()).shape("wide")


def test_worst_case_cost_counts_every_probe_repetition_pause_and_deployment() -> None:
    config = _config(max_probes=10, repetitions=3)
    config["campaign"]["pause_between_runs_s"] = 30
    config["dispatch"]["health_timeout_s"] = 900
    # one search per (arm, engine) of the config, one shape
    n = sum(len(arm["engines"]) for arm in config["arms"].values())
    assert worst_case_cost_s(config) == n * (10 * 3 * (120 + 30) + 900)


def test_capacity_csv_reports_the_bracket_probes_and_load_hours() -> None:
    settings = CapacitySettings.from_config(_config())
    state = _search(settings, lambda r: r <= 0.42, bracket=(0.1, 1.0))
    for p in state["probes"]:
        p["load_s"] = 120.0
    state.update(arm="defaults", engine="vllm", shape="tiny", stopped="tolerance")
    text = capacity_csv([state], settings)
    header, row = text.splitlines()
    fields = dict(zip(header.split(","), row.split(","), strict=True))
    low, high = bracket_of(state)
    assert (float(fields["capacity_low"]), float(fields["capacity_high"])) == (low, high)
    assert int(fields["probes"]) == len(state["probes"])
    assert float(fields["load_hours"]) == pytest.approx(len(state["probes"]) * 120 / 3600, abs=1e-3)
    assert fields["criteria"] == "X>=0.7*offered;ttft_p99_s<=2"


def test_each_bracket_end_reports_energy_and_cost_per_token(tmp_path: Path) -> None:
    """A probe records each repetition's window, ok output tokens and GPU energy; the CSV pools
    the probe at each end of the bracket (ratios of sums) and prices it; null without a series,
    a price, or the figures (a state written before they were recorded)."""
    settings = CapacitySettings.from_config(_config(keeps_pace=0.7, limits={"ttft_p99_s": 2.0}))
    spec = RunSpec("defaults", "sglang", "cap-tiny-r0.1", "rep1")
    counter = [(60.0 * k, 5e9 + 1.2e6 * k) for k in range(11)]  # 12 kJ in the 600 s window
    lit = write_simple_run(tmp_path / "a", spec, [0.5] * 9, end_s=500.0, gpu_energy_mj=counter)
    dark = write_simple_run(tmp_path / "b", spec, [0.5] * 9, end_s=500.0)  # no GPU series
    passed = evaluate_probe([lit, lit], settings, duration_s=500.0)
    failed = evaluate_probe([lit, dark], settings, duration_s=50.0)  # falls behind: fails
    assert passed["passed"] and not failed["passed"]
    rep = passed["reps"][0]
    assert (rep["window_s"], rep["output_tokens"], rep["gpu_energy_j"]) == (600.0, 24, 12e3)
    assert failed["reps"][1]["gpu_energy_j"] is None
    state = {
        "arm": "defaults", "engine": "sglang", "shape": "tiny", "stopped": "tolerance",
        "bracket": [0.1, 1.0],
        "probes": [
            {"rate": 0.1, "load_s": 1200.0, **passed},
            {"rate": 1.0, "load_s": 1200.0, **failed},
        ],
    }  # fmt: skip
    rows = list(
        csv.DictReader(io.StringIO(capacity_csv([state], settings, usd_per_node_hour=0.36)))
    )
    row = rows[0]
    assert (row["capacity_low"], row["capacity_high"]) == ("0.1", "1")
    assert float(row["j_per_output_token_low"]) == pytest.approx(24e3 / 48)
    # $0.36/h x 2 x 600 s / 48 tokens x 1e6 = $2500 per million
    assert float(row["usd_per_million_output_tokens_low"]) == pytest.approx(2500.0)
    assert row["j_per_output_token_high"] == ""  # one repetition without the GPU series
    assert float(row["usd_per_million_output_tokens_high"]) == pytest.approx(2500.0)
    unpriced = next(csv.DictReader(io.StringIO(capacity_csv([state], settings))))
    assert unpriced["usd_per_million_output_tokens_low"] == ""
    for probe in state["probes"]:  # a state from before the figures were recorded
        for rep in probe["reps"]:
            for key in ("window_s", "output_tokens", "gpu_energy_j"):
                rep.pop(key)
    old = next(csv.DictReader(io.StringIO(capacity_csv([state], settings, usd_per_node_hour=1))))
    assert {old[c] for c in old if c.endswith(("_low", "_high")) and "token" in c} == {""}


def test_a_probe_without_telemetry_reads_the_gpu_energy_from_its_scrape(tmp_path: Path) -> None:
    """Probe runs have no telemetry job: their scrape.parquet is mapped as the telemetry rule
    maps a campaign run's, at the campaign's step."""
    import pyarrow as pa

    from servelab.artifacts import SCRAPE_SCHEMA, write_parquet
    from servelab.engines.metrics import METRIC_MAP

    settings = CapacitySettings.from_config(_config(keeps_pace=0.7, limits={"ttft_p99_s": 2.0}))
    run = _probe_run(tmp_path / "r", end_s=500.0)
    (run / "telemetry.parquet").unlink()
    grid = [5.0 * k for k in range(121)]  # run.json's 600 s window, every 5 s
    series = {name: [1.0] * len(grid) for name in set(METRIC_MAP["sglang"].values())}
    series["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = [3e9 + 2e4 * t for t in grid]  # 20 W
    rows = [
        {"run_id": "x", "t_s": t, "source_metric": name, "value": v}
        for name, values in series.items()
        for t, v in zip(grid, values, strict=True)
    ]
    write_parquet(run / "scrape.parquet", pa.Table.from_pylist(rows, schema=SCRAPE_SCHEMA))
    with_step = evaluate_probe([run], settings, duration_s=500.0, step_s=5.0)
    assert with_step["reps"][0]["gpu_energy_j"] == pytest.approx(20.0 * 600)
    without = evaluate_probe([run], settings, duration_s=500.0)
    assert without["reps"][0]["gpu_energy_j"] is None
    assert with_step["passed"] == without["passed"]  # the verdict never depends on it


def test_bisection_agrees_with_an_exhaustive_sweep_on_the_same_seeds(tmp_path: Path) -> None:
    """Short sim runs (SGLang, σ 0.5, L 1024, 300 s, one seed per rate): a probe at a rate is the
    same measurement whoever asks for it, so the bisection's bracket must agree with the grid.

    Arrivals are made regular (CV 0.5) and the limit a median (TTFT p50 <= 1 s): with the study's
    bursty arrivals (CV 1.5) a 120-300 s probe's pass/fail is not monotone in the rate (each rate has
    its own seed), which is why capacity needs long probes (docs/capacity.md)."""
    config = _config(
        shapes=[{"name": "tiny", "sharing": 0.5, "prompt_tokens": 1024, "duration_s": 300}],
        limits={"ttft_p50_s": 1.0},
        keeps_pace=0.1,
    )
    config["workload"]["arrival_cv"] = 0.5
    settings = CapacitySettings.from_config(config)
    search = Search("defaults", "sglang", "tiny")
    deploy_search(config, search, tmp_path / "deployment")
    resolved = tmp_path / "deployment" / "resolved.json"

    @cache
    def passes(rate: float) -> bool:
        dirs = measure_probe(
            copy.deepcopy(config),
            search,
            rate,
            saturation=False,
            probe_dir=tmp_path / f"probe-{rate:g}",
            resolved_path=resolved,
        )
        return bool(evaluate_probe(dirs, settings, duration_s=300)["passed"])

    state = _search(settings, passes, bracket=(0.1, 1.0))
    low, high = bracket_of(state)
    assert low is not None and high is not None and (high - low) / high < settings.tolerance
    grid = [round(0.2 + 0.025 * i, 3) for i in range(17)]  # 0.2 .. 0.6
    outcome = {rate: passes(rate) for rate in grid}
    assert all(outcome[r] for r in grid if r <= low), outcome
    assert not any(outcome[r] for r in grid if r >= high), outcome
    # the grid's own transition lies inside the bisection's bracket
    last_pass = max(r for r in grid if outcome[r])
    first_fail = min(r for r in grid if not outcome[r])
    assert last_pass < high and first_fail > low


def test_the_search_deploys_its_engine_as_its_probes_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the local backend with pinned cores, the search's deployment carries its pinning and
    its node slot, so the first probe finds the server as it needs it (not started again)."""
    from servelab.capacity import step

    config = _config(
        shapes=[{"name": "tiny", "sharing": 0.5, "prompt_tokens": 1024, "duration_s": 300}],
        limits={"ttft_p50_s": 1.0},
    )
    config["backend"] = "local"
    config["local"] = {"engine_cpus": [1], "client_cpus": [0]}
    seen: dict = {}
    monkeypatch.setattr(step.campaign_deploy, "deploy", lambda **kwargs: seen.update(kwargs))
    deploy_search(config, Search("defaults", "sglang", "tiny"), tmp_path / "deployment")
    assert list(seen["identity"]["local"]["engine_cpus"]) == [1]
    assert list(seen["identity"]["local"]["client_cpus"]) == [0]
    assert seen["node"] == step.search_node(config, Search("defaults", "sglang", "tiny"))
