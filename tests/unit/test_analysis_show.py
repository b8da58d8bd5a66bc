"""`servelab table show`: Table 5 read from its CSV and printed as the study prints it.

The golden file holds the exact text for a hand-made two-row CSV; regenerate it with
`UPDATE_GOLDENS=1 pytest tests/unit/test_analysis_show.py` and review the difference.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from servelab import cli
from servelab.analysis import show
from servelab.analysis.tables import TABLE5_COLUMNS

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "table5_show.txt"

# Row 1: every cell present, p-values on both sides of the star thresholds. Row 2: the cells a
# short campaign leaves empty (no interval, no p-value, no φ) and one written as NaN.
ROWS = (
    {
        "condition": "rate-0.28",
        "metric": "ttft_p50",
        "defaults_gap": "31.417",
        "defaults_ci_low": "5.4222e-06",
        "defaults_ci_high": "5.3589e+06",
        "defaults_p": "0.0009",
        "matched_gap": "1.4996",
        "matched_ci_low": "0.99871",
        "matched_ci_high": "2.2517",
        "matched_p": "0.049",
        "removed_fraction": "0.8822",
    },
    {
        "condition": "length-8192",
        "metric": "throughput",
        "defaults_gap": "1.0502",
        "defaults_ci_low": "",
        "defaults_ci_high": "",
        "defaults_p": "",
        "matched_gap": "0.97632",
        "matched_ci_low": "nan",
        "matched_ci_high": "NaN",
        "matched_p": "0.2",
        "removed_fraction": "",
    },
)


def write_csv(path: Path, rows: tuple[dict[str, str], ...], columns: list[str]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture
def table5_csv(tmp_path: Path) -> Path:
    return write_csv(tmp_path / "table5.csv", ROWS, list(TABLE5_COLUMNS))


def test_table5_text_matches_the_golden_file(table5_csv: Path) -> None:
    rows = show.read_table(table5_csv, tuple(TABLE5_COLUMNS))
    text = show.format_table5(rows, "table5.csv", engines=["vllm", "sglang"])
    if os.environ.get("UPDATE_GOLDENS"):
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")


def test_every_table_line_is_as_wide_as_its_header(table5_csv: Path) -> None:
    """Fixed width: the rule under the header is as wide as each row, padded cells included;
    the bar of R̄ (a combining mark) takes no column of its own."""
    lines = show.show_table(table5_csv).splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("---"))
    widths = {show._width(line) for line in lines[rule - 1 : rule + 1 + len(ROWS)]}
    assert widths == {show._width(lines[rule])}


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (0.049, "*"),
        (0.0099, "**"),
        (0.0009, "***"),
        (0.0, "***"),  # all repetitions' differences equal: scipy returns p = 0
        (0.05, ""),  # strictly below the threshold, as the study states it
        (0.2, ""),
        (None, ""),
    ],
)
def test_significance_stars_follow_the_study_thresholds(p: float | None, expected: str) -> None:
    assert show.stars(p) == expected


def test_the_legend_states_the_star_convention(table5_csv: Path) -> None:
    text = show.show_table(table5_csv)
    assert "* p < 0.05, ** p < 0.01, *** p < 0.001" in text


def test_empty_and_nan_cells_are_a_dash(table5_csv: Path) -> None:
    row = show.show_table(table5_csv).splitlines()
    line = next(line for line in row if line.startswith("length-8192"))
    # no defaults interval, no matched interval (NaN bounds), no φ: three dashes
    assert line.split().count(show.DASH) == 3
    assert "nan" not in line.lower()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.4996, "1.50"),  # trailing zero kept: three significant digits
        (31.417, "31.4"),
        (0.97632, "0.976"),
        (9.996, "10.0"),  # rounding carries into a new digit
        (999.6, "1.00e+03"),
        (0.010978, "0.0110"),
        (5.4222e-06, "5.42e-06"),
        (5.3589e06, "5.36e+06"),
        (0.0, "0"),
        (None, show.DASH),
    ],
)
def test_numbers_are_shown_with_three_significant_digits(
    value: float | None, expected: str
) -> None:
    assert show.significant(value) == expected


def test_a_cell_that_is_not_a_number_is_an_error_naming_file_line_and_column(
    tmp_path: Path,
) -> None:
    bad = dict(ROWS[0], matched_gap="1.2x")
    path = write_csv(tmp_path / "table5.csv", (ROWS[0], bad), list(TABLE5_COLUMNS))
    with pytest.raises(show.TableError, match=r"table5\.csv, line 3: column 'matched_gap'"):
        show.show_table(path)


def test_cli_prints_the_table_and_exits_0(table5_csv: Path, capsys) -> None:
    assert cli.main(["table", "show", str(table5_csv)]) == 0
    out = capsys.readouterr().out
    assert out == show.show_table(table5_csv)
    assert out.startswith("Table 5.")


def test_cli_names_a_missing_file_and_exits_2(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "results" / "table5.csv"
    assert cli.main(["table", "show", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"servelab table: error: {missing}: no such file" in captured.err


def test_cli_names_the_file_and_the_missing_column_and_exits_2(tmp_path: Path, capsys) -> None:
    columns = [c for c in TABLE5_COLUMNS if c != "matched_p"]
    path = write_csv(tmp_path / "table4.csv", ROWS, columns)
    assert cli.main(["table", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: no column 'matched_p'" in err


def test_a_line_shorter_than_the_header_is_an_error_not_dashes(tmp_path: Path) -> None:
    path = tmp_path / "table5.csv"
    path.write_text(",".join(TABLE5_COLUMNS) + "\nrate-0.28,ttft_p50,31.4\n", encoding="utf-8")
    with pytest.raises(show.TableError, match=r"line 2: no cell for column 'defaults_ci_low'"):
        show.show_table(path)


def _numbers_beside(table: Path, engines: list[str]) -> None:
    (table.parent / "numbers.json").write_text(json.dumps({"engines": engines}))


@pytest.mark.parametrize(
    ("engines", "gap", "favours"),
    [
        (["vllm", "sglang"], "vLLM ÷ SGLang (latency)", "R̄ > 1 favours SGLang."),
        (["vllm_v1", "llamacpp"], "vLLM V1 ÷ llama.cpp (latency)", "R̄ > 1 favours llama.cpp."),
        (["llamacpp", "vllm_v1"], "llama.cpp ÷ vLLM V1 (latency)", "R̄ > 1 favours vLLM V1."),
    ],
)
def test_the_legend_names_the_campaigns_engines_in_gap_order(
    table5_csv: Path, engines: list[str], gap: str, favours: str
) -> None:
    """From numbers.json beside the table (the analysis writes both): its `engines`."""
    _numbers_beside(table5_csv, engines)
    text = show.show_table(table5_csv)
    assert gap in text and favours in text


def test_without_numbers_json_the_legend_names_no_engine(table5_csv: Path) -> None:
    text = show.show_table(table5_csv)
    assert "the first engine ÷ the second" in text
    assert "vLLM" not in text and "SGLang" not in text


def test_without_numbers_json_the_engines_are_those_whose_runs_lie_beside_it(
    table5_csv: Path,
) -> None:
    """`snakemake results/table5.csv` writes no numbers.json: the run folders name the engines,
    in registry order (the analysis's gap order)."""
    for arm, engine in (("defaults", "llamacpp"), ("matched", "vllm_v1"), ("defaults", "vllm_v1")):
        (table5_csv.parent / "runs" / arm / engine).mkdir(parents=True, exist_ok=True)
    assert "vLLM V1 ÷ llama.cpp (latency)" in show.show_table(table5_csv)


def test_a_table_with_holm_columns_is_starred_by_them_and_says_so(tmp_path: Path) -> None:
    """With analysis.multiplicity: holm the analysis appends *_p_holm: the stars are read from
    those, and the legend names the rule (and, from numbers.json, how many tests it counted)."""
    rows = (dict(ROWS[0], defaults_p_holm="0.02", matched_p_holm="0.3"), dict(ROWS[1]))
    rows[1].update(defaults_p_holm="", matched_p_holm="0.9")
    columns = [*TABLE5_COLUMNS, "defaults_p_holm", "matched_p_holm"]
    path = write_csv(tmp_path / "table5.csv", rows, columns)
    text = show.show_table(path)
    line = next(x for x in text.splitlines() if x.startswith("rate-0.28"))
    assert "31.4* " in line  # raw p 0.0009 (***), Holm 0.02 (*)
    assert "1.50 " in line and "1.50*" not in line  # raw 0.049 (*), Holm 0.3
    assert "p Holm-adjusted (Holm 1979) over the campaign's paired tests" in text
    assert "not corrected" not in text
    (tmp_path / "numbers.json").write_text(
        json.dumps({"engines": ["vllm", "sglang"], "multiplicity": {"rule": "holm", "tests": 64}})
    )
    assert "over the campaign's 64 paired tests (multiplicity: holm)" in show.show_table(path)


def test_without_holm_columns_the_legend_says_no_correction(table5_csv: Path) -> None:
    assert "not corrected for multiple tests (multiplicity: none)" in show.show_table(table5_csv)
