"""`servelab campaign power`: the repetitions the campaign's paired test needs, from its spread.

The fixture writes runs with exactly known TTFTs (`analysis.synthetic.write_simple_run`: every
request of a run has the same TTFT, so its p50 is that value), so the log ratios d_k of each
repetition are known here, from the inputs. The expected numbers are computed in this file, from
those inputs, with the textbook formula for the power of a two-sided one-sample t-test written out
with `scipy.stats.nct`, and the sample size by counting up from 2; the code under test searches
differently (doubling, then bisection). Two published examples pin the formula itself.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from servelab import cli
from servelab.analysis import stats
from servelab.analysis.power import PowerError, power_csv, results_power
from servelab.analysis.synthetic import RunSpec, write_simple_run
from servelab.grid.settings import AnalysisSettings

REPO = Path(__file__).resolve().parents[2]
N_REQUESTS = 20
SGLANG_P50 = (0.40, 0.55, 0.47, 0.61)
# The log ratio ln(vLLM p50 / SGLang p50) of each repetition, by arm and condition.
D = {
    ("defaults", "rate-0.12"): (0.10, 0.30, 0.05),
    ("defaults", "rate-0.28"): (0.20, 0.25, 0.50, 0.10),
    ("matched", "rate-0.28"): (0.02, -0.04, 0.07),
}
SETTINGS = AnalysisSettings(engines=("vllm", "sglang"))


def _write(root: Path, d: dict[tuple[str, str], tuple[float, ...]]) -> Path:
    for (arm, condition), logs in d.items():
        for k, dk in enumerate(logs):
            rep = f"rep{k + 1}"
            seed = 1000 + 10 * k + len(condition)  # the same trace for both engines of a rep
            for engine, p50 in (
                ("sglang", SGLANG_P50[k]),
                ("vllm", SGLANG_P50[k] * math.exp(dk)),
            ):
                spec = RunSpec(arm, engine, condition, rep, seed=seed)
                run_dir = root / "runs" / arm / engine / condition / rep
                write_simple_run(run_dir, spec, [p50] * N_REQUESTS, end_s=60.0)
    return root


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("power") / "results", D)


# ------------------------------------------------------------------ the textbook computation


def textbook_power(n: int, sd: float, effect: float, alpha: float) -> float:
    """Two-sided one-sample t-test: T ~ noncentral t(n − 1, √n · ln effect / sd); reject when
    |T| > c = t_{1 − α/2, n − 1}: power = P(T > c) + P(T < −c)."""
    df = n - 1
    nc = math.sqrt(n) * math.log(effect) / sd
    crit = sps.t.ppf(1 - alpha / 2, df)
    upper, lower = sps.nct.sf(crit, df, nc), sps.nct.cdf(-crit, df, nc)
    if math.isnan(lower):  # scipy's nct.cdf far in the tail: the same probability, mirrored
        lower = sps.nct.sf(crit, df, -nc)
    power = float(upper + lower)
    assert math.isfinite(power), (n, sd, effect, alpha)
    return power


def textbook_n(sd: float, effect: float, power: float, alpha: float) -> int:
    n = 2
    while textbook_power(n, sd, effect, alpha) < power:
        n += 1
    return n


def test_the_power_formula_reproduces_r_power_t_test_two_sample_example() -> None:
    """R's documented example `power.t.test(n = 20, delta = 1)` (two-sample, sd 1: df 38,
    noncentrality √10) prints power = 0.8689528; R counts only the upper tail by default
    (strict = FALSE), the lower adds 2.3e-7."""
    assert stats.t_test_power(math.sqrt(10), 38) == pytest.approx(0.8689528, abs=5e-7)


def test_the_paired_sample_size_reproduces_dalgaard_paired_example() -> None:
    """Dalgaard, Introductory Statistics with R, §8.3: `power.t.test(delta = 10,
    sd = 10 * sqrt(2), power = 0.85, type = "paired")` gives n = 19.96892 pairs; so 20 whole
    repetitions. The same δ/sd = 1/√2 on the log scale: effect 1.25, sd √2 · ln 1.25."""
    sd = math.sqrt(2) * math.log(1.25)
    n = 19.96892
    assert stats.t_test_power(math.sqrt(n) / math.sqrt(2), n - 1) == pytest.approx(0.85, abs=1e-5)
    assert stats.paired_sample_size(sd, 1.25, power=0.85) == 20
    assert stats.paired_power(19, sd, 1.25) < 0.85 <= stats.paired_power(20, sd, 1.25)


@pytest.mark.parametrize("sd", [0.01, 0.08, 0.2, 0.35, 1.0])
@pytest.mark.parametrize("effect", [1.1, 1.25, 0.8, 2.0])
def test_sample_size_is_the_first_n_reaching_the_power(sd: float, effect: float) -> None:
    for power, alpha in ((0.8, 0.05), (0.9, 0.01)):
        assert stats.paired_sample_size(sd, effect, power, alpha) == textbook_n(
            sd, effect, power, alpha
        )


def test_the_far_tail_is_taken_where_scipy_cdf_gives_up() -> None:
    """P(T < −c) for T ~ nct(df, nc) equals P(T' > c) for T' ~ nct(df, −nc): where scipy's
    nct.cdf is finite they agree; where it is NaN (far out, e.g. df 1 and nc 13.5) the power
    is still a number."""
    for df, nc in ((1, 3.0), (3, 19.09), (10, 2.0), (38, math.sqrt(10))):
        crit = sps.t.ppf(0.975, df)
        assert sps.nct.cdf(-crit, df, nc) == pytest.approx(sps.nct.sf(crit, df, -nc), rel=1e-6)
    power = stats.paired_power(2, 0.01, 1.1)
    assert power == pytest.approx(textbook_power(2, 0.01, 1.1, 0.05))
    assert 0.70 < power < 0.72


def test_power_limits() -> None:
    # no true gap: the two tails hold exactly alpha; an sd of 0: certain; one pair: no test
    assert stats.t_test_power(0.0, 5, 0.05) == pytest.approx(0.05)
    assert stats.paired_power(3, 0.0, 1.25) == 1.0
    assert math.isnan(stats.paired_power(1, 0.1, 1.25))
    assert stats.paired_sample_size(10.0, 1.01, max_n=1000) is None
    with pytest.raises(ValueError, match="ratio other than 1"):
        stats.paired_sample_size(0.1, 1.0)


# ------------------------------------------------------------------ the command on artifacts


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def test_power_equals_the_textbook_computation_per_condition(results: Path) -> None:
    rows = results_power(results, "ttft_p50", 1.25, settings=SETTINGS)
    assert [(r.scope, r.condition) for r in rows] == list(D)
    for r in rows:
        d = np.array(D[(r.scope, r.condition)])
        sd = float(np.std(d, ddof=1))
        assert r.pair == "vllm ÷ sglang"
        assert r.n == d.size
        assert r.sd_log == pytest.approx(sd, rel=1e-9)
        assert r.gap == pytest.approx(math.exp(d.mean()), rel=1e-9)
        assert r.n_required == textbook_n(sd, 1.25, 0.8, 0.05)
        assert r.power_at_n == pytest.approx(textbook_power(d.size, sd, 1.25, 0.05), rel=1e-9)
        # the true sd at the top of its 95% interval: s · √((n − 1) / χ²_{0.025, n − 1})
        sd_high = sd * math.sqrt((d.size - 1) / sps.chi2.ppf(0.025, d.size - 1))
        assert r.n_required_sd_high == textbook_n(sd_high, 1.25, 0.8, 0.05)


def test_power_follows_the_study_s_own_test(results: Path) -> None:
    """The sd is that of the log ratios the analysis' paired t-test runs on: with the observed
    mean as the effect, the noncentrality is the test's own t statistic."""
    rows = results_power(results, "ttft_p50", 1.25, settings=SETTINGS)
    for r in rows:
        d = np.array(D[(r.scope, r.condition)])
        t = sps.ttest_1samp(d, 0.0).statistic
        assert abs(math.log(r.gap)) * math.sqrt(r.n) / r.sd_log == pytest.approx(abs(t))


def test_target_power_and_alpha_are_applied(results: Path) -> None:
    rows = results_power(results, "ttft_p50", 1.1, settings=SETTINGS, power=0.95, alpha=0.01)
    for r in rows:
        sd = float(np.std(D[(r.scope, r.condition)], ddof=1))
        assert r.n_required == textbook_n(sd, 1.1, 0.95, 0.01)
        assert r.power_at_n == pytest.approx(textbook_power(r.n, sd, 1.1, 0.01), rel=1e-9)


def test_throughput_is_tested_the_other_way_round(results: Path) -> None:
    rows = results_power(results, "throughput", 1.25, settings=SETTINGS)
    assert {r.pair for r in rows} == {"sglang ÷ vllm"}


def test_cli_prints_the_table_and_writes_a_deterministic_csv(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "power.csv"
    argv = ["campaign", "power", "--config", str(REPO / "config" / "config.yaml")]
    argv += ["--results", str(results), "--metric", "ttft_p50", "--effect", "1.25"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ttft_p50" in text and "n for 80%" in text and "defaults  rate-0.28" in text
    first = out.read_bytes()
    rows = _csv(out)
    assert [(r["scope"], r["condition"]) for r in rows] == list(D)
    sd = float(np.std(D[("defaults", "rate-0.12")], ddof=1))
    assert int(rows[0]["n_required"]) == textbook_n(sd, 1.25, 0.8, 0.05)
    assert rows[0]["reps"] == "rep1 rep2 rep3"
    assert cli.main([*argv, "--out", str(out)]) == 0
    assert out.read_bytes() == first
    assert first.decode() == power_csv(results_power(results, "ttft_p50", 1.25, settings=SETTINGS))


def test_one_engine_campaign_takes_the_arm_effect(tmp_path: Path) -> None:
    logs = (0.3, 0.1, 0.2)
    for k, dk in enumerate(logs):
        for arm, p50 in (("defaults", 0.5), ("matched", 0.5 * math.exp(dk))):
            spec = RunSpec(arm, "llamacpp", "rate-0.30", f"rep{k + 1}", seed=7 + k, backend="local")
            run_dir = tmp_path / "runs" / arm / "llamacpp" / "rate-0.30" / f"rep{k + 1}"
            write_simple_run(run_dir, spec, [p50] * N_REQUESTS, end_s=60.0)
    (row,) = results_power(tmp_path, "ttft_p50", 1.25, settings=AnalysisSettings())
    sd = float(np.std(logs, ddof=1))
    assert (row.scope, row.pair) == ("arm_effect", "llamacpp: matched ÷ defaults")
    assert row.sd_log == pytest.approx(sd)
    assert row.n_required == textbook_n(sd, 1.25, 0.8, 0.05)


# ------------------------------------------------------------------ errors


def test_a_metric_the_tests_do_not_use_is_refused_naming_it(results: Path) -> None:
    with pytest.raises(PowerError, match=r"--metric 'ttft_p99': .*choose from ttft_p50"):
        results_power(results, "ttft_p99", 1.25, settings=SETTINGS)


def test_a_condition_with_one_repetition_is_refused_naming_it(tmp_path: Path) -> None:
    root = _write(tmp_path / "results", {**D, ("defaults", "length-8192"): (0.2,)})
    with pytest.raises(
        PowerError, match=r"ttft_p50: fewer than two paired repetitions at defaults/length-8192"
    ):
        results_power(root, "ttft_p50", 1.25, settings=SETTINGS)
    # the other conditions can still be asked for by name
    rows = results_power(root, "ttft_p50", 1.25, settings=SETTINGS, conditions=["rate-0.28"])
    assert [(r.scope, r.condition) for r in rows] == [
        ("defaults", "rate-0.28"),
        ("matched", "rate-0.28"),
    ]


def test_an_unpaired_condition_is_refused_naming_the_paired_ones(results: Path) -> None:
    with pytest.raises(PowerError, match=r"--condition rate-0.40: .*rate-0.12, rate-0.28"):
        results_power(results, "ttft_p50", 1.25, settings=SETTINGS, conditions=["rate-0.40"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"effect": 1.0}, "--effect 1.0"),
        ({"effect": -2.0}, "--effect -2.0"),
        ({"power": 1.2}, "--power 1.2"),
        ({"alpha": 0.0}, "--alpha 0.0"),
    ],
)
def test_arguments_out_of_range_are_refused(
    results: Path, kwargs: dict[str, float], message: str
) -> None:
    args = {"effect": 1.25, **kwargs}
    with pytest.raises(PowerError, match=message):
        results_power(results, "ttft_p50", settings=SETTINGS, **args)


def test_cli_errors_exit_2_naming_the_problem(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["campaign", "power", "--config", str(REPO / "config" / "config.yaml")]
    assert cli.main([*base, "--results", str(results), "--metric", "x", "--effect", "2"]) == 2
    assert "servelab campaign: error: --metric 'x'" in capsys.readouterr().err
    empty = tmp_path / "empty"
    assert cli.main([*base, "--results", str(empty), "--metric", "ttft_p50", "--effect", "2"]) == 2
    assert f"{empty / 'runs'}: no such directory" in capsys.readouterr().err
