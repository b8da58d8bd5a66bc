"""Holm's correction across the campaign's paired tests (config `analysis.multiplicity`).

`stats.holm` against worked examples; then a campaign written with exactly known TTFTs
(`analysis.synthetic.write_simple_run`), analysed with `multiplicity: holm`: Table 5's adjusted
p-values equal the step-down procedure written out here over every paired test the analysis runs,
its stars (`servelab table show`) and the figures' follow them, and the legend says which rule was
applied. With the default, `none`, every output is the study's: no column, key or line is added.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from servelab.analysis import stats, write_table
from servelab.analysis.figdata import figure_data
from servelab.analysis.numbers import build_numbers, render_notes
from servelab.analysis.pipeline import build_analysis
from servelab.analysis.show import show_table
from servelab.analysis.summary import METRICS
from servelab.analysis.synthetic import RunSpec, write_simple_run
from servelab.grid.config import ConfigError, analysis_settings, validate_config
from servelab.grid.settings import AnalysisSettings, SettingsError

# ------------------------------------------------------------------ stats.holm


def test_holm_reproduces_the_worked_example() -> None:
    """The Holm-Bonferroni example of Wikipedia (and of GeeksforGeeks): four hypotheses, raw p
    0.01, 0.04, 0.03, 0.005 at α = 0.05. 0.005 < 0.05/4 and 0.01 < 0.05/3 are rejected, then
    0.03 > 0.05/2 stops: H1 and H4 rejected, H2 and H3 not. Adjusted by hand: sorted
    4·0.005 = 0.02, 3·0.01 = 0.03, 2·0.03 = 0.06, max(1·0.04, 0.06) = 0.06."""
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p <= 0.05 for p in adjusted] == [True, False, False, True]


def test_holm_six_tests_by_hand() -> None:
    # sorted: 6·0.005 = 0.03, 5·0.01 = 0.05, 4·0.03 = 0.12, 3·0.04 = 0.12, 2·0.07 = 0.14, 1·0.2
    adjusted = stats.holm([0.01, 0.04, 0.20, 0.03, 0.005, 0.07])
    assert adjusted == pytest.approx([0.05, 0.12, 0.20, 0.12, 0.03, 0.14])


def test_holm_leaves_untested_out_of_the_count_and_caps_at_one() -> None:
    nan = float("nan")
    adjusted = stats.holm([0.02, nan, 0.5, 0.01])
    assert math.isnan(adjusted[1])
    assert adjusted[0] == pytest.approx(0.04) and adjusted[3] == pytest.approx(0.03)
    assert adjusted[2] == pytest.approx(0.5)
    assert stats.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    assert stats.holm([]) == [] and math.isnan(stats.holm([nan])[0])


def step_down(pvalues: list[float]) -> list[float]:
    """Holm (1979) written as the procedure, independently of stats.holm: for each hypothesis,
    the smallest α at which the step-down test rejects it."""
    tested = [i for i, p in enumerate(pvalues) if math.isfinite(p)]
    m = len(tested)
    order = sorted(tested, key=lambda i: pvalues[i])
    out = [math.nan] * len(pvalues)
    running = 0.0
    for step, i in enumerate(order):
        running = max(running, min(1.0, (m - step) * pvalues[i]))
        out[i] = running
    return out


# ------------------------------------------------------------------ a campaign

N = 20
SGLANG = (0.40, 0.55, 0.47)
# ln(vLLM p50 / SGLang p50) per repetition: p-values spread on both sides of 0.05 after Holm.
D = {
    ("defaults", "rate-0.12"): (0.20, 0.25, 0.30),  # t 8.7, p 0.013: * raw, not after Holm
    ("defaults", "rate-0.28"): (1.00, 1.01, 1.02),  # p 3.3e-5: *** raw, still starred
    ("matched", "rate-0.12"): (0.10, -0.05, 0.12),  # not significant
    ("matched", "rate-0.28"): (0.30, 0.32, 0.35),
}
CONDITIONS = ("rate-0.12", "rate-0.28")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("holm")
    dirs = []
    for (arm, condition), logs in D.items():
        for k, dk in enumerate(logs):
            rep = f"rep{k + 1}"
            for engine, p50 in (("sglang", SGLANG[k]), ("vllm", SGLANG[k] * math.exp(dk))):
                spec = RunSpec(arm, engine, condition, rep, seed=100 * k + len(condition))
                run_dir = root / "runs" / arm / engine / condition / rep
                dirs.append(write_simple_run(run_dir, spec, [p50] * N, end_s=60.0))
    return dirs


def _settings(rule: str) -> AnalysisSettings:
    return AnalysisSettings(
        engines=("vllm", "sglang"), table_conditions=CONDITIONS, multiplicity=rule
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_the_family_is_every_paired_test_of_the_campaign(runs: list[Path]) -> None:
    an = build_analysis(runs, settings=_settings("holm"), telemetry=False)
    family = an.tests()
    assert set(family) == {(a, c, m) for a, c in D for m in METRICS}
    # tested: the TTFT and E2E gaps; TPOT (0.1 s) and throughput (the same window) are equal in
    # every pair, so their t-test has no p-value and Holm does not count them
    tested = {k for k, g in family.items() if math.isfinite(g.p)}
    assert {m for _, _, m in tested} == {"ttft_p50", "ttft_p95", "e2e_p50"}
    assert an.family_size == len(tested) == 12


def test_table5_carries_the_holm_adjusted_p_values(runs: list[Path], tmp_path: Path) -> None:
    an = build_analysis(runs, settings=_settings("holm"), telemetry=False)
    keys = list(an.tests())
    expected = dict(zip(keys, step_down([an.tests()[k].p for k in keys]), strict=True))
    rows = _rows(write_table(5, an, tmp_path / "table5.csv"))
    assert list(rows[0])[-2:] == ["defaults_p_holm", "matched_p_holm"]
    for row in rows:
        for arm in ("defaults", "matched"):
            want = expected[(arm, row["condition"], row["metric"])]
            got = row[f"{arm}_p_holm"]
            if math.isnan(want):
                assert got == ""
            else:
                assert float(got) == pytest.approx(want, rel=1e-3)
                assert float(got) >= float(row[f"{arm}_p"])
    # the raw p-value and the other columns are the study's, unchanged
    plain = _rows(write_table(5, runs, tmp_path / "plain.csv", settings=_settings("none")))
    assert [{k: r[k] for k in p} for r, p in zip(rows, plain, strict=True)] == plain


def test_default_none_is_the_study_s_table_byte_for_byte(runs: list[Path], tmp_path: Path) -> None:
    none = write_table(5, runs, tmp_path / "none.csv", settings=_settings("none"))
    default = write_table(
        5,
        runs,
        tmp_path / "default.csv",
        settings=AnalysisSettings(engines=("vllm", "sglang"), table_conditions=CONDITIONS),
    )
    assert none.read_bytes() == default.read_bytes()
    assert "p_holm" not in none.read_text()


def test_stars_follow_the_rule_and_the_legend_names_it(runs: list[Path], tmp_path: Path) -> None:
    def ttft_p50_line(rule: str) -> tuple[str, str]:
        folder = tmp_path / rule
        folder.mkdir()
        an = build_analysis(runs, settings=_settings(rule), telemetry=False)
        table = write_table(5, an, folder / "table5.csv")
        (folder / "numbers.json").write_text(json.dumps(build_numbers(an)))
        text = show_table(table)
        line = next(x for x in text.splitlines() if x.split()[:3] == ["rate-0.12", "TTFT", "p50"])
        return line, text

    line, text = ttft_p50_line("none")
    assert "1.28*" in line  # exp(0.25); raw p 0.013
    assert "not corrected for multiple tests (multiplicity: none)" in text
    line, text = ttft_p50_line("holm")
    assert "1.28 " in line and "1.28*" not in line  # 12 tests: Holm p > 0.05
    assert "Holm-adjusted (Holm 1979) over the campaign's 12 paired tests" in text
    assert "(multiplicity: holm)" in text


def test_numbers_figures_and_notes_say_holm_only_when_applied(runs: list[Path]) -> None:
    holm = build_analysis(runs, settings=_settings("holm"), telemetry=False)
    numbers: dict[str, Any] = build_numbers(holm)
    assert numbers["parameters"]["multiplicity"] == "holm"
    assert numbers["multiplicity"]["rule"] == "holm" and numbers["multiplicity"]["tests"] == 12
    gap = numbers["gaps"]["defaults/rate-0.12/ttft_p50"]
    assert gap["p"] < 0.05 < gap["p_holm"] and gap["significant"] is False
    fig1 = figure_data(holm)["figure1"]
    assert fig1["multiplicity"] == "holm"
    row = next(
        r for r in fig1["rows"] if (r["condition"], r["metric"]) == ("rate-0.12", "ttft_p50")
    )
    assert row["defaults"]["significant"] is False
    assert "Holm (1979) over the campaign's 12 paired tests" in render_notes(holm)

    none = build_analysis(runs, settings=_settings("none"), telemetry=False)
    text = json.dumps(build_numbers(none))
    assert "multiplicity" not in text and "p_holm" not in text
    assert build_numbers(none)["gaps"]["defaults/rate-0.12/ttft_p50"]["significant"] is True
    assert "Holm" not in render_notes(none)


def test_one_engine_campaign_adjusts_its_arm_effects(tmp_path: Path) -> None:
    dirs = []
    for k, dk in enumerate((0.2, 0.25, 0.3)):
        for arm, p50 in (("defaults", 0.5), ("matched", 0.5 * math.exp(dk))):
            rep = f"rep{k + 1}"
            spec = RunSpec(arm, "llamacpp", "rate-0.30", rep, seed=3 + k, backend="local")
            run_dir = tmp_path / "runs" / arm / "llamacpp" / "rate-0.30" / rep
            dirs.append(write_simple_run(run_dir, spec, [p50] * N, end_s=60.0))
    settings = AnalysisSettings(
        engines=("llamacpp",), table_conditions=("rate-0.30",), multiplicity="holm"
    )
    an = build_analysis(dirs, settings=settings, telemetry=False)
    family = an.tests()
    assert set(family) == {("arm_effect", "rate-0.30", m) for m in METRICS}
    keys = list(family)
    expected = dict(zip(keys, step_down([family[k].p for k in keys]), strict=True))
    rows = _rows(write_table(5, an, tmp_path / "table5.csv"))
    assert list(rows[0])[-1] == "p_holm"
    for row in rows:
        want = expected[("arm_effect", row["condition"], row["metric"])]
        if math.isnan(want):
            assert row["p_holm"] == ""
        else:
            assert float(row["p_holm"]) == pytest.approx(want, rel=1e-3)
    assert "Holm-adjusted" in show_table(tmp_path / "table5.csv")


# ------------------------------------------------------------------ the configuration


def test_the_config_key_is_validated_and_reaches_the_settings(study_config: dict) -> None:
    assert analysis_settings(study_config)["multiplicity"] == "none"
    study_config["analysis"]["multiplicity"] = "holm"
    validate_config(study_config)
    assert analysis_settings(study_config)["multiplicity"] == "holm"
    assert AnalysisSettings.from_mapping(analysis_settings(study_config)).multiplicity == "holm"
    study_config["analysis"]["multiplicity"] = "bonferroni"
    with pytest.raises(ConfigError, match=r"config key analysis\.multiplicity: 'bonferroni'"):
        validate_config(study_config)
    with pytest.raises(SettingsError, match=r"analysis\.multiplicity: 'bh' is not one of"):
        AnalysisSettings(multiplicity="bh")
