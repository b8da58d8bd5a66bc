"""The one line the workflow ends with (servelab.workflow_io.summary_line): what was written,
what was already up to date, what was not made."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from servelab.workflow_io import FILES_NAMED_PER_FOLDER, requested_targets, summary_line

STARTED_S = 1_000_000.0


def make(path: Path, mtime_s: float) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x", encoding="utf-8")
    os.utime(path, (mtime_s, mtime_s))
    return str(path)


def test_written_up_to_date_and_missing_targets_are_told_apart(tmp_path: Path) -> None:
    new = make(tmp_path / "table5.csv", STARTED_S + 5)
    old = make(tmp_path / "table3.csv", STARTED_S - 5)
    absent = str(tmp_path / "table6.csv")
    line = summary_line([new, old, absent], STARTED_S, failed=True)
    assert line == (
        f"servelab: some jobs failed (their errors are above); wrote {new}; "
        f"up to date: {old}; not made: {absent}"
    )


def test_a_success_names_only_what_exists(tmp_path: Path) -> None:
    new = make(tmp_path / "results" / "table5.csv", STARTED_S)  # same second: written now
    assert summary_line([new], STARTED_S) == f"servelab: wrote {new}"
    old = make(tmp_path / "results" / "table5.csv", STARTED_S - 1)
    assert summary_line([old], STARTED_S) == f"servelab: wrote nothing; up to date: {old}"


def test_many_files_of_one_folder_are_named_by_the_folder(tmp_path: Path) -> None:
    figures = [
        make(tmp_path / "figures" / f"figure{i}.png", STARTED_S + 1)
        for i in range(FILES_NAMED_PER_FOLDER + 1)
    ]
    few = [make(tmp_path / "few" / f"f{i}.csv", STARTED_S + 1) for i in range(2)]
    line = summary_line([*figures, *few], STARTED_S)
    assert line == (
        f"servelab: wrote {tmp_path / 'figures'}/ ({len(figures)} files), {few[0]}, {few[1]}"
    )


def test_requested_targets_are_target_outputs_or_an_aggregate_rules_inputs() -> None:
    """A target file's job contributes its outputs; a rule without outputs (`all`) its inputs."""
    table = SimpleNamespace(output=["results/table5.csv"], input=["results/runs/a/run.json"])
    aggregate = SimpleNamespace(output=[], input=["results/table3.csv", "results/table5.csv"])
    workflow = SimpleNamespace(dag=SimpleNamespace(targetjobs=[table, aggregate]))
    assert requested_targets(workflow) == ["results/table3.csv", "results/table5.csv"]
