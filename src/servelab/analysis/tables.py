"""Tables 3-6 as CSV with fixed columns and fixed number formatting (byte-identical output).

Ratios and their intervals use five significant digits (`.5g`): with three repetitions an interval
can span several orders of magnitude, and a fixed number of decimals would print a lower bound of
3e-05 as 0.0000.

Empty cells are quantities that cannot be computed from the runs available (docs/analysis.md):
no paired repetition, fewer than two repetitions for an interval or a p-value, or φ below its
guard. The number of repetitions behind every cell is in numbers.json.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Mapping, Sequence

from servelab.analysis.summary import Analysis
from servelab.artifacts import write_text

__all__ = [
    "TABLE3_COLUMNS",
    "TABLE4_COLUMNS",
    "TABLE5_ARM_EFFECT_COLUMNS",
    "TABLE5_ARM_EFFECT_HOLM_COLUMNS",
    "TABLE5_COLUMNS",
    "TABLE5_HOLM_COLUMNS",
    "TABLE6_COLUMNS",
    "format_table",
    "render_table3",
    "render_table4",
    "render_table5",
    "render_table6",
    "table5_columns",
    "table6_columns",
]

TABLE3_COLUMNS = {
    "group": "s",
    "runs": "d",
    "requests_mean": ".1f",
    "requests_median": ".1f",
    "requests_std": ".1f",
    "requests_min": "d",
    "requests_max": "d",
    "requests_total": "d",
    "lowest_success_pct": ".2f",
}
TABLE4_COLUMNS = {
    "condition": "s",
    "metric": "s",
    "first": ".4f",
    "second": ".4f",
    "change_pct": ".2f",
    "p": ".4g",
}
TABLE5_COLUMNS = {
    "condition": "s",
    "metric": "s",
    "defaults_gap": ".5g",
    "defaults_ci_low": ".5g",
    "defaults_ci_high": ".5g",
    "defaults_p": ".4g",
    "matched_gap": ".5g",
    "matched_ci_low": ".5g",
    "matched_ci_high": ".5g",
    "matched_p": ".4g",
    "removed_fraction": ".4f",
}
# One-engine campaigns: Table 5 is the arm effect, matched ÷ defaults (docs/analysis.md).
TABLE5_ARM_EFFECT_COLUMNS = {
    "condition": "s",
    "metric": "s",
    "engine": "s",
    "defaults": ".5g",
    "matched": ".5g",
    "change": ".5g",
    "ci_low": ".5g",
    "ci_high": ".5g",
    "p": ".4g",
    "n": "d",
}

# With `analysis.multiplicity: holm`, Table 5 also carries the Holm-adjusted p-values its stars are
# read from, after the columns above (with the default, none, the table is the study's, unchanged).
TABLE5_HOLM_COLUMNS = {"defaults_p_holm": ".4g", "matched_p_holm": ".4g"}
TABLE5_ARM_EFFECT_HOLM_COLUMNS = {"p_holm": ".4g"}


def table5_columns(engines: Sequence[str], multiplicity: str = "none") -> dict[str, str]:
    """Table 5's columns: the engine gap's (two engines) or the arm effect's (one), then the
    Holm-adjusted p-values when `multiplicity` is holm."""
    one = len(engines) == 1
    columns = dict(TABLE5_ARM_EFFECT_COLUMNS if one else TABLE5_COLUMNS)
    if multiplicity == "holm":
        columns.update(TABLE5_ARM_EFFECT_HOLM_COLUMNS if one else TABLE5_HOLM_COLUMNS)
    return columns


def table6_columns(engines: Sequence[str]) -> dict[str, str]:
    """Table 6's columns: each engine's tail ratio and g1 (the study's: vllm, then sglang)."""
    columns = {"condition": "s", "configuration": "s"}
    for engine in engines:
        columns[f"{engine}_tail_ratio"] = ".3f"
        columns[f"{engine}_g1"] = "+.3f"
    return columns


TABLE6_COLUMNS = table6_columns(("vllm", "sglang"))


def _cell(value: object, fmt: str) -> str:
    if fmt == "s":
        return str(value)
    if value is None:
        return ""
    x = float(value)  # type: ignore[arg-type]
    if not math.isfinite(x):
        return ""
    if fmt == "d":
        return str(round(x))
    out = format(x, fmt)
    return "0" + out[2:] if out.startswith("-0") and float(out) == 0 else out


def format_table(rows: Sequence[Mapping[str, object]], columns: Mapping[str, str]) -> str:
    """CSV text: header then one line per row, `\\n` line ends, cells formatted per `columns`."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(list(columns))
    for row in rows:
        writer.writerow([_cell(row[c], f) for c, f in columns.items()])
    return buf.getvalue()


def render_table3(an: Analysis) -> str:
    return format_table(an.table3_rows(), TABLE3_COLUMNS)


def render_table4(an: Analysis) -> str:
    return format_table(an.table4_rows(), TABLE4_COLUMNS)


def render_table5(an: Analysis) -> str:
    return format_table(an.table5_rows(), table5_columns(an.engines, an.multiplicity))


def render_table6(an: Analysis) -> str:
    return format_table(an.table6_rows(), table6_columns(an.engines))


def write_csv(path: str | os.PathLike[str], text: str) -> None:
    write_text(path, text)
