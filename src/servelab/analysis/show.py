"""Table 5 as the study prints it: a fixed-width text table read from `table5.csv`.

Display only: every number comes from the CSV (docs/analysis.md, Outputs), rounded for reading;
nothing is recomputed. Gaps and interval bounds are shown with three significant digits, φ as a
percentage, p-values as significance stars (the study's convention: *, **, *** for p < 0.05,
0.01, 0.001). Stars are read from each test's own p-value, or, when the table carries the
Holm-adjusted p-values (`*_p_holm`, config `analysis.multiplicity: holm`), from those; the legend
says which. An empty or NaN cell, a quantity the runs could not give, is a dash.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from servelab.analysis.tables import TABLE5_ARM_EFFECT_COLUMNS, TABLE5_COLUMNS
from servelab.engines.registry import engine_names, engine_spec

__all__ = [
    "DASH",
    "TableError",
    "fixed_width",
    "format_arm_effect",
    "format_table5",
    "metric_label",
    "read_table",
    "register",
    "show_table",
    "significant",
    "stars",
]

DASH = "–"
# The study's significance convention, strictest first: (threshold, stars) for p < threshold.
STAR_THRESHOLDS = ((0.001, "***"), (0.01, "**"), (0.05, "*"))
SIGNIFICANT_DIGITS = 3
# Outside 0.01 .. 999 a number is shown in scientific notation: three-repetition intervals can
# reach 1e-6 .. 1e6, which fixed decimals would print as 0.00 or as 52000 (five digits, three true).
FIXED_EXPONENTS = range(-2, 3)

# Broken by hand (at most 100 columns) so that no formula is split across lines.
TITLE = (
    "Table 5. The decomposition: engine gap R̄ under vendor defaults and with chunked prefill",
    "matched, and the fraction φ of the gap that matching removed.",
)
# The engines' names come from numbers.json beside the table (its `engines`, in gap order);
# without it, the legend names them by position.
GAP_LEGEND = (
    "R̄: geometric mean over seed-paired repetitions of {first} ÷ {second} (latency) or",
    "  {second} ÷ {first} (throughput); R̄ > 1 favours {second}.",
)
LEGEND = (
    "95% interval: exp(mean ln R ± t₀.₉₇₅,ₙ₋₁ · s/√n).",
    "φ: removed fraction ln(R̄_def / R̄_mat) / ln R̄_def; above 100%, matching reversed the gap.",
    f"{DASH}: not computable from the runs: an interval or p-value needs two paired repetitions,",
    "  φ needs |ln R̄_def| above the φ guard (analysis_notes.txt says which cells and why).",
)


class TableError(ValueError):
    """A table file that cannot be shown: missing, or without the columns the view reads."""


# ------------------------------------------------------------------------------------ cells
def _number(row: Mapping[str, str | None], column: str, where: str) -> float | None:
    """The cell as a float; None for an empty or NaN cell (a quantity the runs could not give)."""
    text = (row[column] or "").strip()
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise TableError(f"{where}: column {column!r} holds {text!r}, not a number") from None
    return value if math.isfinite(value) else None


def significant(value: float | None, digits: int = SIGNIFICANT_DIGITS) -> str:
    """`value` rounded to `digits` significant digits, trailing zeros kept (1.50, 0.610)."""
    if value is None:
        return DASH
    if value == 0:
        return "0"
    rounded = float(f"{value:.{digits - 1}e}")  # rounding first: 9.996 becomes 10.0, not 10.00
    exponent = math.floor(math.log10(abs(rounded)))
    if exponent not in FIXED_EXPONENTS:
        return f"{rounded:.{digits - 1}e}"
    return f"{rounded:.{max(digits - 1 - exponent, 0)}f}"


def stars(p: float | None) -> str:
    """Significance stars for a p-value: * p < 0.05, ** p < 0.01, *** p < 0.001; else none."""
    if p is None:
        return ""
    return next((mark for threshold, mark in STAR_THRESHOLDS if p < threshold), "")


def interval(low: float | None, high: float | None) -> str:
    if low is None and high is None:
        return DASH
    return f"[{significant(low)}, {significant(high)}]"


def percent(fraction: float | None) -> str:
    return DASH if fraction is None else f"{fraction * 100:.0f}%"


def metric_label(metric: str) -> str:
    """`ttft_p95` -> `TTFT p95`; a metric without a percentile suffix is shown as named."""
    name, _, suffix = metric.rpartition("_")
    if name and suffix[:1] == "p" and suffix[1:].isdigit():
        return f"{name.upper()} {suffix}"
    return metric


# ------------------------------------------------------------------------------------ layout
def _width(text: str) -> int:
    """Terminal columns: a combining mark (the bar of R̄) takes none."""
    return sum(0 if unicodedata.combining(ch) else 1 for ch in text)


@dataclass(frozen=True)
class Column:
    header: str
    align: Literal["<", ">"]


def _pad(text: str, width: int, align: Literal["<", ">"]) -> str:
    fill = " " * (width - _width(text))
    return fill + text if align == ">" else text + fill


def fixed_width(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    groups: Sequence[tuple[str, int]] = (),
) -> list[str]:
    """Lines of a text table: optional group headers spanning columns, headers, a rule, rows.

    `groups` is (label, number of columns spanned) from the left; "" spans without a label.
    """
    gap = "  "
    widths = [max([_width(c.header), *(_width(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    lines: list[str] = []
    if groups:
        spans, start = [], 0
        for label, span in groups:
            width = sum(widths[start : start + span]) + len(gap) * (span - 1)
            spans.append(_pad(label, width, "<"))
            start += span
        lines.append(gap.join(spans).rstrip())
    lines.append(
        gap.join(_pad(c.header, w, c.align) for c, w in zip(columns, widths, strict=True)).rstrip()
    )
    lines.append(gap.join("-" * w for w in widths))
    for row in rows:
        cells = (_pad(text, w, c.align) for text, c, w in zip(row, columns, widths, strict=True))
        lines.append(gap.join(cells).rstrip())
    return lines


# ------------------------------------------------------------------------------------ Table 5
# A gap carries its stars in a field as wide as the most stars, so that gaps stay right-aligned.
STARS_WIDTH = max(len(mark) for _, mark in STAR_THRESHOLDS)
GAP_HEADER = "R̄" + " " * STARS_WIDTH
TABLE5_LAYOUT = (
    Column("condition", "<"),
    Column("metric", "<"),
    Column(GAP_HEADER, ">"),
    Column("95% interval", "<"),
    Column(GAP_HEADER, ">"),
    Column("95% interval", "<"),
    Column("φ", ">"),
)
TABLE5_GROUPS = (("", 2), ("vendor defaults", 2), ("chunked prefill matched", 2), ("", 1))


def _table5_cells(row: Mapping[str, str | None], where: str, holm: bool = False) -> list[str]:
    short = [column for column, text in row.items() if text is None]
    if short:  # csv.DictReader fills the cells a short line lacks with None
        raise TableError(f"{where}: no cell for column {short[0]!r} (fewer cells than the header)")
    cells = [str(row["condition"]), metric_label(str(row["metric"]))]
    for arm in ("defaults", "matched"):
        star_p = "p_holm" if holm else "p"
        values = {
            part: _number(row, f"{arm}_{part}", where)
            for part in ("gap", "ci_low", "ci_high", star_p)
        }
        cells += [
            significant(values["gap"]) + stars(values[star_p]).ljust(STARS_WIDTH),
            interval(values["ci_low"], values["ci_high"]),
        ]
    cells.append(percent(_number(row, "removed_fraction", where)))
    return cells


def gap_legend(engines: Sequence[str] | None) -> tuple[str, ...]:
    """The legend's first lines: the gap's direction, by the engines' names (registry titles)
    when known, else by position in the campaign's `engines` (numbers.json names them)."""
    if engines is not None and len(engines) == 2:
        first, second = (engine_spec(e).title if e in engine_names() else e for e in engines)
        return tuple(line.format(first=first, second=second) for line in GAP_LEGEND)
    return (
        "R̄: geometric mean over seed-paired repetitions of the first engine ÷ the second",
        "  (latency) or the second ÷ the first (throughput), in the campaign's `engines` order;",
        "  R̄ > 1 favours the second. numbers.json beside the table names them.",
    )


STAR_CONVENTION = "* p < 0.05, ** p < 0.01, *** p < 0.001"


def star_legend(holm: bool, tests: int | None = None) -> tuple[str, ...]:
    """The legend's lines on the stars, naming the rule they were read under: each test's own
    p-value (config `analysis.multiplicity: none`, the study's), or its Holm-adjusted p-value
    (`holm`: the table's *_p_holm columns) over the campaign's `tests` paired tests."""
    if not holm:
        return (
            f"Stars: two-sided paired t-test on log values, {STAR_CONVENTION}.",
            "  Each test's own p-value, not corrected for multiple tests (multiplicity: none).",
        )
    family = f"the campaign's {tests} paired tests" if tests else "the campaign's paired tests"
    return (
        f"Stars: two-sided paired t-test on log values, {STAR_CONVENTION},",
        f"  p Holm-adjusted (Holm 1979) over {family} (multiplicity: holm).",
    )


def format_table5(
    rows: Sequence[Mapping[str, str | None]],
    source: str,
    engines: Sequence[str] | None = None,
    *,
    holm_tests: int | None = None,
) -> str:
    """Table 5 as text: title, the fixed-width table, its legend (naming `engines`, the gap's
    numerator first, when given; the star rule: Holm's when the rows carry the *_p_holm
    columns, over `holm_tests` tests when known) and the file it was read from."""
    holm = bool(rows) and all(f"{arm}_p_holm" in rows[0] for arm in ("defaults", "matched"))
    body = [_table5_cells(row, f"{source}, line {i}", holm) for i, row in enumerate(rows, start=2)]
    table = fixed_width(TABLE5_LAYOUT, body, TABLE5_GROUPS)
    legend = [*gap_legend(engines), LEGEND[0], *star_legend(holm, holm_tests), *LEGEND[1:]]
    lines = [*TITLE, "", *table, "", *legend, f"Read from {source}."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- Table 5 of one engine
ARM_EFFECT_TITLE = (
    "Table 5 (one engine). The arm effect: each metric with chunked prefill matched against",
    "vendor defaults, on the same seeded traces, and their ratio.",
)
ARM_EFFECT_LEGEND = (
    "defaults, matched: geometric means over the repetitions measured in both arms",
    "  (seconds for TTFT, requests/s for throughput).",
    "change: geometric mean over seed-paired repetitions of matched ÷ defaults.",
    "95% interval: exp(mean ln R ± t₀.₉₇₅,ₙ₋₁ · s/√n); n: paired repetitions.",
    f"{DASH}: not computable from the runs: an interval or p-value needs two paired repetitions.",
)
ARM_EFFECT_LAYOUT = (
    Column("condition", "<"),
    Column("metric", "<"),
    Column("engine", "<"),
    Column("defaults", ">"),
    Column("matched", ">"),
    Column("change" + " " * STARS_WIDTH, ">"),
    Column("95% interval", "<"),
    Column("n", ">"),
)


def _arm_effect_cells(row: Mapping[str, str | None], where: str, holm: bool) -> list[str]:
    short = [column for column, text in row.items() if text is None]
    if short:
        raise TableError(f"{where}: no cell for column {short[0]!r} (fewer cells than the header)")
    change = _number(row, "change", where)
    return [
        str(row["condition"]),
        metric_label(str(row["metric"])),
        str(row["engine"]),
        significant(_number(row, "defaults", where)),
        significant(_number(row, "matched", where)),
        significant(change)
        + stars(_number(row, "p_holm" if holm else "p", where)).ljust(STARS_WIDTH),
        interval(_number(row, "ci_low", where), _number(row, "ci_high", where)),
        str(row["n"] or DASH),
    ]


def format_arm_effect(
    rows: Sequence[Mapping[str, str | None]], source: str, *, holm_tests: int | None = None
) -> str:
    """A one-engine Table 5 as text: title, table, legend (the star rule: Holm's when the rows
    carry the p_holm column) and source."""
    holm = bool(rows) and "p_holm" in rows[0]
    body = [
        _arm_effect_cells(row, f"{source}, line {i}", holm) for i, row in enumerate(rows, start=2)
    ]
    table = fixed_width(ARM_EFFECT_LAYOUT, body, (("", 3), ("", 2), ("matched ÷ defaults", 3)))
    legend = [*ARM_EFFECT_LEGEND[:4], *star_legend(holm, holm_tests), *ARM_EFFECT_LEGEND[4:]]
    lines = [*ARM_EFFECT_TITLE, "", *table, "", *legend, f"Read from {source}."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ files
def read_table(path: Path, columns: Sequence[str]) -> list[dict[str, str | None]]:
    """The CSV's rows; a TableError naming the file (and the column) if it cannot be shown."""
    if not path.is_file():
        raise TableError(
            f"{path}: no such file (Table 5 is made by: snakemake --cores 1 results/table5.csv)"
        )
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header]
        if missing:
            found = ", ".join(header) if header else "no header"
            raise TableError(
                f"{path}: no column {missing[0]!r} (missing: {', '.join(missing)}; "
                f"found: {found}); `servelab table show` reads Table 5 (table5.csv)"
            )
        return list(reader)


def show_table(path: Path) -> str:
    """Table 5 read from `path`, formatted for a terminal: the engine gap, or (a one-engine
    campaign's table, recognised by its `engine` column) the arm effect."""
    tests = _holm_tests(path)
    if _header(path)[:3] == list(TABLE5_ARM_EFFECT_COLUMNS)[:3]:
        return format_arm_effect(
            read_table(path, tuple(TABLE5_ARM_EFFECT_COLUMNS)), str(path), holm_tests=tests
        )
    return format_table5(
        read_table(path, tuple(TABLE5_COLUMNS)),
        str(path),
        engines=_campaign_engines(path),
        holm_tests=tests,
    )


def _numbers(table: Path) -> dict[str, Any] | None:
    """numbers.json beside the table, if the analysis wrote one there (else None)."""
    try:
        numbers = json.loads((table.parent / "numbers.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return numbers if isinstance(numbers, dict) else None


def _holm_tests(table: Path) -> int | None:
    """How many tests Holm's correction counted: numbers.json's `multiplicity.tests`, if any."""
    entry = (_numbers(table) or {}).get("multiplicity")
    tests = entry.get("tests") if isinstance(entry, dict) else None
    return tests if isinstance(tests, int) else None


def _campaign_engines(table: Path) -> list[str] | None:
    """The engines in gap order: numbers.json's `engines` beside the table when the analysis
    wrote it; else the engines whose runs lie beside it (`runs/{arm}/{engine}/`), in registry
    order, as the analysis orders them (`servelab.grid.config.analysis_settings`)."""
    numbers = _numbers(table)
    engines = numbers.get("engines") if numbers is not None else None
    if isinstance(engines, list):
        return [str(e) for e in engines]
    present = {p.name for p in (table.parent / "runs").glob("*/*") if p.is_dir()}
    ordered = [e for e in engine_names() if e in present]
    return ordered or None


def _header(path: Path) -> list[str]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        return next(csv.reader(handle), [])


# ------------------------------------------------------------------------------------ CLI
def register(subparsers: Any) -> None:
    table = subparsers.add_parser(
        "table",
        help="print a results table as the study prints it",
        description="Print a results table as the study prints it (Table 5 for now).",
    )
    actions = table.add_subparsers(dest="action", required=True)
    show = actions.add_parser(
        "show",
        help="Table 5 from table5.csv: gaps, 95%% intervals, significance stars, φ",
        description=(
            "Print Table 5 read from CSV (results/table5.csv): per row the condition and "
            "metric, the engine gap R̄ with its 95% interval and significance stars under "
            "vendor defaults and with chunked prefill matched, and the removed fraction φ. "
            "Nothing is recomputed."
        ),
    )
    show.add_argument("csv", type=Path, help="a table5.csv, e.g. results/table5.csv")
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    print(show_table(args.csv), end="")
    return 0
