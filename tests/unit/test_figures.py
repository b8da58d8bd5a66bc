"""The figures registry (docs/benchmarks/figures.md, read by benchmarks/figures.py): every number
with a unit README.md quotes is in it, every row's quoted text is where it says, and a measurement
outside a row's tolerance fails the check."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark

REPO = Path(__file__).resolve().parents[2]


figures = load_benchmark("figures")
REGISTRY = figures.parse_registry((REPO / "docs" / "benchmarks" / "figures.md").read_text())

UNIT = r"(?:ms|µs|us|s|min|minutes?|seconds?|h|hours?|MB|GB|GiB|KB|%|req/s|requests/s|GPU-hours)"
NUMBER = r"\d+(?:[.,]\d+)?(?:\s?[–-]\s?\d+(?:[.,]\d+)?)?"
WORD = r"(?:a|an|one|two|three|four|five|six|seven|eight|nine|ten)"
QUOTED_FIGURE = re.compile(
    rf"(?<![\w.]){NUMBER}\s?{UNIT}(?![\w/])|\b{WORD} {UNIT}(?![\w/])|\b\d+ of (?:its )?\d+\b"
)


def prose(text: str) -> str:
    """The text outside code fences, its whitespace folded (a quote may wrap a line)."""
    return " ".join(re.sub(r"```.*?```", " ", text, flags=re.S).split())


def quoted_figures(text: str) -> list[str]:
    return [m.group() for m in QUOTED_FIGURE.finditer(prose(text))]


def test_the_registry_has_rows_and_sources() -> None:
    assert len(REGISTRY) >= 10
    assert {f.source for f in REGISTRY} <= set(figures.SOURCES)
    assert any(f.cheap for f in REGISTRY)


def test_every_number_with_a_unit_the_readme_quotes_is_in_the_registry() -> None:
    readme = prose((REPO / "README.md").read_text())
    quotes = [f.quoted for f in REGISTRY if "README.md" in f.files]
    found = quoted_figures((REPO / "README.md").read_text())
    assert len(found) >= 10
    missing = [q for q in found if not any(q in quote for quote in quotes)]
    assert missing == [], f"README figures with no row in docs/benchmarks/figures.md: {missing}"
    assert all(quote in readme for quote in quotes)


def test_every_row_is_quoted_where_it_says() -> None:
    stale = [
        (figure.name, name)
        for figure in REGISTRY
        for name in figure.files
        if figure.quoted not in prose((REPO / name).read_text())
    ]
    assert stale == []


def test_the_extractor_finds_planted_figures() -> None:
    text = (
        "It took 76 s, 2 min 11 s with set-up, about three\nminutes on H100, 11 of its 14 gaps, "
        "p99 0.4–0.6 ms at 50 req/s, a 94 MB bundle, 10% off; a 99-run grid, Python ≥ 3.11.\n"
        "```sh\nsleep 5 s\n```"
    )
    assert quoted_figures(text) == [
        "76 s",
        "2 min",
        "11 s",
        "three minutes",
        "11 of its 14",
        "0.4–0.6 ms",
        "50 req/s",
        "94 MB",
        "10%",
    ]


@pytest.mark.parametrize(
    ("tolerance", "value", "inside", "outside"),
    [
        ("exact", 11.0, 11.0, 10.0),
        ("±50%", 60.0, 89.0, 91.0),
        ("±2.5", 7.5, 9.9, 10.1),
        ("≤ 1 ms", 0.75, 1.0, 1.01),
        ("≥ 400", 400.0, 500.0, 300.0),
    ],
)
def test_a_tolerance_accepts_within_and_refuses_beyond(tolerance, value, inside, outside) -> None:
    figure = figures.Figure("f", "q", ("README.md",), value, "", tolerance, "s", "k", True, "d")
    assert figure.accepts(inside)
    assert not figure.accepts(outside)


def test_a_changed_figure_fails_the_check_and_names_itself(monkeypatch, capsys) -> None:
    """figures.py with a source whose measurement moved beyond one row's tolerance: exit 1, the
    row named as a miss; the rows within tolerance pass; unmoved, the check passes."""
    registered = {f.key: f.value for f in REGISTRY if f.source == "table5"}
    real_run = subprocess.run

    def fake(measured: dict[str, float]):
        def run(argv, **kwargs):
            script = Path(argv[1]).name if len(argv) > 1 else ""
            if script == "table5_wall.py":
                payload = {"wall_s": measured["wall_s"], "jobs": 69}
            elif script == "sim_vs_study.py":
                payload = {k: v for k, v in measured.items() if k != "wall_s"}
            else:  # anything else (platform's own `uname`) runs for real
                return real_run(argv, **kwargs)
            return subprocess.CompletedProcess(argv, 0, json.dumps(payload) + "\n", "")

        return run

    moved = {**registered, "gaps_within_2x": registered["gaps_within_2x"] - 1}
    monkeypatch.setattr(figures.subprocess, "run", fake(moved))
    assert figures.main(["--source", "table5"]) == 1
    out = capsys.readouterr().out
    assert "MISS Table 5 gaps within a factor 2 of the study's" in out
    assert "ok   Table 5 from nothing, sim backend" in out
    monkeypatch.setattr(figures.subprocess, "run", fake(registered))
    assert figures.main(["--source", "table5"]) == 0
