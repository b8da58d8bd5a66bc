"""benchmarks/llamacpp_pair_cost.py: what the fitted step model says two prompts at once cost
against one, and how a measurement's trials are summed up."""

from __future__ import annotations

import pytest
from benchmark_modules import load_benchmark

from servelab.sim.cpu_platform import StepCost

pair_cost = load_benchmark("llamacpp_pair_cost")
ZERO = {
    "step_s": 0.0,
    "per_token_s": 0.0,
    "per_sampled_s": 0.0,
    "per_attn_pair_s": 0.0,
    "per_kv_token_s": 0.0,
    "per_admitted_s": 0.0,
}


def _cost(**values: float) -> StepCost:
    return StepCost.from_mapping("llamacpp", {**ZERO, **values}, "test")


def test_the_model_prices_the_pair_by_its_passes_and_tokens() -> None:
    defaults, matched = pair_cost.SETTINGS["defaults"], pair_cost.SETTINGS["matched"]

    # a cost per pass only: defaults' two 512-token prompts share one call of two 512-token
    # micro-batches; matched's 256-token batches take two passes a prompt
    def price(
        cost: StepCost, flags: tuple[str, ...], prompts: int, front_end: bool = False
    ) -> float:
        return pair_cost.model_prompt_s(cost, 512, flags, prompts, front_end=front_end)

    per_pass = _cost(step_s=0.001)
    assert price(per_pass, defaults, 1) == pytest.approx(0.001)
    assert price(per_pass, defaults, 2) == pytest.approx(0.002)
    assert price(per_pass, matched, 1) == pytest.approx(0.002)
    assert price(per_pass, matched, 2) == pytest.approx(0.004)
    # a cost per token only: the pair's tokens are twice the single's, on either server
    per_token = _cost(per_token_s=1e-5)
    for flags in (defaults, matched):
        assert price(per_token, flags, 2) == pytest.approx(2 * price(per_token, flags, 1))
    # the front end is left out, as the server's prompt_ms leaves it out, or kept, once a prompt
    with_front_end = _cost(step_s=0.001, per_admitted_s=0.5)
    assert price(with_front_end, defaults, 2) == pytest.approx(0.002)
    assert price(with_front_end, defaults, 2, front_end=True) == pytest.approx(1.002)


def test_the_summary_takes_each_pairs_later_prompt_and_what_it_added_cycle_by_cycle() -> None:
    def trial(prompt_ms: list[float], calls: float, latency_ms: float) -> dict[str, object]:
        return {"prompt_ms": prompt_ms, "latency_ms": latency_ms, "calls": calls}

    result = {
        "settings": {"defaults": [], "matched": ["--batch-size=256"]},
        "tokens": 512,
        "trials": {
            "defaults": {
                "single": [trial([20.0], 1, 40.0), trial([22.0], 1, 41.0), trial([10.0], 1, 30.0)],
                "pair": [
                    trial([30.0, 40.0], 1, 55.0),  # adds 20 to its cycle's single, 15 to latency
                    trial([45.0, 44.0], 2, 51.0),  # adds 23, 10
                    trial([31.0, 12.0], 1, 42.0),  # adds 21, 12
                ],
            },
            "matched": {
                "single": [trial([10.0], 2, 30.0)],
                "pair": [trial([9.0, 10.0], 4, 45.0)],
            },
        },
    }
    rows = {r["server"]: r for r in pair_cost.summarize(result, None)}
    assert rows["defaults"]["single_prompt_ms"] == 20.0
    assert rows["defaults"]["pair_prompt_ms"] == 40.0  # the later of each pair: 40, 45, 31
    # cycle by cycle (20, 23, 21), not median against median (40 - 20)
    assert rows["defaults"]["extra_prompt_ms"] == 21.0
    assert rows["defaults"]["extra_share"] == 1.05  # 21 of the single's 20
    assert rows["defaults"]["extra_latency_ms"] == 12.0
    assert (rows["defaults"]["pairs_sharing_calls"], rows["defaults"]["pairs"]) == (2, 3)
    assert rows["matched"]["pairs_sharing_calls"] == 0
    assert rows["matched"]["extra_latency_ms"] == 15.0
    assert "model_extra_prompt_ms" not in rows["defaults"]
    # with a platform: the model's share, as prompt_ms counts a prompt (no front end). With the
    # mask's checks alone, the pair's two sequences in 256-token micro-batches check 278,976
    # cells against one 512-token prompt's 262,144 (`mask_work`)
    priced = {
        r["server"]: r
        for r in pair_cost.summarize(result, _cost(per_mask_check_s=1e-8, per_admitted_s=0.01))
    }
    assert priced["defaults"]["model_extra_share"] == pytest.approx(
        (278_976 - 262_144) / 262_144, abs=1e-3
    )
    assert priced["defaults"]["model_extra_prompt_ms"] == pytest.approx(0.17, abs=0.01)
    assert priced["defaults"]["model_extra_latency_ms"] == pytest.approx(10.17, abs=0.01)
