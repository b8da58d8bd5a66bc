"""The study's protocol on a real engine: llama.cpp's llama-server through the real Snakefile.

`snakemake --cores 1 results/table5.csv --configfile config/llamacpp.yaml`, exactly as documented,
in a scratch folder: the local backend starts the real server per arm, the gate reads the server's
own start-up log, the real dispatcher sends the seeded traces, a real Prometheus scrapes /metrics,
and the analysis writes Table 5 (one engine: the arm effect). Then a deliberately mismatched arm is
refused, quoting llama-server's log line, and the measured runs stay as they were.

Needs the llama-server binary (`make llama-server`) and the prometheus binary; .ci/run has both.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from campaigns import TABLE5_METRICS, Workdir, llamacpp_campaign, table5_rows

from servelab.engines import parse_startup_log

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONDITION = "rate-0.50"
REPS = ("rep1", "rep2")

# one worker runs every test of the session's llama.cpp campaign: the others need not wait for it
pytestmark = [
    pytest.mark.usefixtures("llama_server_program", "prometheus_program"),
    pytest.mark.xdist_group("llamacpp"),
]


def _snakemake(cwd: Path, *configfiles: str, target: str = "results/table5.csv"):
    args = [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--cores", "1"]
    args += [target, "--configfile", *configfiles]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's llama.cpp campaign (tests/campaigns.py; the campaign commands' test reads it
    too): read only; the mismatch test works on a copy."""
    return llamacpp_campaign(tmp_path_factory)


def _deployments(work: Path) -> dict[str, dict]:
    out = {}
    for path in sorted((work / "results" / "deployments").glob("*/resolved.json")):
        resolved = json.loads(path.read_text())
        out[path.parent.name.split("-")[0]] = resolved
    return out


def test_the_campaign_ends_with_table5_as_the_arm_effect(campaign) -> None:
    rows = table5_rows(campaign)
    assert [(r["condition"], r["metric"]) for r in rows] == [(CONDITION, m) for m in TABLE5_METRICS]
    for row in rows:
        assert row["engine"] == "llamacpp" and row["n"] == "2"
        defaults, matched, change = (float(row[k]) for k in ("defaults", "matched", "change"))
        assert defaults > 0 and matched > 0
        # the paired change is the geometric mean of per-rep ratios: between their extremes
        assert float(row["ci_low"]) <= change <= float(row["ci_high"])


def test_each_arm_resolved_what_its_server_logged(campaign) -> None:
    work = campaign
    deployments = _deployments(work)
    assert set(deployments) == {"defaults", "matched"}
    defaults, matched = deployments["defaults"], deployments["matched"]
    assert defaults["engine"] == matched["engine"] == "llamacpp"
    assert defaults["chunked_prefill"] is False and defaults["chunk_size"] is None
    assert matched["chunked_prefill"] is True and matched["chunk_size"] == 256
    for resolved in (defaults, matched):
        deployment_dir = work / "results" / "deployments" / resolved["deployment_id"]
        startup = (deployment_dir / "startup.log").read_text().splitlines()
        line = resolved["evidence_lines"]["chunked_prefill"]
        # the evidence is the real server's own line, at the line number recorded
        assert startup[line - 1].strip() == resolved["evidence"]["chunked_prefill"].strip()
        assert "n_batch" in startup[line - 1]
        # the gate read the start-up probe's log (verbosity 4); the measured server ran at the
        # flags' own verbosity 3, which shows no n_batch and traces no prompt cache
        assert resolved["facts"]["verbosity"] == 4
        measured = parse_startup_log(
            (deployment_dir / "server-startup.log").read_text(), engine="llamacpp"
        )
        assert measured.facts["verbosity"] == 3 and "n_batch" not in measured.facts
        assert measured.facts["n_slots"] == resolved["facts"]["n_slots"]
        state = json.loads((deployment_dir / "local.json").read_text())
        assert not any("verbosity" in flag for flag in state["flags"])
        assert "--log-verbosity" not in state["command"]
        assert "cache state:" not in (deployment_dir / "server.log").read_text()


def test_runs_hold_real_telemetry_and_no_kv_usage_it_did_not_export(campaign) -> None:
    work = campaign
    for arm in ("defaults", "matched"):
        for rep in REPS:
            run_dir = work / "results" / "runs" / arm / "llamacpp" / CONDITION / rep
            record = json.loads((run_dir / "run.json").read_text())
            assert record["backend"] == "local" and record["status"] == "ok"
            requests = pq.read_table(run_dir / "requests.parquet").to_pylist()
            trace = pq.read_table(work / "results" / "traces" / CONDITION / rep / "trace.parquet")
            # every request of the seeded trace has its row, and the real server served each
            measured = [r for r in requests if not r["warmup"]]
            assert len(measured) == trace.num_rows > 20
            assert all(r["status"] == "ok" for r in requests)
            telemetry = pq.read_table(run_dir / "telemetry.parquet").to_pydict()
            metrics = set(telemetry["metric"])
            assert {"requests_running", "requests_waiting"} <= metrics
            assert "prompt_tokens_cached_total" in metrics
            assert "kv_cache_usage" not in metrics
            cached = [
                v
                for m, v in zip(telemetry["metric"], telemetry["value"], strict=True)
                if m == "prompt_tokens_cached_total"
            ]
            # σ = 0.5: the shared prefix is served from the slots' cache, and the counter
            # only grows
            assert cached[-1] > 0 and cached == sorted(cached)
            # the window closes on a scrape taken after the run's last token, so the server's
            # counters hold every token of the run, its last request's too (warm-ups included:
            # they are sent inside the window); computed + cached = every prompt token
            increase = _increases(telemetry)
            prompt = sum(r["prompt_tokens"] for r in requests)
            assert (
                increase["prompt_tokens_total"] + increase["prompt_tokens_cached_total"] == prompt
            )
            assert increase["generation_tokens_total"] == sum(r["output_tokens"] for r in requests)
            window = record["end_unix_s"] - record["start_unix_s"]
            assert max(telemetry["t_s"]) > window  # the closing sample
            gauges = {"requests_running", "requests_waiting"}
            assert all(
                t <= window + 1e-6
                for m, t in zip(telemetry["metric"], telemetry["t_s"], strict=True)
                if m in gauges
            )


def _increases(telemetry: dict[str, list]) -> dict[str, float]:
    """Each counter's last value minus its first over the run's telemetry."""
    values: dict[str, list[float]] = {}
    order = sorted(range(len(telemetry["t_s"])), key=lambda i: telemetry["t_s"][i])
    for i in order:
        values.setdefault(telemetry["metric"][i], []).append(telemetry["value"][i])
    return {m: v[-1] - v[0] for m, v in values.items() if m.endswith("_total")}


def test_a_mismatched_arm_is_refused_quoting_the_servers_line(campaign, tmp_path) -> None:
    work = Workdir(campaign, {}, write=False).copy_to(tmp_path / "copy").path
    measured = work / "results" / "runs" / "defaults" / "llamacpp" / CONDITION / "rep1"
    before = hashlib.sha256((measured / "requests.parquet").read_bytes()).hexdigest()
    wrong = {
        "arms": {
            "matched": {
                "engines": {
                    "llamacpp": {
                        "flags": ["--batch-size=256"],
                        "expect": {"chunked_prefill": True, "chunk_size": 512},
                    }
                }
            }
        }
    }
    (work / "config" / "mismatched.yaml").write_text(yaml.safe_dump(wrong))
    refused = _snakemake(work, "config/llamacpp.yaml", "config/mismatched.yaml")
    assert refused.returncode != 0
    logs = "".join(p.read_text() for p in (work / "results" / "logs").rglob("*.log"))
    assert "resolved chunk_size=256, expected 512" in logs
    assert "n_batch" in logs and "= 256" in logs  # llama-server's own line, quoted
    after = hashlib.sha256((measured / "requests.parquet").read_bytes()).hexdigest()
    assert after == before
