"""Campaign semantics on the sim backend, through the real Snakemake workflow (issue 4)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time

import pyarrow.parquet as pq

VLLM1 = "defaults/vllm/rate-0.28/rep1"
VLLM2 = "defaults/vllm/rate-0.28/rep2"
SGLANG1 = "defaults/sglang/rate-0.28/rep1"


def target(run_id: str, name: str = "telemetry.parquet") -> str:
    return f"results/runs/{run_id}/{name}"


def read_run(workdir, run_id: str) -> dict:
    return json.loads((workdir.run_dir(run_id) / "run.json").read_text())


def test_a_run_produces_every_artifact_and_a_rerun_redoes_nothing(workdir):
    result = workdir.snakemake(target(VLLM1))
    assert result.returncode == 0, result.stderr[-3000:]
    run = read_run(workdir, VLLM1)
    assert run["status"] == "ok" and run["backend"] == "sim" and run["attempt"] == 1
    assert run["resolved_config"]["chunked_prefill"] is False
    for name in ("requests.parquet", "scrape.parquet", "telemetry.parquet"):
        assert pq.read_table(workdir.run_dir(VLLM1) / name).num_rows > 0
    before = (workdir.run_dir(VLLM1) / "run.json").stat().st_mtime_ns
    again = workdir.snakemake(target(VLLM1))
    assert again.returncode == 0
    assert "Nothing to be done" in again.stderr + again.stdout
    assert (workdir.run_dir(VLLM1) / "run.json").stat().st_mtime_ns == before


def test_a_configuration_mismatch_refuses_the_run_quoting_the_log_line(workdir):
    # The arm claims vLLM chunks its prefills; the engine resolves otherwise from its flags.
    workdir.config["arms"]["defaults"]["engines"]["vllm"]["expect"] = {
        "chunked_prefill": True,
        "chunk_size": 2048,
    }
    workdir.write_config()
    result = workdir.snakemake(target(VLLM1))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "chunked_prefill_enabled=False" in output  # the quoted start-up log line
    assert not (workdir.run_dir(VLLM1) / "run.json").exists()  # nothing measured


def test_failed_attempts_are_retried_and_kept(workdir):
    workdir.config["campaign"]["faults"] = [{"run": VLLM1, "kind": "fail", "attempts": 2}]
    workdir.write_config()
    result = workdir.snakemake(target(VLLM1))
    assert result.returncode == 0, result.stderr[-3000:]
    run = read_run(workdir, VLLM1)
    assert run["status"] == "ok" and run["attempt"] == 3
    for k in (1, 2):
        kept = json.loads(
            (workdir.run_dir(VLLM1) / "attempts" / f"attempt-{k}" / "run.json").read_text()
        )
        assert kept["status"] == "failed" and kept["attempt"] == k


def test_a_run_that_keeps_failing_is_recorded_and_the_campaign_goes_on(workdir):
    workdir.config["campaign"]["faults"] = [{"run": VLLM1, "kind": "fail", "attempts": 5}]
    workdir.write_config()
    result = workdir.snakemake(target(VLLM1), target(SGLANG1))
    assert result.returncode == 0, result.stderr[-3000:]
    failed = read_run(workdir, VLLM1)
    assert failed["status"] == "failed" and failed["attempt"] == 3  # 1 + 2 retries
    assert sorted(p.name for p in (workdir.run_dir(VLLM1) / "attempts").iterdir()) == [
        "attempt-1",
        "attempt-2",
    ]
    assert read_run(workdir, SGLANG1)["status"] == "ok"


def snapshot(root) -> dict:
    """(bytes' SHA-256, mtime) of every file under `root`, but Snakemake's own bookkeeping."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and rel.parts[0] != ".snakemake":
            out[str(rel)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return out


def test_reclamation_discards_and_repeats_the_block_touching_nothing_else(workdir):
    # SGLang's block is measured first; then vLLM's, whose node is reclaimed 20 s into rep2.
    sglang = [target(SGLANG1), target("defaults/sglang/rate-0.28/rep2")]
    assert workdir.snakemake(*sglang).returncode == 0
    workdir.config["campaign"]["faults"] = [{"run": VLLM2, "kind": "reclaim", "at_s": 20}]
    workdir.write_config()
    before = snapshot(workdir.path)
    result = workdir.snakemake(target(VLLM2, "run.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    after = snapshot(workdir.path)

    # Only the executing jobs' own files are new (the vLLM deployment and its block: declared
    # outputs, measured/ and attempts/ records, the discarded generation, logs); nothing that
    # existed before changed, bytes or mtime.
    assert {k: v for k, v in after.items() if k in before} == before
    block = "results/runs/defaults/vllm/rate-0.28/"
    new = sorted(set(after) - set(before))
    allowed = (block, "results/discarded/defaults/vllm/rate-0.28/", "results/logs/")
    deployment = ("results/deployments/defaults-vllm-", "results/manifests/defaults-vllm-")
    assert all(k.startswith(allowed + deployment) for k in new), new

    discarded = workdir.path / "results" / "discarded" / "defaults" / "vllm" / "rate-0.28"
    generations = sorted(p for p in discarded.iterdir() if p.is_dir())
    assert [g.name for g in generations] == ["001"]
    reason = json.loads((generations[0] / "reason.json").read_text())
    assert reason["interrupted_run"] == VLLM2
    assert reason["discarded_reps"] == ["rep1", "rep2"]
    assert reason["repeated_reps"] == ["rep1", "rep2"]
    assert "reclaim" in reason["reason"] or "node" in reason["reason"]
    assert reason["faults"] == [{"run": VLLM2, "kind": "reclaim", "at_s": 20}]
    # The discarded measurements are kept: rep1 complete, rep2's interrupted attempt.
    assert json.loads((generations[0] / "rep1" / "run.json").read_text())["status"] == "ok"
    interrupted = generations[0] / "rep2" / "measured" / "run.json"  # never published
    assert json.loads(interrupted.read_text())["status"] == "interrupted"
    # Both repetitions were measured again, within the same job, and are complete.
    for run_id in (VLLM1, VLLM2):
        assert read_run(workdir, run_id)["status"] == "ok"
    record = json.loads((workdir.path / block / "block.json").read_text())
    assert record["discarded"] == ["001"]
    assert {rep: r["status"] for rep, r in record["reps"].items()} == {"rep1": "ok", "rep2": "ok"}
    # The injected reclamation fires once: running again (with telemetry) adds no discard.
    again = workdir.snakemake(target(VLLM1), target(VLLM2))
    assert again.returncode == 0
    assert len(sorted(p for p in discarded.iterdir() if p.is_dir())) == 1


def test_sigkill_mid_campaign_resumes_with_nothing_lost_or_redone(workdir):
    targets = [target(r) for r in (VLLM1, VLLM2, SGLANG1, "defaults/sglang/rate-0.28/rep2")]
    proc = workdir.popen(*targets)
    first = workdir.run_dir(VLLM1) / "run.json"
    deadline = time.monotonic() + 300
    while not first.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert first.exists(), "the first run never completed"
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # snakemake and the job it is running
    proc.wait(timeout=30)

    # Nothing half-written under a final name: every final artifact present is readable.
    results = workdir.path / "results"
    # A run measured before the kill is not measured again: its file afterwards is the same inode
    # (published as a hard link of its sealed measurement; a new measurement is a new file) with
    # the same bytes. Not its mtime: a kill that lands after a block published its runs but before
    # Snakemake recorded the job complete makes the job run again, which publishes the sealed
    # measurements once more, and Snakemake touches a finished job's outputs.
    done_before = {}
    for run_json in results.glob("runs/**/run.json"):
        done_before[run_json] = (run_json.stat().st_ino, run_json.read_bytes())
        json.loads(run_json.read_text())
    for parquet in results.glob("**/*.parquet"):
        pq.read_table(parquet)

    result = workdir.snakemake(*targets)
    assert result.returncode == 0, result.stderr[-3000:]
    for run_json, (inode, content) in done_before.items():
        assert run_json.stat().st_ino == inode, f"{run_json} was measured again"
        assert run_json.read_bytes() == content, f"{run_json} changed"
    for t in targets:
        assert (workdir.path / t).is_file()
