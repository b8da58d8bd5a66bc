"""L3 prompts: exact token counts, exact shared prefix ids, achieved sharing, warm-up prompts, tokenizers."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import transformers

from servelab.grid.config import conditions, load_config, trace_seed
from servelab.workload.prompts import (
    PromptError,
    build_prompts,
    prefix_length,
    warmup_prompts,
)
from servelab.workload.tokenizer import (
    TokenizerError,
    default_tokenizer_file,
    load_tokenizer,
    safe_vocabulary,
)

CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
SAMPLE = [
    "g00000-planner",
    "g00000-w1",
    "g00000-w4",
    "g00000-aggregator",
    "g00007-w2",
    "g00100-aggregator",
]


@cache
def transformers_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """The offline default through transformers: an oracle independent of servelab's loader."""
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(default_tokenizer_file()))


def encode(texts: list[str]) -> list[list[int]]:
    """Independent check through transformers' public call (not the compiler's batch path)."""
    return transformers_tokenizer()(texts, add_special_tokens=False)["input_ids"]


def shared_prefix(rows: list[list[int]]) -> int:
    n = min(map(len, rows))
    for i in range(n):
        if any(r[i] != rows[0][i] for r in rows):
            return i
    return n


@pytest.mark.parametrize("cid", list(conditions(load_config(CONFIG))))
def test_every_condition_gives_exact_prompts(cid: str) -> None:
    cond = conditions(load_config(CONFIG))[cid]
    seed = trace_seed(int(load_config(CONFIG)["campaign_seed"]), cid, "rep1")
    p = build_prompts(seed, SAMPLE, cond.sharing, cond.prompt_tokens)
    f = prefix_length(cond.sharing, cond.prompt_tokens)
    encoded = encode(p.texts)
    for rid, text, ids, row in zip(SAMPLE, p.texts, encoded, p.token_ids, strict=True):
        assert len(ids) == cond.prompt_tokens, rid
        assert ids == row.tolist(), rid
        assert ids[:f] == p.prefix_ids.tolist(), rid
        assert text.startswith(p.prefix_text), rid
    assert encode([p.prefix_text])[0] == p.prefix_ids.tolist()
    assert abs(shared_prefix(encoded) / cond.prompt_tokens - cond.sharing) <= 0.01


@pytest.mark.parametrize("sharing", [0.0, 0.3, 0.6, 0.9, 0.95])
def test_achieved_sharing_within_one_percent(sharing: float) -> None:
    assert any(c.sharing == sharing for c in conditions(load_config(CONFIG)).values())
    p = build_prompts(31337, SAMPLE, sharing, 4096)
    encoded = encode(p.texts)
    achieved = shared_prefix(encoded) / 4096
    assert abs(achieved - sharing) <= 0.01, achieved
    assert p.prefix_tokens == round(sharing * 4096)
    if sharing == 0.0:
        assert p.prefix_text == "" and p.prefix_ids.size == 0


def test_suffixes_are_distinct_and_prompts_deterministic() -> None:
    a = build_prompts(5, SAMPLE, 0.9, 512)
    b = build_prompts(5, SAMPLE, 0.9, 512)
    assert a.texts == b.texts and np.array_equal(a.token_ids, b.token_ids)
    f = a.prefix_tokens
    assert len({row[f:].tobytes() for row in a.token_ids}) == len(SAMPLE)
    c = build_prompts(6, SAMPLE, 0.9, 512)
    assert not np.array_equal(a.prefix_ids, c.prefix_ids)


def test_tiny_suffixes_are_redrawn_until_distinct() -> None:
    # D = 1 token for 300 requests from ~43k safe tokens: a birthday collision is likely (≈65%), and
    # this seed has one, so the duplicate must have been redrawn.
    ids = [f"r{i}" for i in range(300)]
    p = build_prompts(9, ids, 0.95, 20)
    assert p.token_ids.shape == (300, 20)
    assert p.redrawn > 0
    assert len({row[19:].tobytes() for row in p.token_ids}) == 300


def test_impossible_distinctness_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = safe_vocabulary()
    monkeypatch.setattr(
        "servelab.workload.prompts.safe_vocabulary",
        lambda name: type(vocab)(
            vocab.tokenizer, vocab.ids[:2], vocab.texts[:2], vocab.vocab_size, "x"
        ),
    )
    with pytest.raises(PromptError, match="distinct"):
        build_prompts(1, [f"r{i}" for i in range(5)], 0.5, 2)


def test_a_failing_segment_is_redrawn_then_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tokenizer whose output never matches: the compiler must not accept the prompt.
    def bad_encode(tok: object, texts: list[str]) -> list[list[int]]:
        return [[0] for _ in texts]

    monkeypatch.setattr("servelab.workload.prompts.encode_batch", bad_encode)
    with pytest.raises(PromptError, match="shared prefix"):
        build_prompts(1, SAMPLE, 0.5, 64)
    with pytest.raises(PromptError, match="request g00000-planner"):
        build_prompts(1, SAMPLE, 0.0, 64)


def test_warmup_prompts_are_exact_distinct_and_share_no_prefix_with_traces() -> None:
    warm = warmup_prompts(12, 20, 256)
    assert warm == warmup_prompts(12, 20, 256)
    assert len({t for t, _ in warm}) == 20
    assert [ids for _, ids in warm] == encode([t for t, _ in warm])
    assert all(len(ids) == 256 for _, ids in warm)
    warm_first = {ids[0] for _, ids in warm}
    for seed in range(12, 20):
        for sharing in (0.0, 0.9):
            trace = build_prompts(seed, SAMPLE, sharing, 256)
            assert warm_first.isdisjoint(set(trace.token_ids[:, 0].tolist()))
    assert warmup_prompts(12, 0, 256) == []


def test_safe_vocabulary_tokens_round_trip_alone_and_together() -> None:
    vocab = safe_vocabulary()
    assert 20_000 < len(vocab) < 128_000
    tok = load_tokenizer()
    assert not set(vocab.ids.tolist()) & set(tok.backend_tokenizer.get_added_tokens_decoder())
    assert all(t.startswith(" ") and t[1:].isascii() and t[1:].isalpha() for t in vocab.texts)
    sample = vocab.ids[::997]
    assert encode(["".join(vocab.texts[::997])])[0] == sample.tolist()


def test_the_offline_default_has_the_special_ids_transformers_gives_it() -> None:
    # safe_vocabulary excludes them: a difference would change every trace
    assert list(load_tokenizer().all_special_ids) == transformers_tokenizer().all_special_ids


def test_a_model_id_is_loaded_offline_from_a_local_copy(tmp_path: Path) -> None:
    transformers_tokenizer().save_pretrained(tmp_path)
    other = load_tokenizer(str(tmp_path))
    assert other is not load_tokenizer()
    text = build_prompts(3, SAMPLE[:2], 0.5, 128).texts[0]
    assert other(text, add_special_tokens=False)["input_ids"] == encode([text])[0]


def test_an_uncached_model_id_is_a_clear_error() -> None:
    with pytest.raises(TokenizerError, match="not available offline"):
        load_tokenizer("servelab-test/no-such-tokenizer-anywhere")
