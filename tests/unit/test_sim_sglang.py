"""Mechanism tests of the SGLang-0.4.1-like engine model and its radix cache (servelab.sim.sglang)."""

from __future__ import annotations

import numpy as np

from servelab.sim.radix import RadixCache, key_bytes
from servelab.sim.testing import drive, small_sglang, small_vllm

RNG = np.random.default_rng(11)


def toks(n: int) -> np.ndarray:
    return RNG.integers(1000, 100_000, size=n).astype(np.int64)


def k(*ids: int) -> bytes:
    return key_bytes(np.array(ids, dtype=np.int64))


# ---------------------------------------------------------------- radix tree


def test_radix_match_splits_and_insert_reports_the_present_prefix() -> None:
    t = RadixCache()
    assert t.insert(k(1, 2, 3, 4, 5), 0.0) == 0
    assert t.insert(k(1, 2, 3, 9), 1.0) == 3  # shares 3 tokens, the edge is split
    m, node = t.match_prefix(k(1, 2, 3, 4, 7), 2.0)
    assert m == 4 and node.path_tokens() == 4  # the match ends inside an edge: split there
    assert t.total_size() == 6 and t.evictable_size == 6


def test_radix_evicts_unlocked_leaves_least_recently_used_first() -> None:
    t = RadixCache()
    t.insert(k(1, 2, 3), 0.0)  # shared trunk [1 2 3]
    t.insert(k(1, 2, 3, 10, 11), 1.0)
    t.insert(k(1, 2, 3, 20, 21), 2.0)
    t.insert(k(1, 2, 3, 30, 31), 3.0)
    _, locked = t.match_prefix(k(1, 2, 3, 10, 11), 4.0)  # touched last, then locked
    t.inc_lock_ref(locked)
    assert t.evict(2) == 2  # the oldest unlocked leaf: [20 21]
    assert t.match_prefix(k(1, 2, 3, 20, 21), 5.0)[0] == 3
    assert t.match_prefix(k(1, 2, 3, 30, 31), 6.0)[0] == 5
    assert t.evict(100) == 2  # [30 31] goes; the trunk stays (its locked child keeps it alive)
    assert t.match_prefix(k(1, 2, 3, 10, 11), 7.0)[0] == 5
    t.dec_lock_ref(locked)
    assert t.evict(100) == 5 and t.total_size() == 0


# ---------------------------------------------------------------- engine model


def test_prefix_cache_matches_any_length() -> None:
    m = small_sglang()
    shared = toks(37)  # + BOS: 38 shared tokens (vLLM would reuse 32)
    a = drive(m, [(0.0, "a", np.concatenate((shared, toks(40))), 2)])
    b = drive(m, [(a[-1].end_s, "b", np.concatenate((shared, toks(40))), 2)], start_s=a[-1].end_s)
    assert b[0].kind == "prefill" and b[0].cached_tokens == 38
    assert b[0].computed_tokens == 40
    v = small_vllm()
    a = drive(v, [(0.0, "a", np.concatenate((shared, toks(40))), 2)])
    b = drive(v, [(a[-1].end_s, "b", np.concatenate((shared, toks(40))), 2)], start_s=a[-1].end_s)
    assert b[0].cached_tokens == 32


def test_prefix_match_is_capped_one_token_short_of_the_prompt() -> None:
    m = small_sglang()
    prompt = toks(50)
    a = drive(m, [(0.0, "a", prompt, 2)])
    b = drive(m, [(a[-1].end_s, "b", prompt.copy(), 2)], start_s=a[-1].end_s)
    assert b[0].cached_tokens == 50 and b[0].computed_tokens == 1  # 51 tokens with BOS


def _first_token_order(policy: str, n_filler: int = 0) -> list[str]:
    m = small_sglang(chunk=64, policy=policy)
    base = toks(300)
    warm = drive(m, [(0.0, "warm", base, 2)])
    t = warm[-1].end_s
    arrivals = [(t, f"f{i:03d}", toks(100), 2) for i in range(n_filler)]
    arrivals += [
        (t, "x1-none", toks(300), 2),  # arrival order = name order (drive sorts ties by id)
        (t, "x2-some", np.concatenate((base[:100], toks(200))), 2),
        (t, "x3-most", np.concatenate((base[:280], toks(20))), 2),
    ]
    drive(m, arrivals, start_s=t)
    names = [a[1] for a in arrivals[-3:]]
    return sorted(names, key=lambda rid: m.token_times(rid)[0])


def test_longest_prefix_match_serves_the_longest_cached_prefix_first() -> None:
    assert _first_token_order("lpm") == ["x3-most", "x2-some", "x1-none"]
    assert _first_token_order("fcfs") == ["x1-none", "x2-some", "x3-most"]


def _first_batch_takes_longest_prefix(n_waiting: int) -> bool:
    """Queue [no-prefix head, fillers..., long-prefix tail]: is the tail served in the first batch?"""
    m = small_sglang(chunk=64)
    base = toks(300)
    warm = drive(m, [(0.0, "warm", base, 2)])
    t = warm[-1].end_s
    m.add_request("head", toks(300), 2, t)
    for i in range(n_waiting - 2):
        m.add_request(f"filler{i}", toks(100), 2, t)
    m.add_request("tail", np.concatenate((base[:280], toks(20))), 2, t)
    m.step(t)
    return len(m.token_times("tail")) == 1


def test_lpm_falls_back_to_fcfs_above_128_waiting() -> None:
    assert _first_batch_takes_longest_prefix(128)
    assert not _first_batch_takes_longest_prefix(129)


def test_one_prefill_batch_holds_at_most_chunk_size_new_tokens_and_hits_are_free() -> None:
    m = small_sglang(chunk=256)
    base = toks(1000)
    warm = drive(m, [(0.0, "warm", base, 2)])
    chunks = [it.computed_tokens for it in warm if it.kind == "prefill"]
    assert chunks == [256, 256, 256, 233]  # 1001 tokens with BOS, one request chunked at a time
    t = warm[-1].end_s
    # 900 cached tokens + 100 new: one batch, the hits do not consume the chunk budget
    again = drive(m, [(t, "again", np.concatenate((base[:899], toks(101))), 2)], start_s=t)
    assert again[0].kind == "prefill" and again[0].computed_tokens == 101
    assert again[0].cached_tokens == 900


def test_prefill_and_decode_never_share_an_iteration() -> None:
    m = small_sglang(kv_tokens=16384)
    prefix = toks(300)
    arrivals = [(0.2 * i, f"r{i}", np.concatenate((prefix, toks(200))), 64) for i in range(20)]
    its = drive(m, arrivals)
    assert {it.kind for it in its} == {"prefill", "decode"}
    for it in its:
        assert it.prefill_tokens == 0 or it.decode_tokens == 0


def test_decode_batches_above_cuda_graph_max_bs_run_eagerly() -> None:
    m = small_sglang(kv_tokens=16384)
    its = drive(m, [(0.0, f"r{i}", toks(50), 30) for i in range(12)])
    decodes = [it for it in its if it.kind == "decode"]
    assert any(it.batch_size > 8 for it in decodes)
    for it in decodes:
        assert it.cuda_graph == (it.batch_size <= 8)


def test_full_cache_retracts_fewest_outputs_first_and_every_request_completes() -> None:
    m = small_sglang(kv_tokens=1400, chunk=None)
    arrivals = [(0.0, f"r{i}", toks(100), 400) for i in range(2)]
    arrivals += [(3.0, f"late{i}", toks(100 + 20 * i), 400) for i in range(3)]
    its = drive(m, arrivals)
    retracted = [(it.start_s, rid) for it in its for rid in it.preempted]
    assert retracted, "expected the decode batch to run out of KV slots"
    # the first retraction takes a request with the fewest outputs: one of the late arrivals, and
    # among equal outputs the one with the longest prompt
    assert retracted[0][1].startswith("late")
    assert m.num_retractions == len(retracted)
    for rid in [a[1] for a in arrivals]:
        assert len(m.token_times(rid)) == 400
    assert m.available + m.tree.evictable_size == m.total


def test_new_token_ratio_decays_and_is_reestimated_on_retraction() -> None:
    m = small_sglang(kv_tokens=16384)
    drive(m, [(0.0, "a", toks(50), 100)])
    assert m.new_token_ratio < m.init_ratio
    assert m.new_token_ratio >= m.min_ratio


def test_gauges_refresh_only_at_prefill_and_every_40_decode_steps() -> None:
    m = small_sglang(kv_tokens=16384)
    m.add_request("a", toks(200), 100, 0.0)
    it = m.step(0.0)
    assert it.kind == "prefill"
    usage_after_prefill = m.metrics()["sglang:num_used_tokens"]
    now = it.end_s
    for _ in range(39):
        now = m.step(now).end_s
    assert m.metrics()["sglang:num_used_tokens"] == usage_after_prefill
    m.step(now)
    assert m.metrics()["sglang:num_used_tokens"] > usage_after_prefill


def test_retraction_order_breaks_ties_by_longest_prompt() -> None:
    m = small_sglang(kv_tokens=4000)
    for rid, n in (("p20", 20), ("p60", 60), ("p40", 40)):
        m.add_request(rid, toks(n), 500, 0.0)
    now = 0.0
    while len(m.dec) < 3:  # one prefill batch admits all three: equal outputs from then on
        now = m.step(now).end_s
    for _ in range(5):
        now = m.step(now).end_s
    m.tree.evict(10**9)
    m.available = 0  # the pool is exhausted: the next decode step must retract
    it = m.step(now)
    assert it.kind == "decode"
    # equal outputs: the longest prompt goes first; freeing its outputs and evicting its (now
    # unlocked) prompt leaves the 20 steps of room for the other two, so retraction stops there
    assert it.preempted == ("p60",)
    assert m.num_retractions == 1 and m.waiting[-1].rid == "p60"
    assert m.available >= 2 * 20 - 2
