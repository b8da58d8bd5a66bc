"""benchmarks/run_speed_witness.py: a block's witness of the engine's speed, read from its
single-request passes, and the tally of TTFT misses by witness (docs/simulator.md, "Would a
run's own passes have told a slow block?")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.benchmark_modules import load_benchmark

witness = load_benchmark("run_speed_witness")


def passes(gap_s: float, iterations: int) -> dict[str, dict[str, float]]:
    return {"1": {"iterations": iterations, "median_gap_s": gap_s}, "2-3": {"iterations": 9}}


def test_a_blocks_witness_is_the_median_of_its_repetitions_real_over_predicted_gaps() -> None:
    block = {
        "real": [passes(0.003, 100), passes(0.0022, 100), passes(0.0020, 100)],
        "predicted": [passes(0.002, 100), passes(0.002, 100), passes(0.002, 100)],
    }
    # 1.5, 1.1, 1.0: the median, not the mean (1.2)
    assert witness.block_witness(block, min_passes=20) == pytest.approx(1.1)


def test_a_repetition_with_too_few_single_passes_on_either_side_is_left_out() -> None:
    block = {
        "real": [passes(0.004, 19), passes(0.002, 50), passes(0.003, 50)],
        "predicted": [passes(0.002, 50), passes(0.002, 50), passes(0.002, 10)],
    }
    # only the second repetition has 20 passes on both sides
    assert witness.block_witness(block, min_passes=20) == pytest.approx(1.0)
    assert witness.block_witness(block, min_passes=60) is None
    no_single = {"real": [{"2-3": {"iterations": 80}}], "predicted": [passes(0.002, 80)]}
    assert witness.block_witness(no_single, min_passes=20) is None


def test_a_block_whose_sides_have_different_repetitions_is_refused() -> None:
    block = {"real": [passes(0.002, 50)], "predicted": [passes(0.002, 50)] * 2}
    with pytest.raises(ValueError, match="1 real repetitions and 2 predicted"):
        witness.block_witness(block, min_passes=20)


@pytest.mark.parametrize(
    ("value", "off"), [(1.0, False), (1.09, False), (1 / 1.09, False), (1.12, True), (0.89, True)]
)
def test_a_witness_is_off_outside_the_band_either_way(value: float, off: bool) -> None:
    assert witness.is_off(value, 0.10) is off


def summary() -> dict:
    def check(condition: str, metric: str, ratio: float) -> dict:
        return {"condition": condition, "metric": metric, "ratio": ratio, "met": ratio > 0.75}

    return {
        "series": [
            {
                "engine": "vllm_v1",
                "arm": "defaults",
                "checks": [
                    check("rate-0.50", "ttft_p50", 0.70),
                    check("rate-0.50", "ttft_p95", 0.80),
                    check("rate-0.50", "throughput", 1.0),
                    check("rate-1.00", "ttft_p50", 0.95),
                    check("rate-1.00", "ttft_p95", 1.0),
                    check("rate-4.00", "throughput", 1.0),
                ],
                "iterations": {
                    "rate-0.50": {"real": [passes(0.0030, 90)], "predicted": [passes(0.002, 90)]},
                    "rate-1.00": {"real": [passes(0.0021, 90)], "predicted": [passes(0.002, 90)]},
                    "rate-4.00": {"real": [passes(0.0090, 90)], "predicted": [passes(0.002, 90)]},
                },
            }
        ]
    }


def test_only_the_rates_with_ttft_checks_are_read_with_their_ttft_checks() -> None:
    blocks = list(witness.light_load_blocks(summary(), min_passes=20))
    assert [b["condition"] for b in blocks] == ["rate-0.50", "rate-1.00"]
    assert [c["metric"] for c in blocks[0]["checks"]] == ["ttft_p50", "ttft_p95"]
    assert blocks[0]["witness"] == pytest.approx(1.5)
    assert blocks[1]["witness"] == pytest.approx(1.05)


def test_the_tally_counts_checks_and_blocks_by_witness_and_by_miss() -> None:
    blocks = list(witness.light_load_blocks(summary(), min_passes=20))
    blocks.append(
        {
            "engine": "vllm_v1",
            "arm": "matched",
            "condition": "rate-0.50",
            "witness": None,
            "checks": [{"metric": "ttft_p50", "ratio": 0.5, "met": False}],
        }
    )
    result = witness.tally(blocks, band=0.10)
    # the slow block (1.5) missed one of its two checks; the other (1.05) missed none
    assert result["checks"]["table"] == {
        "off": {"met": 1, "missed": 1},
        "on": {"met": 2, "missed": 0},
    }
    assert result["blocks"]["table"] == {
        "off": {"met": 0, "missed": 1},
        "on": {"met": 1, "missed": 0},
    }
    assert result["checks"]["misses_in_off_blocks"] == 1
    assert result["checks"]["misses"] == 1
    assert result["blocks_without_witness"] == 1


def test_per_engine_the_witness_is_ranked_against_the_ttft_ratios_and_tallied_on_its_own() -> None:
    def block(engine: str, value: float, ratio: float) -> dict:
        checks = [{"metric": m, "ratio": ratio, "met": ratio > 0.75} for m in witness.TTFT_METRICS]
        return {
            "engine": engine,
            "arm": "defaults",
            "condition": "rate-0.50",
            "witness": value,
            "checks": checks,
        }

    # vLLM: the slower its passes, the lower its TTFT ratio, in rank; llama.cpp's all faster
    blocks = [block("vllm_v1", w, 1.9 - w) for w in (1.0, 1.05, 1.2, 1.3, 1.4)]
    blocks += [
        block("llamacpp", w, r)
        for w, r in zip((0.91, 0.93, 0.95, 0.97, 0.99), (1.0, 0.99, 1.01, 0.98, 1.02), strict=True)
    ]
    result = witness.by_engine(blocks, band=0.10)
    vllm = result["engines"]["vllm_v1"]
    assert vllm["spearman"]["ttft_p50"]["rho"] == pytest.approx(-1.0)
    assert vllm["spearman"]["ttft_p50"]["n"] == 5
    assert vllm["median_witness"] == pytest.approx(1.2)
    # its own tally only: 1.2, 1.3 and 1.4 are off and miss (ratios 0.7, 0.6, 0.5); 1.0 and
    # 1.05 are on and meet (0.9, 0.85)
    assert vllm["tally"]["checks"]["table"] == {
        "off": {"met": 0, "missed": 6},
        "on": {"met": 4, "missed": 0},
    }
    assert result["engines"]["llamacpp"]["tally"]["checks"]["misses"] == 0
    # the two engines' witnesses do not overlap: Mann-Whitney's smallest p for 5 against 5
    assert result["mann_whitney_p"] == pytest.approx(2 / 252, abs=1e-4)


def test_a_deployments_witness_is_set_beside_its_own_floors_speed_against_the_fit(
    tmp_path: Path,
) -> None:
    def run(engine: str, arm: str, ratio: float | None) -> dict:
        return {"engine": engine, "arm": arm, "gap": None if ratio is None else {"ratio": ratio}}

    # residuals keep predicted ÷ observed: 0.8 and 0.9 are floors 1.25 and 1.111 slow
    residuals = {
        "runs": [
            run("vllm_v1", "defaults", 0.8),
            run("vllm_v1", "defaults", 0.9),
            run("vllm_v1", "defaults", None),
            run("llamacpp", "defaults", 1.0),
        ]
    }
    (tmp_path / "sim_vs_real_floor_residuals-day1.json").write_text(json.dumps(residuals))

    def block(engine: str, value: float | None) -> dict:
        return {"engine": engine, "arm": "defaults", "witness": value}

    by_day = {
        "day1": [
            block("vllm_v1", 1.3),
            block("vllm_v1", 1.2),
            block("vllm_v1", None),
            block("llamacpp", 0.9),
        ],
        "day2": [block("vllm_v1", 1.5)],  # no residuals kept: left out
    }
    out = witness.against_floor(by_day, tmp_path)
    floor = math.exp(-(math.log(0.8) + math.log(0.9)) / 2)
    (llama, vllm) = out["rows"]
    assert vllm["floor"] == pytest.approx(floor, abs=1e-4)
    assert vllm["witness"] == pytest.approx(1.25)
    assert vllm["difference"] == pytest.approx(1.25 - floor, abs=1e-4)
    assert llama["difference"] == pytest.approx(-0.1)
    assert out["engines"]["vllm_v1"] == {"deployments": 1, "positive": 1, "p": 0.5}
    assert out["engines"]["llamacpp"]["positive"] == 0
    assert witness.floor_speed(residuals, "vllm_v1", "matched") is None


def test_where_the_day_keeps_its_single_passes_the_passes_made_alone_meet_the_floor_too(
    tmp_path: Path,
) -> None:
    residuals = {"runs": [{"engine": "vllm_v1", "arm": "defaults", "gap": {"ratio": 0.9}}]}
    (tmp_path / "sim_vs_real_floor_residuals-d.json").write_text(json.dumps(residuals))

    def single(arm: str, ratio: float | None) -> dict:
        return {"engine": "vllm_v1", "arm": arm, "alone": {"ratio": ratio}}

    singles = {"blocks": [single("defaults", r) for r in (1.0, 1.2, 1.05, None)]}
    (tmp_path / "sim_vs_real_single_passes-d.json").write_text(json.dumps(singles))
    by_day = {"d": [{"engine": "vllm_v1", "arm": "defaults", "witness": 1.3}]}
    out = witness.against_floor(by_day, tmp_path)
    (row,) = out["rows"]
    # the median of the alone ratios (1.05), less the floor's 1/0.9
    assert row["alone"] == pytest.approx(1.05)
    assert row["alone_difference"] == pytest.approx(1.05 - 1 / 0.9, abs=1e-4)
    alone = out["engines"]["vllm_v1"]["alone"]
    assert alone["positive"] == 0 and alone["deployments"] == 1
    assert alone["median_difference"] == pytest.approx(1.05 - 1 / 0.9, abs=1e-4)
    assert out["engines"]["vllm_v1"]["positive"] == 1  # the witness, 1.3, is above it
