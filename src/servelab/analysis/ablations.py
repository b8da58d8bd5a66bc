"""results/ablations/summary.csv: every ablation's Table 5 beside the study's (docs/ablations.md).

Reads analysis outputs only (each campaign's table5.csv, as written): the rows of each table,
unchanged, after two columns naming where they come from, `ablation` (`study` for the configured
grid's own) and `variant` (empty for an ablation without variants). Every table must have the same
columns.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SUMMARY_KEYS", "ablation_summary"]

SUMMARY_KEYS = ("ablation", "variant")


def ablation_summary(sources: Sequence[Mapping[str, Any]], tables: Sequence[str | Path]) -> str:
    """The summary CSV of `tables` (paths of table5.csv), each labelled by its `sources` entry
    (`ablation`, `variant`), in that order."""
    if len(sources) != len(tables):
        raise ValueError(f"{len(sources)} sources for {len(tables)} tables")
    header: list[str] | None = None
    rows: list[list[str]] = []
    for source, table in zip(sources, tables, strict=True):
        with Path(table).open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            columns = next(reader, None)
            if columns is None:
                raise ValueError(f"{table}: empty table")
            if header is None:
                header = columns
            elif columns != header:
                raise ValueError(
                    f"{table}: columns {columns} differ from the first table's {header}"
                )
            variant = source.get("variant")
            label = [str(source["ablation"]), "" if variant is None else str(variant)]
            rows += [label + row for row in reader]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*SUMMARY_KEYS, *(header or [])])
    writer.writerows(rows)
    return out.getvalue()
