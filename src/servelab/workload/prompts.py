"""L3: prompts of one shared prefix of F tokens and a unique suffix of D tokens per request (L = F + D).

Tokens are drawn uniformly from the tokenizer's round-trip-safe subset (`tokenizer.safe_vocabulary`): ids that
decode to one space plus ASCII letters and encode back to themselves. Each such token is its own pre-token, so a
concatenation encodes back to exactly the drawn ids and nothing can merge across the prefix/suffix boundary. That
is the design; it is not trusted: every full prompt is encoded by the tokenizer itself, and a segment whose text
does not give back exactly its ids is redrawn (a bounded number of times, then an error naming the request). The
same holds for the prefix alone and for duplicate suffixes.

Warm-up prompts come from their own stream and can never share even their first token with a trace prompt: the
first token of every trace prompt (the prefix's first token, or each suffix's when F = 0) is drawn from the
even positions of the safe subset, the first token of every warm-up prompt from the odd positions. A warm-up
request therefore cannot pre-seed the measured prefix cache, in either engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servelab.workload.streams import substream
from servelab.workload.tokenizer import (
    DEFAULT_TOKENIZER,
    SafeVocabulary,
    encode_batch,
    load_tokenizer,
    safe_vocabulary,
)

__all__ = [
    "MAX_ATTEMPTS",
    "PromptError",
    "PromptSet",
    "build_prompts",
    "draw_positions",
    "prefix_length",
    "warmup_prompts",
]

# Redraw rounds for a segment that fails verification (or duplicates another) before giving up.
MAX_ATTEMPTS = 8
# Encode at most this many tokens per batch, to bound the tokenizer's memory.
_BATCH_TOKENS = 1 << 20

# For the offline Llama-3 tokenizer, suffixes are verified behind the prefix's last LOCAL_WINDOW
# tokens rather than the whole prefix (the prefix is verified once on its own). Its pre-tokenizer
# starts a new pre-token at every " letters" token of the safe subset, so nothing further back can
# change how a suffix encodes; the window is 16× what that needs. Any other tokenizer is verified on
# whole prompts. `servelab trace validate --retokenize` and the tests re-encode whole prompts.
LOCAL_WINDOW = 16

TRACE_PARITY = 0  # first token of a trace prompt: even positions of the safe subset
WARMUP_PARITY = 1  # first token of a warm-up prompt: odd positions


class PromptError(ValueError):
    """Prompts could not be drawn and verified. The message names the request(s) or segment."""


def prefix_length(sharing: float, prompt_tokens: int) -> int:
    """F = round(σ·L) (Python's round, as the config validator uses)."""
    return round(sharing * prompt_tokens)


@dataclass(frozen=True)
class PromptSet:
    """The prompts of one trace, in trace order."""

    prefix_ids: np.ndarray  # int32, shape (F,)
    prefix_text: str
    token_ids: np.ndarray  # int32, shape (n, L): prefix ids then suffix ids
    texts: list[str]
    vocab: SafeVocabulary
    redrawn: int  # segments redrawn because they failed verification or duplicated another

    @property
    def prefix_tokens(self) -> int:
        return int(self.prefix_ids.size)


def draw_positions(
    rng: np.random.Generator, rows: int, length: int, m: int, parity: int | None
) -> np.ndarray:
    """Positions into the safe subset, shape (rows, length); column 0 restricted to `parity` if given."""
    pos = rng.integers(0, m, size=(rows, length))
    if parity is not None and length > 0:
        count = (m - parity + 1) // 2  # how many positions of that parity exist
        pos[:, 0] = 2 * rng.integers(0, count, size=rows) + parity
    return pos


def _duplicates(pos: np.ndarray) -> np.ndarray:
    """Indices of rows equal to an earlier row."""
    if pos.shape[0] < 2:
        return np.empty(0, dtype=np.int64)
    _, first = np.unique(pos, axis=0, return_index=True)
    keep = np.zeros(pos.shape[0], dtype=bool)
    keep[first] = True
    return np.flatnonzero(~keep)


def _verify(
    tok: Any,
    vocab: SafeVocabulary,
    head_text: str,
    head_ids: np.ndarray,
    pos: np.ndarray,
    rows: np.ndarray,
    window: int | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Encode head + each listed row's text; return the rows that do not give back exactly their ids, and texts.

    With `window`, only the head's last `window` tokens are encoded in front of each row (the head
    itself was verified on its own): valid for tokenizers whose pre-tokenizer splits this vocabulary
    at every token boundary, as Llama-3's does (see LOCAL_WINDOW).
    """
    texts = [head_text + vocab.join(pos[r]) for r in rows]
    if window is not None and head_ids.size > window:
        head_ids = head_ids[-window:]
        head_text = vocab.join(np.searchsorted(vocab.ids, head_ids))
    encode_texts = [head_text + vocab.join(pos[r]) for r in rows] if window is not None else texts
    length = head_ids.size + pos.shape[1]
    per_batch = max(1, _BATCH_TOKENS // max(length, 1))
    bad: list[int] = []
    for start in range(0, len(rows), per_batch):
        chunk = rows[start : start + per_batch]
        encoded = encode_batch(tok, encode_texts[start : start + per_batch])
        for r, ids in zip(chunk, encoded, strict=True):
            got = np.asarray(ids, dtype=np.int64)
            if (
                got.size != length
                or not np.array_equal(got[: head_ids.size], head_ids)
                or not np.array_equal(got[head_ids.size :], vocab.ids[pos[r]])
            ):
                bad.append(int(r))
    return np.asarray(bad, dtype=np.int64), texts


def _fill(
    rng: np.random.Generator,
    rows: int,
    length: int,
    vocab: SafeVocabulary,
    tok: Any,
    head_text: str,
    head_ids: np.ndarray,
    parity: int | None,
    name: Callable[[int], str],
    window: int | None = None,
) -> tuple[np.ndarray, list[str], int]:
    """Draw `rows` distinct segments of `length` tokens that verify after `head`; return positions, texts, redraws."""
    m = len(vocab)
    pos = draw_positions(rng, rows, length, m, parity)
    texts: list[str] = [""] * rows
    pending = np.arange(rows)
    redrawn = 0
    for _attempt in range(MAX_ATTEMPTS):
        dup = _duplicates(pos)
        for _round in range(MAX_ATTEMPTS):
            if not dup.size:
                break
            pos[dup] = draw_positions(rng, dup.size, length, m, parity)
            redrawn += int(dup.size)
            pending = np.union1d(pending, dup)
            dup = _duplicates(pos)
        if dup.size:
            raise PromptError(
                f"cannot draw {rows} distinct segments of {length} token(s) from {m} safe tokens "
                f"({name(int(dup[0]))} keeps duplicating another)"
            )
        bad, new_texts = _verify(tok, vocab, head_text, head_ids, pos, pending, window)
        for r, text in zip(pending, new_texts, strict=True):
            texts[r] = text
        if not bad.size:
            return pos, texts, redrawn
        pos[bad] = draw_positions(rng, bad.size, length, m, parity)
        redrawn += int(bad.size)
        pending = bad
    names = ", ".join(name(int(r)) for r in bad[:5])
    raise PromptError(
        f"tokenizer {vocab.tokenizer!r}: after {MAX_ATTEMPTS} attempts the text of {names}"
        f"{' ...' if bad.size > 5 else ''} still does not encode back to exactly its {length} drawn token(s)"
    )


def build_prompts(
    seed: int,
    request_ids: Sequence[str],
    sharing: float,
    prompt_tokens: int,
    tokenizer: str = DEFAULT_TOKENIZER,
) -> PromptSet:
    """The verified prompts of a trace: prefix from stream "prefix", suffixes from stream "suffix"."""
    if not 0 <= sharing < 1:
        raise ValueError(f"sharing must be in [0, 1), got {sharing!r}")
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be a positive integer, got {prompt_tokens!r}")
    f = prefix_length(sharing, prompt_tokens)
    d = prompt_tokens - f
    if d < 1:
        raise ValueError(
            f"sharing {sharing} leaves no unique suffix at prompt_tokens={prompt_tokens}"
        )
    tok = load_tokenizer(tokenizer)
    vocab = safe_vocabulary(tokenizer)
    empty = np.empty(0, dtype=np.int64)

    prefix_ids, prefix_text, redrawn = empty, "", 0
    if f > 0:
        prefix_pos, prefix_texts, redrawn = _fill(
            substream(seed, "prefix"),
            1,
            f,
            vocab,
            tok,
            "",
            empty,
            TRACE_PARITY,
            lambda _r: "the shared prefix",
        )
        prefix_ids = vocab.ids[prefix_pos[0]].astype(np.int64)
        prefix_text = prefix_texts[0]
    suffix_pos, texts, more = _fill(
        substream(seed, "suffix"),
        len(request_ids),
        d,
        vocab,
        tok,
        prefix_text,
        prefix_ids,
        TRACE_PARITY if f == 0 else None,
        lambda r: f"request {request_ids[r]}",
        LOCAL_WINDOW if tokenizer == DEFAULT_TOKENIZER else None,
    )
    token_ids = np.empty((len(request_ids), prompt_tokens), dtype=np.int32)
    token_ids[:, :f] = prefix_ids
    token_ids[:, f:] = vocab.ids[suffix_pos]
    return PromptSet(
        prefix_ids=prefix_ids.astype(np.int32),
        prefix_text=prefix_text,
        token_ids=token_ids,
        texts=texts,
        vocab=vocab,
        redrawn=redrawn + more,
    )


def warmup_prompts(
    seed: int, n: int, prompt_tokens: int, tokenizer: str = DEFAULT_TOKENIZER
) -> list[tuple[str, list[int]]]:
    """`n` distinct warm-up prompts of exactly `prompt_tokens` tokens: (text, token ids), deterministic in `seed`.

    Drawn from stream "warmup", and their first token never equals the first token of any trace prompt, so they
    share no prefix with the trace (see the module docstring). Pass the trace's seed.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be a positive integer, got {prompt_tokens!r}")
    if n == 0:
        return []
    tok = load_tokenizer(tokenizer)
    vocab = safe_vocabulary(tokenizer)
    pos, texts, _ = _fill(
        substream(seed, "warmup"),
        n,
        prompt_tokens,
        vocab,
        tok,
        "",
        np.empty(0, dtype=np.int64),
        WARMUP_PARITY,
        lambda r: f"warm-up prompt {r}",
    )
    return [(texts[r], vocab.ids[pos[r]].tolist()) for r in range(n)]
