"""The study's traces do not move: the content of short traces of config/config.yaml's conditions,
compiled from the study's own workload and seeds, against digests recorded from the compiler
before `workload.topologies` and imported traces existed (tests/golden/traces/study.json).

The digests are of the content, not the file bytes (a Parquet file's bytes also name the pyarrow
that wrote it): the table's columns as JSON, and the manifest without `servelab_version`.
Regenerate with `UPDATE_GOLDENS=1 pytest tests/unit/test_workload_golden.py`, only for a change
meant to move the study's traces (every sealed measurement of them is then measured again).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from servelab.grid.config import conditions, load_config, trace_seed
from servelab.workload import compile_trace

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "traces" / "study.json"
# (condition, rep, duration_s): every sweep, short enough to compile in about a second each
CASES = [
    ("rate-0.28", "rep1", 60.0),
    ("rate-0.05", "rep2", 120.0),
    ("sharing-0.00", "rep1", 400.0),
    ("sharing-0.95", "rep3", 400.0),
    ("length-512", "rep1", 20.0),
    ("length-8192", "rep2", 60.0),
]


def digests() -> dict[str, dict[str, Any]]:
    """Each case's content digests (module docstring)."""
    config = load_config(ROOT / "config" / "config.yaml")
    grid = conditions(config)
    out: dict[str, dict[str, Any]] = {}
    for cid, rep, duration in CASES:
        table, manifest = compile_trace(
            condition=replace(grid[cid], duration_s=duration),
            rep=rep,
            seed=trace_seed(int(config["campaign_seed"]), cid, rep),
            workload=config["workload"],
            tokenizer=str(config["tokenizer"]),
        )
        manifest = {k: v for k, v in manifest.items() if k != "servelab_version"}
        out[f"{cid}/{rep}"] = {
            "rows": table.num_rows,
            "table_sha256": hashlib.sha256(
                json.dumps(table.to_pydict(), sort_keys=True).encode()
            ).hexdigest(),
            "manifest_sha256": hashlib.sha256(
                json.dumps(manifest, sort_keys=True).encode()
            ).hexdigest(),
        }
    return out


def test_the_study_traces_are_what_they_were() -> None:
    got = digests()
    if os.environ.get("UPDATE_GOLDENS") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.fail("UPDATE_GOLDENS=1: golden trace digests rewritten; run again without it")
    assert got == json.loads(GOLDEN.read_text())
