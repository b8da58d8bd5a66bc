"""benchmarks/sim_vs_real_against_ceiling.py: a measurement's checks beside its ceiling's shares
(docs/simulator.md, "A sixteenth measurement")."""

from __future__ import annotations

from benchmark_modules import load_benchmark

against = load_benchmark("sim_vs_real_against_ceiling")

SUMMARY = {
    "series": [
        {
            "engine": "llamacpp",
            "arm": "defaults",
            "checked": 3,
            "met": 1,
            "saturation_met": True,
            "saturation_ratio": 0.97,
            "checks": [
                {"condition": "rate-4.00", "metric": "throughput", "met": False, "ratio": 0.94},
                {"condition": "rate-2.00", "metric": "ttft_p50", "met": True, "ratio": 1.1},
                {"condition": "rate-3.00", "metric": "ttft_p50", "met": False, "ratio": 1.4},
            ],
        }
    ]
}
CEILING = {
    "met_p5": 3.0,
    "met_mean": 3.6,
    "all_met_share": 0.7,
    "per_check": {
        "llamacpp/defaults rate-4.00 throughput": {"draws": 400, "met_share": 0.87},
        "llamacpp/defaults rate-2.00 ttft_p50": {"draws": 400, "met_share": 0.99},
        "llamacpp/defaults saturation": {"draws": 400, "met_share": 1.0},
    },
}


def test_each_miss_is_set_beside_the_ceilings_share_or_named_as_not_in_it() -> None:
    out = against.against_ceiling(SUMMARY, CEILING)
    assert (out["met"], out["checked"]) == (2, 4)  # the saturation check counted too
    assert out["ceiling_met_p5"] == 3.0
    assert out["missed"] == {"llamacpp/defaults rate-4.00 throughput": 0.87}
    assert out["missed_not_in_ceiling"] == ["llamacpp/defaults rate-3.00 ttft_p50"]
    assert out["checks"]["llamacpp/defaults rate-2.00 ttft_p50"] == {
        "met": True,
        "ceiling_met_share": 0.99,
    }
    assert out["checks"]["llamacpp/defaults saturation"]["met"] is True
