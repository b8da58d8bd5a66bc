"""A one-engine campaign's analysis (llama.cpp): Table 5 is the arm effect, matched ÷ defaults,
paired by repetition; Table 6 has that engine's columns only; `servelab table show` prints it.

Runs with exactly known TTFTs (analysis.synthetic.write_simple_run): the expected values are
computed here from the inputs, independently of the analysis code.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from servelab.analysis import write_table
from servelab.analysis.numbers import build_numbers, clean
from servelab.analysis.pipeline import build_analysis
from servelab.analysis.show import show_table
from servelab.analysis.synthetic import RunSpec, telemetry_table, write_simple_run
from servelab.artifacts import TELEMETRY_SCHEMA, write_parquet
from servelab.grid.config import analysis_settings
from servelab.grid.settings import AnalysisSettings

CONDITION = "rate-0.30"
REPS = ("rep1", "rep2", "rep3")
N = 30
TTFT_P50 = {"defaults": (0.50, 0.60, 0.55), "matched": (0.20, 0.30, 0.22)}
END_S = {"defaults": (40.0, 41.0, 39.0), "matched": (38.0, 37.0, 40.0)}


def _build(root: Path) -> list[Path]:
    dirs = []
    for arm in ("defaults", "matched"):
        for i, rep in enumerate(REPS):
            spec = RunSpec(
                arm,
                "llamacpp",
                CONDITION,
                rep,
                seed=500 + i,
                offered_load_rps=0.5,
                backend="local",
                chunked_prefill=arm == "matched",
                chunk_size=256 if arm == "matched" else None,
            )
            run_dir = root / "runs" / arm / "llamacpp" / CONDITION / rep
            ttfts = [TTFT_P50[arm][i]] * N
            dirs.append(write_simple_run(run_dir, spec, ttfts, end_s=END_S[arm][i]))
    return dirs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return _build(tmp_path_factory.mktemp("one-engine"))


SETTINGS = {"settings": AnalysisSettings(engines=("llamacpp",), table_conditions=(CONDITION,))}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_table5_of_one_engine_is_the_paired_arm_effect(runs: list[Path], tmp_path: Path) -> None:
    out = write_table(5, runs, tmp_path / "table5.csv", **SETTINGS)
    rows = _rows(out)
    assert [(r["condition"], r["metric"]) for r in rows] == [
        (CONDITION, "ttft_p50"),
        (CONDITION, "ttft_p95"),
        (CONDITION, "throughput"),
    ]
    by_metric = {r["metric"]: r for r in rows}
    ratios = np.array(TTFT_P50["matched"]) / np.array(TTFT_P50["defaults"])
    logs = np.log(ratios)
    change = math.exp(logs.mean())
    half = sps.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    p50 = by_metric["ttft_p50"]
    assert p50["engine"] == "llamacpp" and p50["n"] == "3"
    assert float(p50["change"]) == pytest.approx(change, rel=1e-4)
    assert float(p50["ci_low"]) == pytest.approx(math.exp(logs.mean() - half), rel=1e-4)
    assert float(p50["ci_high"]) == pytest.approx(math.exp(logs.mean() + half), rel=1e-4)
    p = sps.ttest_1samp(logs, 0.0).pvalue
    assert float(p50["p"]) == pytest.approx(p, rel=1e-3)
    defaults_gmean = math.exp(np.log(TTFT_P50["defaults"]).mean())
    assert float(p50["defaults"]) == pytest.approx(defaults_gmean, rel=1e-4)
    # throughput X = (N + 1) / W: the matched runs end sooner, so the change is above 1 here
    x = {arm: (N + 1) / np.array(END_S[arm]) for arm in END_S}
    x_change = math.exp(np.log(x["matched"] / x["defaults"]).mean())
    assert float(by_metric["throughput"]["change"]) == pytest.approx(x_change, rel=1e-4)


def test_a_missing_repetition_pairs_only_the_rest(runs: list[Path], tmp_path: Path) -> None:
    kept = [d for d in runs if "matched/llamacpp" not in d.as_posix() or "rep3" not in d.name]
    an = build_analysis(kept, **SETTINGS)
    row = an.table5_rows()[0]
    assert row["n"] == 2.0
    ratios = np.array(TTFT_P50["matched"][:2]) / np.array(TTFT_P50["defaults"][:2])
    assert row["change"] == pytest.approx(math.exp(np.log(ratios).mean()), rel=1e-4)
    assert any("rep3" in note for note in an.notes())


def test_table6_and_table4_follow_the_campaigns_engines(runs: list[Path], tmp_path: Path) -> None:
    header = _rows(write_table(6, runs, tmp_path / "table6.csv", **SETTINGS))[0].keys()
    assert list(header) == ["condition", "configuration", "llamacpp_tail_ratio", "llamacpp_g1"]
    assert _rows(write_table(4, runs, tmp_path / "table4.csv", **SETTINGS)) == []


def test_the_table_is_shown_as_the_arm_effect(runs: list[Path], tmp_path: Path) -> None:
    text = show_table(write_table(5, runs, tmp_path / "table5.csv", **SETTINGS))
    assert text.startswith("Table 5 (one engine). The arm effect")
    line = next(line for line in text.splitlines() if "TTFT p50" in line)
    assert "llamacpp" in line and line.rstrip().endswith("3")


def test_the_settings_come_from_the_config(study_config: dict) -> None:
    study = analysis_settings(study_config)
    assert study["engines"] == ["vllm", "sglang"]
    assert study["table_conditions"] == ["rate-0.12", "rate-0.28", "length-8192"]
    one = {
        **study_config,
        "engines": {"llamacpp": {}},
        "analysis": {**study_config["analysis"], "table_conditions": [CONDITION]},
    }
    assert analysis_settings(one)["engines"] == ["llamacpp"]
    assert analysis_settings(one)["table_conditions"] == [CONDITION]


def test_a_run_without_a_kv_series_has_an_empty_kv_peak(tmp_path: Path) -> None:
    """llama.cpp exports no KV-cache usage: its runs' telemetry has no such rows, and the
    KV-peak cell is empty (null in numbers.json), never a 0."""
    dirs = _build(tmp_path)
    for run_dir in dirs:
        run_id = "/".join(run_dir.parts[-4:])
        samples = [(t, "requests_running", 2.0) for t in (0.0, 1.0, 2.0)]
        samples += [(t, "prompt_tokens_cached_total", 10.0 * t) for t in (0.0, 1.0, 2.0)]
        write_parquet(
            run_dir / "telemetry.parquet",
            telemetry_table(samples, run_id, "llamacpp"),
            TELEMETRY_SCHEMA,
        )
    an = build_analysis(dirs, **SETTINGS)
    group = an.group("defaults", "llamacpp", CONDITION)
    assert group.n == 3 and math.isnan(group.kv_peak_mean)
    entry = clean(build_numbers(an))["groups"][f"defaults/llamacpp/{CONDITION}"]
    assert entry["kv_peak_mean"] is None and entry["kv_peak"] == [None, None, None]
