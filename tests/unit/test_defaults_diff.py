"""results/defaults_diff.csv: which settings still differ under vendor defaults, resolved by each
engine's own rules before any run (servelab.engines.defaults)."""

from __future__ import annotations

import csv
import io

import pytest

from servelab.engines.base import ResolutionError
from servelab.engines.defaults import SETTINGS, GpuSpec, defaults_diff, defaults_diff_csv

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
STUDY = {
    "vllm": [f"--model={MODEL}", "--max-model-len=16384", "--enable-chunked-prefill=False"],
    "sglang": [f"--model-path={MODEL}", "--context-length=16384", "--mem-fraction-static=0.85"],
}
CURRENT = {
    "vllm_v1": [f"--model={MODEL}", "--max-model-len=16384", "--gpu-memory-utilization=0.88"],
    "sglang_v05": [f"--model-path={MODEL}", "--context-length=16384", "--mem-fraction-static=0.85"],
}
VERSIONS = {"vllm": "0.6.3", "sglang": "0.4.1", "vllm_v1": "0.33.0", "sglang_v05": "0.5.23"}
GPUS = [GpuSpec("L4", 23034), GpuSpec("H100-80GB", 81559)]


def _rows(engines: dict[str, list[str]]) -> dict[tuple[str, str], dict[str, str]]:
    rows = defaults_diff(engines, GPUS, versions=VERSIONS, model_max_position_embeddings=131072)
    return {(r["gpu"], r["setting"]): r for r in rows}


def test_one_row_per_gpu_and_setting_with_each_engines_value_and_rule() -> None:
    rows = _rows(CURRENT)
    assert len(rows) == len(GPUS) * len(SETTINGS)
    row = rows[("L4", "chunk_size")]
    assert list(row) == [
        "gpu",
        "gpu_memory_mib",
        "setting",
        "vllm_v1",
        "vllm_v1_rule",
        "sglang_v05",
        "sglang_v05_rule",
        "differs",
        "meaning",
    ]


def test_the_study_releases_differ_in_chunked_prefill_itself() -> None:
    rows = _rows(STUDY)
    chunked = rows[("L4", "chunked_prefill")]
    assert (chunked["vllm"], chunked["vllm_rule"]) == ("false", "flag")
    assert (chunked["sglang"], chunked["sglang_rule"]) == ("true", "gpu-memory-rule")
    assert chunked["differs"] == "true"
    assert (rows[("L4", "chunk_size")]["vllm"], rows[("L4", "chunk_size")]["sglang"]) == (
        "unchunked",
        "2048",
    )
    assert rows[("H100-80GB", "chunk_size")]["sglang"] == "8192"  # 0.4.1: >= 25,000 MiB
    assert rows[("L4", "schedule_policy")]["sglang"] == "lpm"  # fcfs from 0.4.6 on


def test_the_current_releases_both_chunk_at_sizes_that_depend_on_the_gpu() -> None:
    rows = _rows(CURRENT)
    l4, h100 = rows[("L4", "chunk_size")], rows[("H100-80GB", "chunk_size")]
    assert (l4["vllm_v1"], l4["sglang_v05"], l4["differs"]) == ("2048", "4096", "true")
    assert (h100["vllm_v1"], h100["sglang_v05"], h100["differs"]) == ("8192", "8192", "false")
    assert rows[("L4", "chunked_prefill")]["differs"] == "false"
    assert rows[("L4", "prefix_caching")]["differs"] == "false"
    assert rows[("L4", "schedule_policy")]["differs"] == "false"
    graphs = rows[("L4", "cuda_graph_max_bs")]
    assert (graphs["vllm_v1"], graphs["sglang_v05"]) == ("512", "48")
    assert (graphs["vllm_v1_rule"], graphs["sglang_v05_rule"]) == (
        "capture-size-rule",
        "gpu-memory-rule",
    )
    # SGLang resolves its running limit from the KV pool at start-up: not known before a run
    running = rows[("L4", "max_running_requests")]
    assert (running["vllm_v1"], running["sglang_v05"], running["differs"]) == ("256", "", "")
    assert running["sglang_v05_rule"] == "run-time-pool-rule"
    assert rows[("L4", "memory_fraction")]["vllm_v1_rule"] == "flag"


def test_the_csv_is_deterministic_text() -> None:
    rows = defaults_diff(CURRENT, GPUS, versions=VERSIONS, model_max_position_embeddings=131072)
    text = defaults_diff_csv(rows)
    assert text == defaults_diff_csv(list(rows)) and text.endswith("\n") and "\r" not in text
    assert list(csv.DictReader(io.StringIO(text))) == rows
    with pytest.raises(ValueError, match="no GPU"):
        defaults_diff_csv([])


def test_an_engine_refusing_its_own_defaults_is_named() -> None:
    bad = {**CURRENT, "sglang_v05": [f"--model-path={MODEL}", "--chunked-prefill-size=-1"]}
    with pytest.raises(ResolutionError, match="mem-fraction-static"):
        _rows(bad)
