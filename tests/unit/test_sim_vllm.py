"""Mechanism tests of the vLLM-0.6.3-V0-like engine model (servelab.sim.vllm)."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.sim.testing import drive, small_vllm

RNG = np.random.default_rng(7)


def toks(n: int, start: int | None = None) -> np.ndarray:
    """n distinct-looking token ids (a fresh random draw unless `start` pins a deterministic run)."""
    if start is not None:
        return np.arange(start, start + n, dtype=np.int64)
    return RNG.integers(1000, 100_000, size=n).astype(np.int64)


def mixed_workload(n: int = 24, prefix_len: int = 300) -> list[tuple[float, str, np.ndarray, int]]:
    prefix = toks(prefix_len)
    return [
        (0.25 * i, f"r{i}", np.concatenate((prefix, toks(200))), 64 if i % 3 else 128)
        for i in range(n)
    ]


def test_without_chunking_no_iteration_mixes_prefill_and_decode() -> None:
    its = drive(small_vllm(kv_tokens=16384, chunked=False), mixed_workload())
    assert any(it.kind == "prefill" for it in its) and any(it.kind == "decode" for it in its)
    for it in its:
        assert it.prefill_tokens == 0 or it.decode_tokens == 0, it


def test_with_chunking_decodes_and_prefill_chunks_share_iterations() -> None:
    its = drive(small_vllm(kv_tokens=16384, chunked=True, budget=512), mixed_workload())
    mixed = [it for it in its if it.kind == "mixed"]
    assert mixed, "chunked prefill should put decodes and prefill chunks in one iteration"
    for it in its:
        assert it.prefill_tokens + it.decode_tokens <= 512


def test_chunks_round_down_to_whole_blocks_under_prefix_caching() -> None:
    m = small_vllm(kv_tokens=16384, chunked=True, budget=64)
    arrivals = [(0.0, "a", toks(40), 50), (0.001, "b", toks(300), 4)]
    its = drive(m, arrivals)
    # while "a" decodes (1 token of budget), "b" gets (63 // 16) * 16 = 48 tokens per chunk
    b_chunks = [it.prefill_tokens for it in its if it.kind == "mixed"]
    assert b_chunks and all(c == 48 for c in b_chunks[:-1])
    assert sum(b_chunks) == 301  # BOS + 300, the last chunk is the remainder


def test_prefix_cache_reuses_only_whole_16_token_blocks() -> None:
    m = small_vllm(kv_tokens=16384)
    shared = toks(37)  # + BOS = 38 shared tokens: two full blocks (32) and a partial one
    first = drive(m, [(0.0, "a", np.concatenate((shared, toks(40))), 2)])
    assert first[0].cached_tokens == 0
    second = drive(
        m, [(first[-1].end_s, "b", np.concatenate((shared, toks(40))), 2)], start_s=first[-1].end_s
    )
    assert second[0].kind == "prefill"
    assert second[0].cached_tokens == 32
    assert second[0].computed_tokens == 78 - 32
    assert m.metrics()["vllm:gpu_prefix_cache_hit_rate"] == pytest.approx(2 / (4 + 4))


def test_last_block_is_never_a_cache_hit_and_cached_tokens_count_against_the_budget() -> None:
    m = small_vllm(kv_tokens=16384)
    prompt = toks(63)  # + BOS = 64 tokens = exactly 4 full blocks
    a = drive(m, [(0.0, "a", prompt, 2)])
    b = drive(m, [(a[-1].end_s, "b", prompt.copy(), 2)], start_s=a[-1].end_s)
    assert b[0].cached_tokens == 48  # 3 of 4 blocks: the last block is recomputed
    assert b[0].prefill_tokens == 64  # the scheduler still charges the whole prompt
    assert m.metrics()["vllm:prompt_tokens_total"] == 128


def test_fcfs_head_of_line_blocking() -> None:
    m = small_vllm(kv_tokens=40 * 16)  # 40 blocks, watermark 0
    arrivals = [
        (0.0, "big-running", toks(479), 40),  # 30 blocks, grows to 33
        (0.001, "head", toks(299), 4),  # 19 blocks: does not fit while big-running holds 30+
        (0.002, "small", toks(19), 4),  # 2 blocks: would fit, but waits behind the head
    ]
    its = drive(m, arrivals)
    first_token = {}
    finished_at = {}
    for it in its:
        for rid in it.finished:
            finished_at[rid] = it.end_s
    for rid in ("big-running", "head", "small"):
        first_token[rid] = m.token_times(rid)[0]
    assert first_token["small"] >= first_token["head"] > finished_at["big-running"] - 1e-9


def test_full_cache_preempts_the_most_recent_request_and_every_request_completes() -> None:
    m = small_vllm(kv_tokens=32 * 16)  # 32 blocks
    arrivals = [(0.0, f"r{i}", toks(99), 200) for i in range(3)]  # 7 blocks each, up to 19
    its = drive(m, arrivals)
    preempted = [rid for it in its for rid in it.preempted]
    assert preempted, "the cache is too small for three 300-token sequences: expected preemption"
    assert preempted[0] == "r2"  # the most recently admitted request is the victim
    assert m.num_preemptions == len(preempted)
    for i in range(3):
        times = m.token_times(f"r{i}")
        assert len(times) == 200 and np.all(np.diff(times) >= 0)
    assert m.free_blocks() == m.total_blocks  # everything freed (cached blocks count as free)


def test_recomputed_request_reuses_its_own_cached_blocks() -> None:
    m = small_vllm(kv_tokens=32 * 16)
    arrivals = [(0.0, f"r{i}", toks(99), 200) for i in range(3)]
    its = drive(m, arrivals)
    # the re-prefill after preemption finds the victim's freed (evictable, still hashed) blocks
    recomputes = [it for it in its if it.kind == "prefill" and it.cached_tokens > 0]
    assert recomputes


def test_lru_eviction_keeps_the_recently_used_prefix() -> None:
    m = small_vllm(kv_tokens=64 * 16)
    old, new = toks(320), toks(320)
    t = 0.0
    for rid, ids in (("old", old), ("new", new)):
        its = drive(m, [(t, rid, ids, 2)], start_s=t)
        t = its[-1].end_s + 1.0
    # each prompt left 20 hashed (evictable) blocks; 24 blocks are hashless-free. A 600-token prompt
    # needs 38 blocks: 24 free ones, then 14 evicted from the least recently used prompt ("old"),
    # deepest block first, so "old" keeps its first 6 blocks and "new" keeps all 20.
    its = drive(m, [(t, "filler", toks(599), 2)], start_s=t)
    t = its[-1].end_s + 1.0
    probe_new = drive(m, [(t, "probe-new", new.copy(), 2)], start_s=t)
    t = probe_new[-1].end_s + 1.0
    probe_old = drive(m, [(t, "probe-old", old.copy(), 2)], start_s=t)
    assert probe_new[0].cached_tokens == 20 * 16
    assert probe_old[0].cached_tokens == 6 * 16


def test_abort_frees_blocks() -> None:
    m = small_vllm(kv_tokens=64 * 16)
    m.add_request("x", toks(200), 100, 0.0)
    it = m.step(0.0)
    assert it.kind == "prefill" and m.kv_usage() > 0
    m.abort("x")
    assert m.free_blocks() == m.total_blocks and not m.has_work()


def test_prompt_longer_than_the_limit_is_rejected() -> None:
    m = small_vllm(kv_tokens=64 * 16, chunked=False, budget=2048)
    m.add_request("long", toks(3000), 4, 0.0)
    it = m.step(0.0)
    assert it.rejected == ("long",) and "too long" in (m.error("long") or "")
