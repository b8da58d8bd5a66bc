"""Tables 3-6 from fixture runs with known per-run metrics, checked against scipy computed here."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from servelab.analysis import (
    build_analysis,
    write_numbers,
    write_table,
)
from servelab.analysis.synthetic import RunSpec, write_simple_run
from servelab.analysis.tables import TABLE5_COLUMNS
from servelab.grid.settings import AnalysisSettings

REPS = ("rep1", "rep2", "rep3")
CONDS = ("rate-0.12", "rate-0.28", "length-8192")
N = 20  # measured requests per run
# Run p50 TTFT (s) per (arm, engine, condition): one value per repetition.
P50 = {
    ("defaults", "vllm", "rate-0.12"): (0.52, 0.56, 0.50),
    ("defaults", "sglang", "rate-0.12"): (0.48, 0.51, 0.47),  # gap ≈ 1.08: φ guarded
    ("matched", "vllm", "rate-0.12"): (0.45, 0.47, 0.44),
    ("matched", "sglang", "rate-0.12"): (0.46, 0.49, 0.47),
    ("defaults", "vllm", "rate-0.28"): (40.0, 55.0, 45.0),
    ("defaults", "sglang", "rate-0.28"): (1.1, 1.3, 0.9),
    ("matched", "vllm", "rate-0.28"): (12.0, 16.0, 9.0),
    ("matched", "sglang", "rate-0.28"): (0.95, 1.0, 0.9),
    ("defaults", "vllm", "length-8192"): (60.0, 70.0, 114.0),
    ("defaults", "sglang", "length-8192"): (0.9, 0.85, 0.95),
    ("matched", "vllm", "length-8192"): (3.2, 9.8, 1.3),
    ("matched", "sglang", "length-8192"): (0.88, 0.86, 0.87),
}
TAIL = 400.0  # one slow request (above every p50) per run: p95 = p50 + 0.05 (TAIL − p50)
# W per run (s): X = (N + 1) / W, graph 0 included; later than every chunk of the run.
END = {
    "vllm": {"rep1": 1000.0, "rep2": 1020.0, "rep3": 990.0},
    "sglang": {"rep1": 950.0, "rep2": 960.0, "rep3": 955.0},
}


def _ttfts(p50: float) -> list[float]:
    return [p50] * (N - 1) + [TAIL]


def _p95(p50: float) -> float:
    return p50 + 0.05 * (TAIL - p50)


def _x(engine: str, rep: str) -> float:
    return (N + 1) / END[engine][rep]


def _spec(arm: str, engine: str, cond: str, rep: str, **kw) -> RunSpec:
    unchunked = arm == "defaults" and engine == "vllm"
    return RunSpec(
        arm,
        engine,
        cond,
        rep,
        seed=1000 + REPS.index(rep),
        offered_load_rps=1.68,
        chunked_prefill=not unchunked,
        chunk_size=None if unchunked else 2048,
        **kw,
    )


def _build(root: Path, failed: frozenset[str] = frozenset(), absent: frozenset[str] = frozenset()):
    dirs = []
    for (arm, engine, cond), values in P50.items():
        for rep, p50 in zip(REPS, values, strict=True):
            run_id = f"{arm}/{engine}/{cond}/{rep}"
            if run_id in absent:
                continue
            spec = _spec(arm, engine, cond, rep, status="failed" if run_id in failed else None)
            d = root / "runs" / arm / engine / cond / rep
            write_simple_run(d, spec, _ttfts(p50), end_s=END[engine][rep])
            dirs.append(d)
    return sorted(dirs)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return _build(tmp_path_factory.mktemp("full"))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _expected_gap(num: list[float], den: list[float]) -> dict[str, float]:
    d = np.log(num) - np.log(den)
    lo, hi = sps.t.interval(0.95, d.size - 1, loc=d.mean(), scale=sps.sem(d))
    return {
        "gap": math.exp(d.mean()),
        "ci_low": math.exp(lo),
        "ci_high": math.exp(hi),
        "p": sps.ttest_rel(np.log(num), np.log(den)).pvalue,
    }


def test_table5_columns_rows_and_values(full: list[Path], tmp_path: Path) -> None:
    out = write_table(5, full, tmp_path / "table5.csv", settings=AnalysisSettings(phi_guard=1.1))
    text = out.read_text()
    assert text.splitlines()[0] == ",".join(TABLE5_COLUMNS)
    rows = _rows(out)
    assert [(r["condition"], r["metric"]) for r in rows] == [
        ("rate-0.12", "ttft_p50"),
        ("rate-0.12", "ttft_p95"),
        ("rate-0.28", "ttft_p50"),
        ("rate-0.28", "ttft_p95"),
        ("length-8192", "ttft_p50"),
        ("length-8192", "ttft_p95"),
        ("rate-0.28", "throughput"),
    ]
    for row in rows:
        cond, metric = row["condition"], row["metric"]
        gaps = {}
        for arm in ("defaults", "matched"):
            if metric == "throughput":
                num = [_x("sglang", r) for r in REPS]  # SGLang ÷ vLLM
                den = [_x("vllm", r) for r in REPS]
            else:
                f = (lambda v: v) if metric == "ttft_p50" else _p95
                num = [f(v) for v in P50[(arm, "vllm", cond)]]
                den = [f(v) for v in P50[(arm, "sglang", cond)]]
            exp = _expected_gap(num, den)
            gaps[arm] = exp["gap"]
            assert row[f"{arm}_gap"] == f"{exp['gap']:.5g}", (cond, metric, arm)
            assert row[f"{arm}_ci_low"] == f"{exp['ci_low']:.5g}"
            assert row[f"{arm}_ci_high"] == f"{exp['ci_high']:.5g}"
            assert row[f"{arm}_p"] == f"{exp['p']:.4g}"
        if abs(math.log(gaps["defaults"])) > math.log(1.1):
            phi = math.log(gaps["defaults"] / gaps["matched"]) / math.log(gaps["defaults"])
            assert row["removed_fraction"] == f"{phi:.4f}"
        else:
            assert row["removed_fraction"] == ""
    # The fixture's one guarded row, and the throughput row's orientation (SGLang faster: R > 1).
    assert rows[0]["removed_fraction"] == ""
    assert float(rows[6]["defaults_gap"]) == pytest.approx(
        sps.gmean([1000 / 950, 1020 / 960, 990 / 955]), abs=1e-4
    )


def test_table4_sglang_across_deployments(full: list[Path], tmp_path: Path) -> None:
    rows = _rows(write_table(4, full, tmp_path / "table4.csv"))
    assert list(rows[0]) == ["condition", "metric", "first", "second", "change_pct", "p"]
    assert [r["metric"] for r in rows[:3]] == ["ttft_p50", "ttft_p95", "e2e_p50"]
    first = np.array(P50[("defaults", "sglang", "rate-0.28")])
    second = np.array(P50[("matched", "sglang", "rate-0.28")])
    row = rows[3]
    assert (row["condition"], row["metric"]) == ("rate-0.28", "ttft_p50")
    assert row["first"] == f"{sps.gmean(first):.4f}"
    assert row["second"] == f"{sps.gmean(second):.4f}"
    assert row["change_pct"] == f"{(sps.gmean(second) / sps.gmean(first) - 1) * 100:.2f}"
    assert row["p"] == f"{sps.ttest_rel(np.log(second), np.log(first)).pvalue:.4g}"
    # E2E p50: TTFT + one 0.1 s token gap.
    e2e = rows[5]
    assert e2e["first"] == f"{sps.gmean(first + 0.1):.4f}"


def test_table6_pooled_dispersion(full: list[Path], tmp_path: Path) -> None:
    rows = _rows(write_table(6, full, tmp_path / "table6.csv"))
    assert list(rows[0]) == [
        "condition",
        "configuration",
        "vllm_tail_ratio",
        "vllm_g1",
        "sglang_tail_ratio",
        "sglang_g1",
    ]
    assert [(r["condition"], r["configuration"]) for r in rows] == [
        (c, a) for c in CONDS for a in ("defaults", "matched")
    ]
    pooled = np.concatenate([_ttfts(v) for v in P50[("matched", "vllm", "length-8192")]])
    row = rows[5]
    tail = np.percentile(pooled, 95) / np.percentile(pooled, 50)
    assert row["vllm_tail_ratio"] == f"{tail:.3f}"
    assert row["vllm_g1"] == f"{sps.skew(np.log(pooled), bias=True):+.3f}"


def test_table3_workload_realisation(full: list[Path], tmp_path: Path) -> None:
    rows = {r["group"]: r for r in _rows(write_table(3, full, tmp_path / "table3.csv"))}
    assert list(rows) == ["rate", "sharing", "length", "matched", "total"]
    assert rows["rate"]["runs"] == "12" and rows["rate"]["requests_total"] == str(12 * N)
    assert rows["length"]["runs"] == "6"
    assert rows["matched"]["runs"] == "18"
    assert rows["total"]["runs"] == "36"
    assert rows["total"]["requests_mean"] == f"{N:.1f}"
    assert rows["total"]["requests_std"] == "0.0"
    assert rows["total"]["lowest_success_pct"] == "100.00"
    # No sharing-sweep runs: counted as zero, statistics left empty.
    assert rows["sharing"]["runs"] == "0" and rows["sharing"]["requests_mean"] == ""


def test_missing_repetitions_are_computed_from_what_is_there_and_listed(tmp_path: Path) -> None:
    failed = frozenset({"defaults/vllm/rate-0.28/rep3"})
    absent = frozenset(
        f"matched/{e}/length-8192/{r}" for e in ("vllm", "sglang") for r in ("rep2", "rep3")
    )
    dirs = _build(tmp_path, failed=failed, absent=absent)
    rows = _rows(write_table(5, dirs, tmp_path / "table5.csv"))
    # rate-0.28 defaults from reps 1 and 2 only.
    v = [P50[("defaults", "vllm", "rate-0.28")][i] for i in (0, 1)]
    s = [P50[("defaults", "sglang", "rate-0.28")][i] for i in (0, 1)]
    assert rows[2]["defaults_gap"] == f"{_expected_gap(v, s)['gap']:.5g}"
    assert rows[2]["defaults_p"] == f"{_expected_gap(v, s)['p']:.4g}"
    # length-8192 matched: one pair gives a gap but no interval or p-value.
    r = rows[4]
    gap = P50[("matched", "vllm", "length-8192")][0] / P50[("matched", "sglang", "length-8192")][0]
    assert r["matched_gap"] == f"{gap:.5g}"
    assert (r["matched_ci_low"], r["matched_ci_high"], r["matched_p"]) == ("", "", "")
    assert r["removed_fraction"] != ""

    numbers_path = tmp_path / "numbers.json"
    notes_path = tmp_path / "notes.txt"
    write_numbers(dirs, numbers_path, notes_path=notes_path)
    numbers = json.loads(numbers_path.read_text())
    assert numbers["runs"]["found"] == 32 and numbers["runs"]["skipped"] == 1
    assert numbers["runs"]["skipped_runs"][0]["run_id"] == "defaults/vllm/rate-0.28/rep3"
    t5 = numbers["tables"]["table5"]
    assert t5[2]["defaults_n"] == 2 and t5[4]["matched_n"] == 1 and t5[0]["defaults_n"] == 3
    assert numbers["gaps"]["defaults/rate-0.28/ttft_p50"]["reps"] == ["rep1", "rep2"]
    notes = notes_path.read_text()
    assert "run logs: 32 found, 31 parsed, 1 skipped" in notes
    assert (
        "gap defaults/rate-0.28/ttft_p50: computed from 2 of 3 repetitions; missing rep3 "
        "(defaults/vllm/rate-0.28/rep3 skipped (run.json status 'failed'))"
    ) in notes


def _with_matched_sglang_chunking_at_8192(full: list[Path], odd: Path) -> list[Path]:
    """The grid with matched SGLang at rate-0.12 run under another chunk size than its defaults."""
    dirs = [d for d in full if "/matched/sglang/rate-0.12/" not in d.as_posix() + "/"]
    for rep, p50 in zip(REPS, P50[("matched", "sglang", "rate-0.12")], strict=True):
        spec = _spec("matched", "sglang", "rate-0.12", rep)
        spec = RunSpec(**{**spec.__dict__, "chunk_size": 8192})
        dirs.append(write_simple_run(odd / rep, spec, _ttfts(p50)))
    return dirs


def test_table4_refuses_sglang_with_two_configurations(full: list[Path], tmp_path: Path) -> None:
    dirs = _with_matched_sglang_chunking_at_8192(full, tmp_path / "odd")
    with pytest.raises(Exception, match="Table 4 compares SGLang under one configuration"):
        write_table(4, dirs, tmp_path / "t4.csv")


def test_table4_compares_two_configurations_when_the_control_differs_by_design(
    full: list[Path], tmp_path: Path
) -> None:
    """analysis.control_differs (an ablation that changes the control engine in one arm): Table 4
    is computed, and a note names both configurations."""
    dirs = _with_matched_sglang_chunking_at_8192(full, tmp_path / "odd")
    settings = AnalysisSettings(control_differs=True)
    write_table(4, dirs, tmp_path / "t4.csv", settings=settings)
    rows = {(r["condition"], r["metric"]): r for r in csv.DictReader((tmp_path / "t4.csv").open())}
    first, second = (
        P50[("defaults", "sglang", "rate-0.12")],
        P50[("matched", "sglang", "rate-0.12")],
    )
    expected = math.exp(np.mean(np.log(second)) - np.mean(np.log(first)))
    assert float(rows[("rate-0.12", "ttft_p50")]["change_pct"]) == pytest.approx(
        (expected - 1) * 100, abs=0.01
    )
    an = build_analysis(dirs, settings=settings)
    an.table4_rows()
    notes = an.notes()
    assert any("configuration differs between the arms by design" in n for n in notes)
    # The settings' mapping names the key only when it is set: the study's params are unchanged.
    assert "control_differs" not in AnalysisSettings().as_dict()
    assert settings.as_dict()["control_differs"] is True
    assert AnalysisSettings.from_mapping(settings.as_dict()) == settings


def test_numbers_hold_role_and_variability_values(full: list[Path]) -> None:
    an = build_analysis(full)
    g = an.group("matched", "vllm", "length-8192")
    assert g.summaries["ttft_p50"].sd_log == pytest.approx(np.std(np.log([3.2, 9.8, 1.3]), ddof=1))
    roles = g.roles
    assert roles["planner"]["n"] + roles["worker"]["n"] + roles["aggregator"]["n"] == 3 * N


def test_cells_without_any_run_are_empty_and_explained(full: list[Path], tmp_path: Path) -> None:
    dirs = [d for d in full if "/matched/" not in d.as_posix() or "rate-0.12" not in d.as_posix()]
    an = build_analysis(dirs)
    rows = _rows(write_table(5, an, tmp_path / "table5.csv"))
    assert (rows[0]["matched_gap"], rows[0]["removed_fraction"]) == ("", "")
    assert rows[0]["defaults_gap"] != ""
    t6 = _rows(write_table(6, an, tmp_path / "table6.csv"))
    assert (t6[1]["vllm_tail_ratio"], t6[1]["sglang_g1"]) == ("", "")
    notes = an.notes()
    assert "table5 rate-0.12/ttft_p50 matched: left empty, no seed-paired matched runs" in notes
    assert "table6 rate-0.12/matched vllm: left empty, no vllm runs" in notes


def test_an_unknown_table_number_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no table 7: the study's tables are 3, 4, 5 and 6"):
        write_table(7, [], tmp_path / "table7.csv")
    assert not (tmp_path / "table7.csv").exists()
