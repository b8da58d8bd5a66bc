"""`snakemake --cores 1 results/capacity.csv` through the real Snakefile on the sim backend: the
checkpoint chain runs each search to its stopping rule, and a search killed mid-way (SIGKILL) and
run again reuses every completed probe (its step file and probe folder are not rewritten)."""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
KILL_AFTER_STEP = 2
WAIT_S = 600

OVERLAY = """\
repetitions: 1
engines:
  vllm: null
arms:
  defaults:
    engines:
      vllm: null
  matched:
    engines:
      vllm: null
capacity:
  shapes:
    - {name: tiny, sharing: 0.5, prompt_tokens: 1024, duration_s: 120}
  bracket: [0.1, 1.0]
  tolerance: 0.1
  max_probes: 8
  keeps_pace: 0.7
  limits: {ttft_p99_s: 2.0}
"""


def _command() -> list[str]:
    return [
        str(BIN / "snakemake"),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--cores",
        "1",
        "results/capacity.csv",
        "--configfile",
        "config/capacity-test.yaml",
    ]


def _fingerprint(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under `folder`: (mtime_ns, sha256)."""
    return {
        str(p.relative_to(folder)): (
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_the_search_resumes_after_a_kill_and_reuses_every_completed_probe(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    (tmp_path / "config" / "capacity-test.yaml").write_text(OVERLAY)
    search = tmp_path / "results" / "capacity" / "defaults-sglang-tiny"
    marker = search / f"step-{KILL_AFTER_STEP}.json"
    process = subprocess.Popen(
        _command(),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the search never reached the step to kill at"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    completed = _fingerprint(search)
    done_steps = sorted(p.name for p in search.glob("step-*.json"))
    assert f"step-{KILL_AFTER_STEP}.json" in done_steps
    kept = {
        name: value
        for name, value in completed.items()
        if name.startswith(tuple(f"probe-{k}/" for k in range(KILL_AFTER_STEP + 1)))
        or name in {f"step-{k}.json" for k in range(KILL_AFTER_STEP + 1)}
    }
    assert any(name.startswith("probe-0/") for name in kept)

    again = subprocess.run(_command(), cwd=tmp_path, capture_output=True, text=True, timeout=WAIT_S)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    after = _fingerprint(search)
    for name, value in kept.items():
        assert after.get(name) == value, f"{name} was measured or written again"

    figure = tmp_path / "results" / "figures" / "capacity.png"
    assert figure.read_bytes().startswith(b"\x89PNG")
    rows = list(csv.DictReader((tmp_path / "results" / "capacity.csv").open()))
    assert [(r["engine"], r["arm"]) for r in rows] == [
        ("sglang", "defaults"),
        ("sglang", "matched"),
    ]
    for row in rows:
        assert row["stopped"] in {"tolerance", "max-probes", "below-bracket", "above-bracket"}
        assert int(row["probes"]) <= 8
        if row["stopped"] == "tolerance":
            assert float(row["bracket_width_pct"]) < 10
