"""The pieces the local backend uses to serve llama.cpp: the command line it starts llama-server
with, and the tiny model (same spec, same bytes; Llama-3's vocabulary in Llama-3's order)."""

from __future__ import annotations

from pathlib import Path

import gguf
import transformers

from servelab.deploy.llama_server import file_sha256, server_command
from servelab.deploy.tiny_model import BOS_TOKEN_ID, TinyModelSpec, _vocabulary, write_tiny_model
from servelab.workload.tokenizer import default_tokenizer_file


def test_config_flags_become_the_two_tokens_llama_server_takes() -> None:
    command = server_command(
        "/bin/llama-server",
        model_path="/m.gguf",
        flags=["--ctx-size=8192", "--log-verbosity=4", "--no-cache-prompt", "-lv", "4"],
        host="127.0.0.1",
        port=8123,
    )
    assert command == [
        "/bin/llama-server",
        "--ctx-size",
        "8192",
        "--log-verbosity",
        "4",
        "--no-cache-prompt",
        "-lv",
        "4",
        "--model",
        "/m.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--metrics",
    ]
    # --metrics is added once, never twice
    again = server_command("x", model_path="m", flags=["--metrics"], host="h", port=1)
    assert again.count("--metrics") == 1


def test_the_tiny_model_is_the_same_bytes_for_the_same_spec(tmp_path: Path) -> None:
    spec = TinyModelSpec(n_layer=1, n_embd=16, n_head=2, n_head_kv=1, n_ff=32, seed=7)
    first = write_tiny_model(tmp_path / "a.gguf", spec)
    second = write_tiny_model(tmp_path / "b.gguf", spec)
    assert file_sha256(first) == file_sha256(second)
    assert spec.file_name != TinyModelSpec().file_name  # the name carries the spec's digest


def test_the_model_vocabulary_is_llama3s_in_llama3s_order() -> None:
    tokens, types, merges = _vocabulary()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(default_tokenizer_file()))
    assert len(tokens) == len(tokenizer)  # 128,256 with the special tokens
    # the ids the trace compiler counts are the model's ids
    ids = tokenizer.encode("hello world servelab", add_special_tokens=False)
    assert [tokens[i] for i in ids] == tokenizer.convert_ids_to_tokens(ids)
    assert tokens[BOS_TOKEN_ID] == "<|begin_of_text|>"
    assert types[BOS_TOKEN_ID] == int(gguf.TokenType.CONTROL)
    assert types[ids[0]] == int(gguf.TokenType.NORMAL)
    assert merges[0] == "Ġ Ġ"
