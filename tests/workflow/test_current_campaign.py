"""The study's protocol on the current releases through the real Snakefile, on the sim backend:
`snakemake --cores 1 results/table5.csv --configfile config/current.yaml`, as documented, in a
scratch folder, with one more overlay that runs only Table 5's three conditions, shortened, with two
repetitions (100 s for the documented grid, 43 s for this one on two cores). The simulated vLLM V1
and SGLang 0.5 print their releases' start-up lines, the gate confirms each arm from them, the runs export the
releases' /metrics names, and results/defaults_diff.csv is written from the rules first."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

# The module's fixture is one costly set-up: every test of it on one xdist worker, so that the
# two workers do not each build it.
pytestmark = pytest.mark.xdist_group("current-campaign")

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--cores", "1"]
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=1200)


# Table 5's paired conditions, shortened: the fewest requests that still give every cell a value.
SHORT_GRID = """
repetitions: 2
conditions:
  - {sweep: rate, rate: 0.12, sharing: 0.9, prompt_tokens: 4096, duration_s: 60}
  - {sweep: rate, rate: 0.28, sharing: 0.9, prompt_tokens: 4096, duration_s: 40}
  - {sweep: length, rate: 0.065, sharing: 0.9, prompt_tokens: 8192, duration_s: 180}
arms:
  matched:
    conditions: [rate-0.12, rate-0.28, length-8192]
dispatch:
  warmup_requests: 2
"""


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("current-campaign")
    shutil.copytree(REPO / "config", work / "config")
    (work / "config" / "short.yaml").write_text(SHORT_GRID)
    done = _snakemake(
        work, "results/table5.csv", "--configfile", "config/current.yaml", "config/short.yaml"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return work


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_table5_compares_the_current_releases(campaign: Path) -> None:
    rows = _csv(campaign / "results" / "table5.csv")
    assert {r["condition"] for r in rows} == {"rate-0.12", "rate-0.28", "length-8192"}
    for row in rows:
        assert float(row["defaults_gap"]) > 0 and float(row["matched_gap"]) > 0


def test_defaults_diff_answers_for_the_l4_and_the_h100(campaign: Path) -> None:
    rows = {(r["gpu"], r["setting"]): r for r in _csv(campaign / "results" / "defaults_diff.csv")}
    assert {gpu for gpu, _ in rows} == {"L4", "H100-80GB"}
    l4 = rows[("L4", "chunk_size")]
    assert (l4["vllm_v1"], l4["sglang_v05"], l4["differs"]) == ("2048", "4096", "true")
    assert rows[("H100-80GB", "chunk_size")]["differs"] == "false"


def test_each_arm_was_confirmed_from_its_releases_own_lines(campaign: Path) -> None:
    deployments = campaign / "results" / "deployments"
    seen = {}
    for resolved_path in sorted(deployments.glob("*/resolved.json")):
        resolved = json.loads(resolved_path.read_text())
        log = (resolved_path.parent / "startup.log").read_text()
        arm = resolved_path.parent.name.split("-")[0]
        seen[(arm, resolved["engine"])] = resolved["chunk_size"]
        if resolved["engine"] == "vllm_v1":
            assert "Initializing a V1 LLM engine (v0.33.0) with config:" in log
            assert resolved["version"] == "0.33.0"
        else:
            assert "server_args={'model_path': " in log and resolved["version"] is None
        assert resolved["chunked_prefill"] is True
    assert seen == {
        ("defaults", "vllm_v1"): 2048,
        ("defaults", "sglang_v05"): 4096,
        ("matched", "vllm_v1"): 4096,
        ("matched", "sglang_v05"): 4096,
    }


def test_runs_carry_the_releases_metric_names(campaign: Path) -> None:
    runs = campaign / "results" / "runs"
    v1 = pq.read_table(next(runs.glob("defaults/vllm_v1/*/rep1/scrape.parquet"))).to_pydict()
    sg = pq.read_table(next(runs.glob("defaults/sglang_v05/*/rep1/scrape.parquet"))).to_pydict()
    v1_names, sg_names = set(v1["source_metric"]), set(sg["source_metric"])
    assert "vllm:kv_cache_usage_perc" in v1_names and "vllm:gpu_cache_usage_perc" not in v1_names
    assert "sglang:num_retracted_requests_total" in sg_names


def test_the_h100_variant_expands_the_same_grid() -> None:
    done = subprocess.run(
        [
            str(BIN / "snakemake"),
            "-n",
            "--forceall",
            "results/table5.csv",
            "--configfile",
            "config/current.yaml",
            "config/current-h100.yaml",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "deploy" in done.stdout and "defaults_diff" in done.stdout
