"""Mechanism tests of the llama.cpp llama-server (0c1e570) scheduler model (servelab.sim.llamacpp)
and of the simulated llama-server start-up log (servelab.engines.llamacpp.render_startup_log).

Each test drives hand-made arrivals through the model with a linear fake cost (a fixed time per
forward pass plus a time per token), so a forward pass, a batch's composition and a micro-batch
count can each be read off the durations or the recorded calls.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servelab.engines import (
    ENGINE_METRICS,
    METRIC_MAP,
    check_resolved,
    parse_startup_log,
    render_startup_log,
    resolve,
)
from servelab.engines.llamacpp import server_settings
from servelab.sim.cpu_platform import StepCost
from servelab.sim.llamacpp import LlamacppModel
from servelab.sim.models import engine_params, simulated_engine
from servelab.sim.params import EngineParams
from servelab.sim.presets import gpu_preset, model_preset
from servelab.sim.run import sim_deploy
from servelab.sim.testing import drive

PRESET = model_preset("llama-3.1-8b")  # BOS 128000 is prepended to every prompt
STEP_S = 0.010  # per forward pass (micro-batch)
TOKEN_S = 0.0001  # per token computed
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "llamacpp"


class LinearCost:
    """A fake cost model: STEP_S per forward pass plus TOKEN_S per token; records each call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def iteration_time(self, **kw: Any) -> float:
        self.calls.append(kw)
        assert kw["cuda_graph"] is False
        return STEP_S + TOKEN_S * kw["tokens"]


def make(
    *,
    n_batch: int = 2048,
    n_ubatch: int | None = 512,
    slots: int = 4,
    n_ctx_slot: int = 8192,
    unified: bool = True,
    cache_ram_mib: int = 8192,
    cells: int | None = None,
    cache_prompt: bool = True,
    http_threads: int = 0,
) -> tuple[LlamacppModel, LinearCost]:
    chunked = n_batch < n_ctx_slot
    params = EngineParams(
        engine="llamacpp",
        chunked_prefill=chunked,
        chunk_size=n_batch if chunked else None,
        token_budget=n_batch,
        prefix_caching=cache_prompt,
        context_len=n_ctx_slot,
        max_running=slots,
        kv_capacity_tokens=cells or (n_ctx_slot if unified else n_ctx_slot * slots),
        prompt_limit=n_ctx_slot - 1,
        block_size=1,
        cuda_graph_max_bs=0,
        overlap_schedule=False,
        ubatch_size=n_ubatch,
        kv_unified=unified,
        cache_ram_mib=cache_ram_mib,
        http_threads=http_threads,
    )
    cost = LinearCost()
    return LlamacppModel(params, PRESET, cost), cost


def toks(n: int, start: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def slot_of(m: LlamacppModel, rid: str) -> int:
    return m.reqs[rid].phase


# ----------------------------------------------------------------------------- the batch


def test_a_long_prompt_is_cut_at_n_batch_and_interleaved_with_decode_tokens() -> None:
    m, _ = make(n_batch=256)
    its = drive(m, [(0.0, "a", toks(49, 1000), 40), (0.05, "b", toks(699, 5000), 2)])
    # "a" (50 tokens) is prefilled alone and decodes; "b" (700) then goes in pieces of
    # 256 - 1: the decode token of "a" takes one place of the budget in every iteration
    b_iters = [it for it in its if it.prefill_tokens and it.start_s >= 0.05]
    assert [it.prefill_tokens for it in b_iters] == [255, 255, 190]
    assert all(it.kind == "mixed" and it.decode_tokens == 1 for it in b_iters)
    assert all(it.emitted[0] == "a" for it in b_iters)  # "a" gets a token in each of them
    # "b"'s first token comes with the iteration that finishes its prompt, not before
    assert b_iters[-1].emitted == ("a", "b") and "b" not in b_iters[-2].emitted
    assert m.token_times("b")[0] == pytest.approx(b_iters[-1].end_s)


def test_decode_tokens_come_first_and_prompts_follow_in_slot_order() -> None:
    m, cost = make(n_batch=64, n_ubatch=4)
    # three short requests decode while a long one prefills; simultaneous arrivals take the
    # slots from the last id down (LRU ties go to the highest slot id)
    arrivals = [(0.0, f"d{i}", toks(3, 100 * i + 10), 50) for i in range(3)]
    its = drive(m, [*arrivals, (0.1, "p", toks(299, 9000), 1)])
    assert [slot_of(m, f"d{i}") for i in range(3)] == [3, 2, 1]
    # the first iteration holds the three prompts in slot order: d2 (slot 1), d1, d0
    assert its[0].prefill_tokens == 12 and its[0].emitted == ("d2", "d1", "d0")
    mixed = [it for it in its if it.kind == "mixed"]
    assert mixed and all(it.decode_tokens == 3 for it in mixed)
    assert all(it.prefill_tokens == 64 - 3 for it in mixed[:-1])
    # each mixed batch is cut into 4-token micro-batches: the first holds the three decode
    # tokens (each sampled) and one prompt token
    first_mixed = its.index(mixed[0])
    calls_before = sum(-(-(it.prefill_tokens + it.decode_tokens) // 4) for it in its[:first_mixed])
    assert cost.calls[calls_before]["sampled"] == 3 and cost.calls[calls_before]["tokens"] == 4
    assert cost.calls[calls_before + 1]["sampled"] == 0


def test_the_micro_batch_count_drives_an_iterations_duration() -> None:
    durations = {}
    for n_ubatch in (512, 128):
        m, cost = make(n_batch=512, n_ubatch=n_ubatch)
        its = drive(m, [(0.0, "a", toks(511, 1000), 1)])  # 512 tokens with BOS, one iteration
        assert len(its) == 1
        durations[n_ubatch] = its[0].duration_s
        assert len(cost.calls) == 512 // n_ubatch
        assert [c["tokens"] for c in cost.calls] == [n_ubatch] * (512 // n_ubatch)
        assert sum(c["sampled"] for c in cost.calls) == 1  # the prompt's last token only
    # same tokens, four forward passes instead of one
    assert durations[128] - durations[512] == pytest.approx(3 * STEP_S)


def test_without_a_unified_kv_cache_micro_batches_take_equal_shares_of_consecutive_slots() -> None:
    m, cost = make(n_batch=512, n_ubatch=512, unified=False, slots=3, n_ctx_slot=4096)
    # slots 2 and 1 generate ("a", "b"); "c" then prefills in slot 0
    drive(m, [(0.0, "a", toks(9, 100), 30), (0.0, "b", toks(9, 200), 30)])
    assert (slot_of(m, "a"), slot_of(m, "b")) == (2, 1)
    m.add_request("a2", toks(9, 100), 30, 1.0)
    m.add_request("b2", toks(9, 200), 30, 1.0)
    m.step(1.0)  # both back in their slots (prompt similarity), prompts done: both generate
    assert (slot_of(m, "a2"), slot_of(m, "b2")) == (2, 1)
    m.add_request("c", toks(99, 5000), 1, 1.5)
    cost.calls.clear()
    it = m.step(1.5)
    assert it.kind == "mixed" and it.decode_tokens == 2 and it.prefill_tokens == 100
    # split_equal takes a run of consecutive slot ids: [slot 1 decode, slot 2 decode] as one
    # token each, then "c" (slot 0) alone: 2 micro-batches; one KV stream would take 1
    assert [(c["tokens"], c["seqs"]) for c in cost.calls] == [(2, 2), (100, 1)]


def test_each_pass_carries_its_attention_masks_cells_and_host_checks() -> None:
    """llama.cpp's KQ mask: a row of the padded KV view (get_n_kv: used cells padded to 256, at
    most the stream's) for every query token; the host tests all of a sequence's first row and,
    for its later tokens, only its own new cells and up to 32 before them."""
    m, cost = make(n_batch=2048, n_ubatch=512, unified=False, slots=2, n_ctx_slot=1024)
    drive(m, [(0.0, "a", toks(599, 1000), 3)])  # 600 tokens with BOS: micro-batches of 512, 88
    first, second, *decodes = cost.calls
    assert (first["tokens"], second["tokens"]) == (512, 88)
    assert first["mask_cells"] == 512 * 512  # 512 cells used: no padding beyond them
    assert first["mask_checks"] == 512 + 511 * 512  # no cells before the micro-batch
    assert second["mask_cells"] == 88 * 768  # 600 cells used, padded to 768
    assert second["mask_checks"] == 768 + 87 * (88 + 32)
    # a decode token at position 600 and 601: one row, all of it tested; the view stays at 768
    assert [(c["mask_cells"], c["mask_checks"]) for c in decodes] == [(768, 768)] * 2
    # at most the slot's own stream: 901 cells used pad to 1,024, and the stream has 1,000
    m, cost = make(n_batch=2048, n_ubatch=512, unified=False, slots=2, n_ctx_slot=1000)
    drive(m, [(0.0, "b", toks(900, 1000), 1)])
    assert cost.calls[-1]["mask_cells"] == cost.calls[-1]["tokens"] * 1000
    # a 1,024-token prompt in two passes of 512 against four of 256 (docs/simulator.md, "The
    # attention mask's work"): more mask work unchunked, for the same causal pairs
    work = {}
    for n_batch in (2048, 256):
        m, cost = make(n_batch=n_batch, n_ubatch=512, unified=False, slots=2, n_ctx_slot=2048)
        drive(m, [(0.0, "c", toks(1023, 1000), 1)])
        work[n_batch] = (
            sum(c["mask_cells"] for c in cost.calls),
            sum(c["mask_checks"] for c in cost.calls),
        )
    assert work == {2048: (786_432, 541_152), 256: (655_360, 288_160)}


# ------------------------------------------------------------------------- slots and queue


def test_a_fifth_request_waits_for_a_free_slot_and_waiters_keep_arrival_order() -> None:
    m, _ = make(slots=4)
    arrivals = [(0.0, f"r{i}", toks(20, 100 * i + 1000), 3 + i) for i in range(4)]
    arrivals += [(0.001, "w1", toks(20, 7000), 2), (0.002, "w2", toks(20, 8000), 2)]
    _, rid, ids, n = arrivals[0]
    m.add_request(rid, ids, n, 0.0)
    m.step(0.0)
    for t, rid, ids, n in arrivals[1:]:
        m.add_request(rid, ids, n, t)
    m.step(0.01)
    assert m.metrics()["llamacpp:requests_deferred"] == 2.0
    assert m.metrics()["llamacpp:requests_processing"] == 4.0
    its = drive(m, start_s=0.02)
    assert all(m.reqs[rid].out > 0 for rid in ("w1", "w2"))
    # r0 (3 tokens) frees its slot first: w1 takes it; w2 the next one to free (r1's)
    assert slot_of(m, "w1") == slot_of(m, "r0") and slot_of(m, "w2") == slot_of(m, "r1")
    assert m.token_times("w1")[0] < m.token_times("w2")[0]
    assert its[-1].finished and not m.has_work()
    assert m.metrics()["llamacpp:requests_deferred"] == 0.0


def test_every_result_wakes_the_other_held_requests_threads_and_the_next_pass_carries_them() -> (
    None
):
    """A result (a prompt's start signal, a streamed token, a final response) wakes the HTTP
    thread of every other request the server holds, in a slot or deferred; the next pass carries
    those wake-ups, and an idle server drops them."""
    m, cost = make(slots=1)
    for rid, start in (("a", 1000), ("b", 2000), ("c", 3000)):
        m.add_request(rid, toks(3, start), 2, 0.0)
    drive(m, start_s=0.0)
    # a takes the slot, b and c wait (3 held): a's start signal and first token wake 2 each;
    # a's last token and final response wake 4, carried by b's prompt with b's start signal
    # (2 held: 1); b's first token 1, its last two results 2; c alone wakes none
    assert [c["wakeups"] for c in cost.calls] == [2, 2, 5, 1, 2, 0]
    # one request at a time (the floor) wakes none; a request after an idle spell carries none
    m.add_request("d", toks(3, 4000), 2, 10.0)
    drive(m, start_s=10.0)
    assert [c["wakeups"] for c in cost.calls[6:]] == [0, 0]


# ----------------------------------------------------------------------------- the HTTP pool


def _held(m: LlamacppModel) -> int:
    """Requests the server holds: posted, in a slot or waiting for one."""
    m.step(m._last_end)  # process_new_tasks: the posted ones take slots or are deferred
    met = m.metrics()
    return int(met["llamacpp:requests_processing"] + met["llamacpp:requests_deferred"])


def test_a_burst_reaches_the_server_only_as_far_as_the_pool_had_idle_threads() -> None:
    """Sixteen connections at one instant meet eight idle threads: no thread is spawned (the
    pool counts the woken ones idle until they run), so eight requests are posted and the rest
    wait, unheld, each for a thread to finish its request."""
    m, _ = make(slots=4, http_threads=8)
    for i in range(16):
        m.add_request(f"b{i}", toks(20, 1000 * i + 1000), 2, 0.0)
    assert len(m.accepting) == 8 and _held(m) == 8
    drive(m, start_s=0.0)
    assert all(m.reqs[f"b{i}"].out == 2 for i in range(16)) and not m.accepting
    # the waiting eight start only as the first eight end: FIFO, after every first-wave request
    first_end = min(m.token_times(f"b{i}")[-1] for i in range(8))
    assert all(m.token_times(f"b{i}")[0] > first_end for i in range(8, 16))


def test_connections_apart_in_time_each_find_a_thread() -> None:
    """The same sixteen, each at its own time: once the eight fixed threads are busy, the pool
    counts none idle and spawns one for every later connection; all sixteen are held."""
    m, _ = make(slots=4, http_threads=8)
    for i in range(16):
        m.add_request(f"s{i}", toks(20, 1000 * i + 1000), 2, 0.001 * i)
    assert not m.accepting and _held(m) == 16


def test_a_later_connection_spawns_a_thread_that_takes_the_oldest_waiting_one() -> None:
    """After a burst left connections waiting, a connection at a later instant finds no idle
    thread: the pool spawns one, which takes the front of its queue, not the newcomer."""
    m, _ = make(slots=4, http_threads=2)
    for rid in ("a", "b", "c"):
        m.add_request(rid, toks(20, 1000 + ord(rid)), 50, 0.0)
    assert [r.rid for r in m.accepting] == ["c"]
    m.add_request("d", toks(20, 9000), 50, 0.5)
    assert [r.rid for r in m.accepting] == ["d"]
    assert {r.rid for r in m.queue} == {"a", "b", "c"}


def test_an_idle_dynamic_thread_exits_after_the_pools_idle_timeout() -> None:
    """A dynamic thread idle for 3 s exits (ThreadPool::worker); a fixed one stays. Measured by
    what a later burst finds: fewer idle threads, fewer of it posted."""
    m, _ = make(slots=4, http_threads=1)
    for i in range(3):
        m.add_request(f"x{i}", toks(10, 1000 * i + 1000), 1, 0.001 * i)  # one fixed, two spawned
    drive(m, start_s=0.0)
    t = m._last_end
    for i in range(3):
        m.add_request(f"y{i}", toks(10, 1000 * i + 5000), 1, t + 1.0)  # all three threads idle
    assert not m.accepting
    drive(m, start_s=t + 1.0)
    t = m._last_end
    for i in range(3):
        m.add_request(f"z{i}", toks(10, 1000 * i + 9000), 1, t + 3.5)  # the two dynamic ones gone
    assert len(m.accepting) == 2


def test_an_aborted_connection_leaves_the_pools_queue_without_a_thread() -> None:
    m, _ = make(slots=4, http_threads=1)
    m.add_request("a", toks(10, 1000), 5, 0.0)
    m.add_request("b", toks(10, 2000), 5, 0.0)
    assert [r.rid for r in m.accepting] == ["b"]
    m.abort("b")
    assert not m.accepting
    drive(m, start_s=0.0)
    assert m.reqs["a"].out == 5 and m.reqs["b"].out == 0


def test_a_prompt_of_n_ctx_slot_tokens_is_refused_and_outputs_stop_at_the_slot_context() -> None:
    m, _ = make(n_ctx_slot=512, n_batch=512)
    its = drive(m, [(0.0, "long", toks(511, 1000), 4), (0.0, "fits", toks(508, 3000), 100)])
    rejected = [rid for it in its for rid in it.rejected]
    assert rejected == ["long"]  # 512 tokens with BOS >= n_ctx_slot
    assert m.error("long") == (
        "request (512 tokens) exceeds the available context size (512 tokens), try increasing it"
    )
    assert m.output_tokens("long") == 0
    # "fits" (509 tokens): generation stops when its tokens reach n_ctx_slot: 3 outputs
    assert m.output_tokens("fits") == 3 and "fits" in its[-1].finished


# ---------------------------------------------------------------------- prompt reuse


def test_a_shared_prefix_lands_in_the_slot_holding_it_and_only_the_rest_is_computed() -> None:
    m, _ = make()
    prefix = toks(299, 1000)
    first = drive(m, [(0.0, "a", np.concatenate((prefix, toks(100, 20000))), 3)])
    assert slot_of(m, "a") == 3  # all slots unused: LRU ties go to the highest id
    t = first[-1].end_s
    its = drive(m, [(t, "b", np.concatenate((prefix, toks(50, 30000))), 3)], start_s=t)
    # the LRU slot would be 2 (never used); "b" takes slot 3, whose tokens share 300 with it
    assert slot_of(m, "b") == 3
    assert its[0].cached_tokens == 300 and its[0].prefill_tokens == 50
    # the whole prompt cached: its last token is evaluated again for the logits
    t = its[-1].end_s
    again = drive(m, [(t, "c", np.concatenate((prefix, toks(50, 30000))), 3)], start_s=t)
    assert slot_of(m, "c") == 3
    assert again[0].cached_tokens == 349 and again[0].prefill_tokens == 1
    assert m.metrics()["llamacpp:prompt_tokens_cached_total"] == 300 + 349


def test_a_slot_cleared_at_a_launch_gives_its_prefix_through_the_host_prompt_cache() -> None:
    prefix = toks(299, 1000)
    for unified in (True, False):
        m, _ = make(unified=unified)
        drive(m, [(0.0, "a", np.concatenate((prefix, toks(100, 20000))), 2)])
        # "x", unrelated, launches in LRU slot 2: every idle slot is saved to the prompt
        # cache, and with one KV stream cleared; "b" then lands in slot 1 (LRU) while "x" runs
        m.add_request("x", toks(400, 50000), 20, 1.0)
        m.step(1.0)
        m.add_request("b", np.concatenate((prefix, toks(50, 30000))), 2, 1.1)
        it = m.step(1.1)
        assert slot_of(m, "x") == 2
        if unified:
            assert slot_of(m, "b") == 1  # slot 3 was cleared: the LRU slot loads the prefix
        else:
            assert slot_of(m, "b") == 3  # slot 3 kept its tokens: chosen by similarity
        assert it.cached_tokens == 300 and it.prefill_tokens == 50


def test_without_cache_prompt_nothing_is_reused() -> None:
    m, _ = make(cache_prompt=False)
    p = toks(99, 1000)
    first = drive(m, [(0.0, "a", p, 2)])
    t = first[-1].end_s
    its = drive(m, [(t, "b", p, 2)], start_s=t)
    assert its[0].cached_tokens == 0 and its[0].prefill_tokens == 100


# --------------------------------------------------------------- a unified KV cache runs out


def test_a_unified_kv_cache_that_runs_out_fails_every_busy_slot() -> None:
    m, cost = make(n_batch=2048, n_ubatch=2048, cells=1024, n_ctx_slot=1024)
    its = drive(m, [(0.0, "a", toks(599, 1000), 5), (0.0, "b", toks(599, 5000), 5)])
    # 1200 prompt tokens, 1024 cells: half a batch (1024 tokens) is decoded, the rest never fits
    assert [c["tokens"] for c in cost.calls] == [1024]
    assert sorted(its[0].rejected) == ["a", "b"]
    assert m.error("a") == m.error("b") == "Context size has been exceeded."
    assert not m.has_work()


def test_a_batch_that_does_not_fit_is_decoded_in_halves_until_not_one_token_fits() -> None:
    m, cost = make(n_batch=2048, n_ubatch=2048, cells=1024, n_ctx_slot=1024)
    m.add_request("a", toks(499, 1000), 100, 0.0)
    m.step(0.0)  # "a"'s prompt: 500 cells, and its first token
    m.add_request("b", toks(599, 5000), 5, 1.0)
    cost.calls.clear()
    it = m.step(1.0)
    # 601 tokens (a's decode token, b's 600) and 524 free cells: n_batch halved to 512, which
    # fits; of the rest, halving fits 8 tokens, then 4, then not one: both slots fail
    assert [c["tokens"] for c in cost.calls] == [512, 8, 4]
    assert it.emitted == ("a",) and sorted(it.rejected) == ["a", "b"]
    assert m.output_tokens("a") == 2  # its token of this iteration was sampled before the failure
    assert m.error("b") == "Context size has been exceeded." and not m.has_work()


# -------------------------------------------------------------------------------- metrics


def test_metrics_count_what_llama_server_counts() -> None:
    m, _ = make(n_batch=256)
    its = drive(m, [(0.0, "a", toks(299, 1000), 4), (0.0, "b", toks(99, 5000), 2)])
    got = m.metrics()
    assert got["llamacpp:prompt_tokens_total"] == 300 + 100
    assert got["llamacpp:prompt_tokens_cached_total"] == 0
    assert got["llamacpp:tokens_predicted_total"] == 4 + 2
    assert got["llamacpp:n_decode_total"] == len(its)
    assert got["llamacpp:requests_processing"] == got["llamacpp:requests_deferred"] == 0
    # "a" takes slot 3, "b" slot 2: "b"'s prompt goes first (100 tokens) and "a" gets the
    # other 156 of the budget; "b" ends with the second iteration, "a" three later: busy slots
    # per llama_decode call 2, 2, 1, 1, 1
    assert len(its) == 5
    assert got["llamacpp:n_busy_slots_per_decode"] == pytest.approx(7 / 5)
    # prompt time runs from the first prompt piece to the decode that sampled from it
    assert got["llamacpp:prompt_seconds_total"] == pytest.approx(its[1].end_s - its[0].start_s)
    ta, tb = m.token_times("a"), m.token_times("b")
    assert got["llamacpp:tokens_predicted_seconds_total"] == pytest.approx(
        (ta[-1] - ta[0]) + (tb[-1] - tb[0])
    )
    assert "llamacpp:n_tokens_max" not in got
    # every canonical series llama-server has, under its own names, and no name it lacks
    assert set(METRIC_MAP["llamacpp"].values()) <= set(got) <= set(ENGINE_METRICS["llamacpp"])


# ------------------------------------------------------------------ registry and the log


def test_the_registry_builds_it_from_the_resolved_configuration() -> None:
    flags = ["--model=/m.gguf", "--parallel=4", "--ctx-size=8192", "--ubatch-size=128"]
    resolved = resolve("llamacpp", flags, gpu_memory_mib=24000, model_max_position_embeddings=8192)
    sim = simulated_engine("llamacpp")
    cap = sim.kv_capacity(resolved, PRESET, gpu_preset("L4"), 24000)
    assert cap.tokens == 8192 and cap.block_size == 1
    params = engine_params(resolved, kv_capacity_tokens=cap.tokens)
    assert (params.max_running, params.context_len, params.token_budget) == (4, 2048, 2048)
    assert (params.ubatch_size, params.kv_unified, params.cache_ram_mib) == (128, False, 8192)
    # the HTTP pool's fixed threads: n_parallel + 4 on a small host, else --threads-http
    assert params.http_threads == 8
    given = resolve(
        "llamacpp",
        [*flags, "--threads-http=3"],
        gpu_memory_mib=1,
        model_max_position_embeddings=8192,
    )
    assert server_settings(given).http_threads == 3
    assert params.slot_prompt_similarity == 0.1 and params.cuda_graph_max_bs == 0
    model = sim.model(params, PRESET, LinearCost(), track_emitted=False)
    assert isinstance(model, LlamacppModel) and model.equal_split
    auto = resolve(
        "llamacpp", ["--model=/m.gguf"], gpu_memory_mib=1, model_max_position_embeddings=8192
    )
    assert server_settings(auto).kv_unified and server_settings(auto).n_ubatch == 512


def _render(flags: list[str]) -> tuple[Any, Any]:
    resolved = resolve(
        "llamacpp",
        ["--model=/m.gguf", *flags],
        gpu_memory_mib=24000,
        model_max_position_embeddings=8192,
    )
    text = render_startup_log(
        resolved,
        kv_capacity_tokens=int(resolved.max_total_tokens),
        weights_gib=0.03,
        timestamp=datetime(2026, 1, 1),
    )
    return resolved, parse_startup_log(text)


@pytest.mark.parametrize(
    ("flags", "golden"),
    [
        (["--log-verbosity=4"], "0c1e570-lv4-defaults"),
        (["--log-verbosity=4", "--batch-size=256"], "0c1e570-lv4-batch256"),
        (["--log-verbosity=4", "--parallel=2", "--ctx-size=4096"], "0c1e570-lv4-np2-ctx4096"),
    ],
)
def test_the_rendered_start_up_log_parses_back_to_the_resolved_configuration(
    flags: list[str], golden: str
) -> None:
    resolved, parsed = _render(flags)
    assert parsed.engine == "llamacpp" and parsed.ready and parsed.failure is None
    assert parsed.version == resolved.printed_version
    assert (parsed.chunked_prefill, parsed.chunk_size) == (
        resolved.chunked_prefill,
        resolved.chunk_size,
    )
    assert parsed.context_len == resolved.context_len
    st = server_settings(resolved)
    assert parsed.facts["n_batch"] == resolved.token_budget == st.n_batch
    assert parsed.facts["n_ubatch"] == st.n_ubatch
    assert parsed.facts["n_slots"] == resolved.max_running_requests
    assert parsed.facts["n_ctx_slot"] == resolved.context_len
    assert parsed.facts["n_ctx"] == resolved.max_total_tokens
    check_resolved(
        parsed,
        expect_chunked_prefill=resolved.chunked_prefill,
        expect_chunk_size=resolved.chunk_size,
    )
    # the real server started with the same flags printed the same facts (its model's
    # n_ctx_train, a line the renderer does not print, aside)
    real = json.loads((GOLDEN / f"{golden}.json").read_text())["facts"]
    real.pop("n_ctx_train")
    assert dict(parsed.facts) == real


@pytest.mark.parametrize(("flags", "chunk_size"), [([], None), (["--batch-size=256"], 256)])
def test_a_simulated_deployment_is_confirmed_from_its_start_up_probes_log(
    tmp_path: Path, flags: list[str], chunk_size: int | None
) -> None:
    """As the local backend does for the real server, the simulated one is gated on the log of
    its start-up probe (verbosity 4, servelab.engines.startup_log_flags) while it serves at the
    flags' own verbosity."""
    costs = {"llamacpp": StepCost("llamacpp", 6e-4, 2e-5, 1e-3, 2e-8, 1e-8, 2e-3)}
    flags = ["--ctx-size=8192", "--parallel=4", *flags]
    path = tmp_path / "startup.log"
    resolved = sim_deploy(
        engine="llamacpp",
        flags=flags,
        gpu_name="CPU",
        gpu_memory_mib=24000,
        model_preset="tiny-llama3-2x64-hd32",
        deployment_id="d",
        startup_log_path=path,
        timestamp="2026-01-01T00:00:00",
        step_costs=costs,
    )
    assert server_settings(resolved).verbosity == 3  # what serves
    parsed = parse_startup_log(path.read_text())
    assert parsed.facts["verbosity"] == 4 and parsed.facts["n_batch"] == resolved.token_budget
    check_resolved(
        parsed, expect_chunked_prefill=chunk_size is not None, expect_chunk_size=chunk_size
    )


def test_at_the_default_verbosity_the_rendered_log_does_not_confirm_chunking() -> None:
    resolved, parsed = _render([])
    assert parsed.facts["verbosity"] == 3 and "n_batch" not in parsed.facts
    assert parsed.chunked_prefill is None and parsed.context_len == resolved.context_len
