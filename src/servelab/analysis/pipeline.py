"""Public entry points, so Snakemake scripts stay one call each.

Each function takes exactly the run directories it needs (or an already built `Analysis`) and the
settings the outputs are computed with, whole (`servelab.grid.settings.AnalysisSettings`; None: its
defaults), reads the runs through `load_runs`, and writes its outputs atomically. `analyze` writes
everything from one load: Tables 3-6, Figures 1 and 6-14, numbers.json and analysis_notes.txt.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from servelab.analysis import figdata, tables
from servelab.analysis.figdata import FORMATS
from servelab.analysis.numbers import build_numbers, clean, render_notes
from servelab.analysis.restarts import read_restart_record
from servelab.analysis.runs import load_runs, read_manifests
from servelab.analysis.summary import Analysis
from servelab.analysis.verify import Mismatch, verify
from servelab.artifacts import read_json, write_json, write_text
from servelab.grid.settings import AnalysisSettings

__all__ = [
    "TABLE_RENDERERS",
    "AnalysisResult",
    "VerificationError",
    "analyze",
    "build_analysis",
    "verify_against_checksums",
    "write_figures",
    "write_numbers",
    "write_table",
]

log = logging.getLogger("servelab.analysis")
PathLike = str | os.PathLike[str]
RunsArg = Sequence[PathLike] | Analysis


def build_analysis(
    run_dirs: Sequence[PathLike],
    *,
    manifests: Sequence[PathLike] = (),
    restart_records: Sequence[PathLike] = (),
    settings: AnalysisSettings | None = None,
    telemetry: bool = True,
) -> Analysis:
    """Load the runs (and trace manifests, restart records) into an `Analysis` computed with
    `settings` (None: the defaults of `AnalysisSettings`)."""
    settings = AnalysisSettings() if settings is None else settings
    runset = load_runs(
        run_dirs, exclude_first_graph=settings.exclude_first_graph, telemetry=telemetry
    )
    return Analysis(
        runset,
        settings=settings,
        manifests=read_manifests(manifests),
        restarts=[read_restart_record(p) for p in restart_records],
    )


def _analysis(
    runs: RunsArg,
    settings: AnalysisSettings | None,
    *,
    manifests: Sequence[PathLike] = (),
    restart_records: Sequence[PathLike] = (),
    telemetry: bool = True,
) -> Analysis:
    """`runs` itself when it is an `Analysis` already, else `build_analysis` of its directories."""
    if isinstance(runs, Analysis):
        return runs
    return build_analysis(
        runs,
        manifests=manifests,
        restart_records=restart_records,
        settings=settings,
        telemetry=telemetry,
    )


# The table writers by number: every one takes the same analysis settings (config `analysis:`, one
# `AnalysisSettings`); a table that does not use one (e.g. keeps_pace for Table 5) ignores it.
TABLE_RENDERERS: dict[int, Callable[[Analysis], str]] = {
    3: tables.render_table3,  # workload realisation (every run of the grid)
    4: tables.render_table4,  # SGLang in the two deployments (its runs of both arms, 3 conditions)
    5: tables.render_table5,  # the decomposition (both engines x both arms x 3 conditions)
    6: tables.render_table6,  # dispersion of pooled TTFT (Table 5's runs)
}


def write_table(
    number: int,
    runs: RunsArg,
    out_csv: PathLike,
    *,
    settings: AnalysisSettings | None = None,
) -> Path:
    """Table `number` (3-6) of the study from `runs`, written to `out_csv`."""
    if number not in TABLE_RENDERERS:
        raise ValueError(f"no table {number}: the study's tables are 3, 4, 5 and 6")
    an = _analysis(runs, settings, telemetry=False)
    write_text(out_csv, TABLE_RENDERERS[number](an))
    return Path(out_csv)


def write_figures(
    runs: RunsArg,
    out_dir: PathLike,
    *,
    manifests: Sequence[PathLike] = (),
    restart_records: Sequence[PathLike] = (),
    settings: AnalysisSettings | None = None,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Figures 1 and 6-14 as `{out_dir}/figureN.{png,pdf}` (needs every run, the trace manifests of
    the runs the fluid model uses, and the restart records if any)."""
    an = _analysis(runs, settings, manifests=manifests, restart_records=restart_records)
    return _draw(clean(figdata.figure_data(an)), out_dir, formats)


def write_numbers(
    runs: RunsArg,
    out_json: PathLike,
    *,
    manifests: Sequence[PathLike] = (),
    restart_records: Sequence[PathLike] = (),
    settings: AnalysisSettings | None = None,
    notes_path: PathLike | None = None,
) -> Path:
    """numbers.json (and, if `notes_path` is given, the plain-text notes)."""
    an = _analysis(runs, settings, manifests=manifests, restart_records=restart_records)
    write_json(out_json, build_numbers(an))
    if notes_path is not None:
        write_text(notes_path, render_notes(an))
    return Path(out_json)


@dataclass(frozen=True)
class AnalysisResult:
    found: int
    parsed: int
    skipped: int
    outputs: list[Path]
    notes: list[str]


def analyze(
    run_dirs: Sequence[PathLike],
    out_dir: PathLike,
    *,
    manifests: Sequence[PathLike] = (),
    restart_records: Sequence[PathLike] = (),
    settings: AnalysisSettings | None = None,
    formats: Sequence[str] = FORMATS,
) -> AnalysisResult:
    """Everything, from one load: `{out_dir}/table{3..6}.csv`, `numbers.json`,
    `analysis_notes.txt` and `figures/figureN.{png,pdf}`."""
    out = Path(out_dir)
    an = build_analysis(
        run_dirs, manifests=manifests, restart_records=restart_records, settings=settings
    )
    written = [write_table(n, an, out / f"table{n}.csv") for n in sorted(TABLE_RENDERERS)]
    numbers = build_numbers(an)
    write_json(out / "numbers.json", numbers)
    write_text(out / "analysis_notes.txt", render_notes(an))
    written += [out / "numbers.json", out / "analysis_notes.txt"]
    written += _draw(numbers["figures"], out / "figures", formats)
    rs = an.runset
    return AnalysisResult(rs.found, rs.parsed, len(rs.skipped), written, an.notes())


class VerificationError(ValueError):
    """Recomputed outputs differ from the recorded checksums (the message lists every file)."""


def verify_against_checksums(
    run_dirs: Sequence[PathLike],
    checksums_path: PathLike,
    report_path: PathLike | None = None,
    *,
    manifests: Sequence[PathLike] = (),
    restart_records: Sequence[PathLike] = (),
    settings: AnalysisSettings | None = None,
    scratch_dir: PathLike | None = None,
) -> list[Mismatch]:
    """The verify target: recompute everything into a scratch directory (a temporary one unless
    `scratch_dir` is given) and compare it byte for byte with `checksums_path`.

    Writes `report_path` (when given) and returns [] when every file matches; otherwise logs each
    mismatch and raises `VerificationError` naming the files.
    """
    with tempfile.TemporaryDirectory(prefix="servelab-verify-") as tmp:
        scratch = Path(scratch_dir) if scratch_dir is not None else Path(tmp)
        analyze(
            run_dirs,
            scratch,
            manifests=manifests,
            restart_records=restart_records,
            settings=settings,
        )
        mismatches = verify(scratch, checksums_path)
    if mismatches:
        for m in mismatches:
            log.error("verify: %s", m)
        raise VerificationError(
            f"{len(mismatches)} output(s) differ from {checksums_path}: "
            + "; ".join(str(m) for m in mismatches)
        )
    n = len(read_json(checksums_path, ("files",))["files"])
    message = f"verified {n} files against {checksums_path}: all byte-identical\n"
    log.info("%s", message.strip())
    if report_path is not None:
        write_text(report_path, message)
    return []


def _draw(figure_numbers: object, out_dir: PathLike, formats: Sequence[str]) -> list[Path]:
    """Draw the figures of numbers.json's `figures` entry (matplotlib is imported here: only the
    jobs that draw pay for it)."""
    from servelab.analysis import figures

    return figures.draw_figures(_drawable(figure_numbers), out_dir, formats)


def _drawable(figure_numbers: object) -> dict[str, dict[str, object]]:
    """Figure data as written to numbers.json, with null restored to NaN for drawing.

    Figures are always drawn from these rounded values, so every number a figure shows is the
    number numbers.json holds, whichever entry point drew it.
    """
    out = _restore_nan(figure_numbers)
    assert isinstance(out, dict)
    return out


def _restore_nan(obj: object) -> object:
    if obj is None:
        return float("nan")
    if isinstance(obj, dict):
        return {k: _restore_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_restore_nan(v) for v in obj]
    return obj
