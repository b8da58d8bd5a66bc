"""The sim-vs-real measurements made with the bracketing floor (issue 26; docs/simulator.md, "The
bracketing floor" and after): the tags of their kept files in docs/benchmarks/data, in order.
The benchmarks that read those days take their default days from here."""

from __future__ import annotations

BRACKETED_DAYS = (
    "2026-12-06-seventeenth",
    "2026-12-06-eighteenth",
    "2026-12-06-nineteenth",
    "2026-12-06-twentieth",
    "2026-12-07-twenty-first",
    "2026-12-07-twenty-second",
    "2026-12-07-twenty-third",
    "2026-12-07-twenty-fourth",
    "2026-12-07-twenty-fifth",
    "2026-12-07-twenty-sixth",
)
