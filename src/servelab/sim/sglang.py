"""An SGLang-0.4.1-like engine: radix-tree prefix cache, LPM ordering, PrefillAdder, retraction.

Mechanisms (docs/engines.md, "Upstream sources"; srt/managers/scheduler.py, schedule_policy.py,
schedule_batch.py, mem_cache/radix_cache.py of the 0.4.1 wheel):

- Token-level radix cache (`sim.radix`): a prompt reuses a cached prefix of any length, capped at
  input_len - 1. A prompt is inserted into the tree right after its prefill (`cache_unfinished_req`),
  prompt + output (minus the last token) when it finishes (`cache_finished_req`). Unlocked leaves are
  evicted LRU; `token usage` counts evictable tokens as free.
- Each iteration tries a new prefill batch first and runs the decode batch only when none forms;
  prefill and decode are separate forward passes (`--enable-mixed-chunk` off).
- Waiting-queue order: longest prefix match (a stable sort on cached-prefix length, with SGLang's
  in-batch deprioritisation of a request whose cached prefix is <= 32 tokens but that shares >= 32
  tokens with an earlier waiting request); first come first served when more than 128 are waiting.
- PrefillAdder: the continuing chunk goes first; a batch holds at most `chunked_prefill_size` NEW
  tokens (cache hits do not count) and `max_prefill_tokens` input tokens; at most one request is
  chunked at a time. Admission needs `extend + min(max_new_tokens, 4096)` below the free + evictable
  tokens left after reserving `new_token_ratio` x (remaining outputs) for every running request.
  The ratio starts at 0.7, decays to 0.098 over 600 decode steps, resets when idle.
- Decode needs one free slot per running request (evicting first); otherwise requests are retracted,
  fewest outputs first (ties: longest prompt), until 20 steps of room remain; they go to the tail of
  the waiting queue and are prefilled again over prompt + outputs; new_token_ratio is re-estimated.
- Decode batches larger than `cuda_graph_max_bs` (8 on an L4) run without CUDA graphs. The overlap
  scheduler hides most CPU overhead: modelled as a smaller per-iteration overhead in `sim.cost`.
- Scheduler gauges are refreshed at each prefill batch and every 40 decode steps only, as SGLang's are.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from servelab.engines.registry import engine_spec, product_of
from servelab.sim.base import (
    ABORTED,
    DECODING,
    FINISHED,
    PREFILLING,
    WAITING,
    DecodeTracker,
    EngineModel,
    Iteration,
    Req,
)
from servelab.sim.cost import CostModel
from servelab.sim.params import EngineParams
from servelab.sim.presets import ModelPreset
from servelab.sim.radix import Node, RadixCache, key_bytes

__all__ = ["SglangModel"]

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
RETRACT_DECODE_STEPS = 20
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
LPM_FCFS_QUEUE = 128  # calc_priority: FCFS above this queue length
IN_BATCH_CHECK = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
IN_BATCH_DEPRIORITIZE = 32  # IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD
DECODE_LOG_INTERVAL = 40
_CONTINUE, _NO_TOKEN, _OTHER = 0, 1, 2


class _PrefillBudget:
    """PrefillAdder's remaining budgets and its log counters (schedule_policy.py, PrefillAdder:
    rem_total_tokens, rem_input_tokens, rem_chunk_tokens, `_prefill_one_req`, `budget_state`,
    log_hit_tokens, log_input_tokens). A class of servelab's: upstream keeps them on the adder."""

    def __init__(self, total: float, input_tokens: int, chunk: int | None) -> None:
        self.total = total
        self.input = input_tokens
        self.chunk = chunk
        self.log_hit = 0
        self.log_input = 0

    def prefill_one(self, prefix_len: int, extend: int, max_new: int) -> None:
        self.total -= extend + max_new
        self.input -= extend
        if self.chunk is not None:
            self.chunk -= extend
        self.log_hit += prefix_len
        self.log_input += extend

    def state(self) -> int:
        if self.total <= 0:
            return _NO_TOKEN
        if self.input <= 0 or (self.chunk is not None and self.chunk <= 0):
            return _OTHER
        return _CONTINUE


class SglangModel(EngineModel):
    """SGLang 0.4.1 scheduler over a radix cache (see module doc)."""

    engine = "sglang"

    def __init__(
        self,
        params: EngineParams,
        model: ModelPreset,
        cost: CostModel,
        *,
        track_emitted: bool = True,
    ) -> None:
        if product_of(params.engine) != "sglang":
            raise ValueError(f"SglangModel needs SGLang parameters, got engine {params.engine!r}")
        if params.schedule_policy not in ("lpm", "fcfs"):
            raise ValueError(
                f"schedule_policy: {params.schedule_policy!r} is not simulated (lpm or fcfs)"
            )
        self.p = params
        self._counts_retractions = engine_spec(params.engine).family == "0.5"
        self.model = model
        self.bos_token_id = model.bos_token_id
        self.cost = cost
        self.track_emitted = track_emitted
        self.total = params.kv_capacity_tokens
        self.available = self.total
        self.tree = RadixCache()
        self.waiting: list[Req] = []
        # requests received but not yet seen by the scheduler (overlap look-ahead, see step())
        self.inbox: deque[Req] = deque()
        self._prev_start = 0.0
        self._prev_end = 0.0
        self.dec = DecodeTracker()
        self.chunked: Req | None = None
        self.batch_is_full = False
        self.chunk_size = params.chunk_size if params.chunked_prefill else None
        self.policy = params.schedule_policy if params.prefix_caching else "fcfs"
        self.init_ratio = INIT_NEW_TOKEN_RATIO
        self.min_ratio = self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_ratio
        self.max_req_len = params.prompt_limit + 5
        self.n_long_max = 0  # decoding requests with max_tokens above the estimation clip
        self.reqs: dict[str, Req] = {}
        self._uid = 0
        self._now = 0.0
        # stats
        self.num_retractions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.hit_tokens = 0
        self.input_tokens = 0
        self.forward_ct_decode = 0
        self._gen_tokens_since_log = 0
        self._last_decode_log = 0.0
        self.gauges: dict[str, float] = {
            "sglang:num_running_reqs": 0.0,
            "sglang:num_used_tokens": 0.0,
            "sglang:token_usage": 0.0,
            "sglang:gen_throughput": 0.0,
            "sglang:num_queue_reqs": 0.0,
            "sglang:cache_hit_rate": 0.0,
        }

    # ------------------------------------------------------------------ requests

    def add_request(
        self, req_id: str, prompt_token_ids: Sequence[int] | np.ndarray, max_tokens: int, now: float
    ) -> None:
        ids = self._prompt_ids(req_id, prompt_token_ids, max_tokens)
        if ids.shape[0] > self.p.prompt_limit:  # "Request length is longer than ... Truncated!!!"
            ids = ids[: self.p.prompt_limit]
        max_tokens = max(1, min(int(max_tokens), self.max_req_len - int(ids.shape[0]) - 1))
        if not self.has_work():  # the scheduler idled: SGLang resets the ratio on an idle loop
            self.new_token_ratio = self.init_ratio
        r = self._new_request(req_id, ids, max_tokens, now)
        r.key = key_bytes(ids)
        self.inbox.append(r)

    def abort(self, req_id: str) -> None:
        r = self.reqs.get(req_id)
        if r is None or r.state in (FINISHED, ABORTED):
            return
        if r.state == WAITING:
            if r in self.inbox:
                self.inbox.remove(r)
            else:
                self.waiting.remove(r)
        elif r.state == DECODING:
            self._leave(r)
            self.available += r.prompt_len + r.out - 1 - r.match_len
            self.tree.dec_lock_ref(r.last_node)  # type: ignore[arg-type]
        elif r.state == PREFILLING:  # the chunked request: its computed part is in the tree
            self.chunked = None
            self.tree.dec_lock_ref(r.last_node)  # type: ignore[arg-type]
        r.state = ABORTED

    def has_work(self) -> bool:
        return bool(self.waiting or self.inbox or self.dec.members or self.chunked is not None)

    # ------------------------------------------------------------------ helpers

    def _fill(self, r: Req, n_tokens: int | None = None) -> bytes:
        """Key of r's prompt + outputs (outputs are request-unique stand-in tokens)."""
        key = r.key
        if r.out:
            outs = -(1 + r.uid * (1 << 24) + np.arange(r.out, dtype=np.int64))
            key = key + outs.astype("<i8").tobytes()
        return key if n_tokens is None else key[: n_tokens * 8]

    def _match(self, r: Req, now: float) -> None:
        """r.match_len / r.last_node for r's key minus its last token (adjust_max_prefix_ids)."""
        tree = self.tree
        node = r.last_node
        if r.match_ver == tree.version and node is not None and node.alive:  # type: ignore[attr-defined]
            tree.touch(node, now)  # type: ignore[arg-type]
            return
        m, node = tree.match_prefix(self._fill(r, r.seq_len - 1), now)
        r.match_len, r.last_node, r.match_ver = m, node, tree.version

    def _leave(self, r: Req) -> None:
        self.dec.leave(r)
        if r.max_tokens > CLIP_MAX_NEW_TOKENS:
            self.n_long_max -= 1

    def _join(self, r: Req) -> None:
        self.dec.join(r)
        if r.max_tokens > CLIP_MAX_NEW_TOKENS:
            self.n_long_max += 1

    def _cache_unfinished(self, r: Req, kv_len: int, now: float) -> None:
        """Insert r's computed tokens into the tree and move r's lock to the new last node."""
        key = self._fill(r, kv_len)
        tree = self.tree
        present = tree.insert(key, now)
        if present > r.match_len:  # computed twice (same-batch sharing): free the duplicates
            self.available += present - r.match_len
        m, node = tree.match_prefix(key, now)
        tree.dec_lock_ref(r.last_node)  # type: ignore[arg-type]
        tree.inc_lock_ref(node)
        r.match_len, r.last_node, r.match_ver = m, node, -1

    def _cache_finished(self, r: Req, now: float) -> None:
        kv_len = r.prompt_len + r.out - 1
        present = self.tree.insert(self._fill(r, kv_len), now)
        if present > r.match_len:
            self.available += present - r.match_len
        self.tree.dec_lock_ref(r.last_node)  # type: ignore[arg-type]
        r.last_node = None
        r.state = FINISHED
        self.prompt_tokens_total += r.prompt_len
        self.generation_tokens_total += r.out

    def _evict(self, n: int) -> None:
        if n > 0:
            self.available += self.tree.evict(n)

    def _used_tokens(self) -> int:
        return self.total - (self.available + self.tree.evictable_size)

    # ------------------------------------------------------------------ scheduling

    def _calc_priority(self, now: float) -> bool:
        """Sort the waiting queue (LPM) and return whether prefixes were matched (schedule_policy.py)."""
        waiting = self.waiting
        if self.policy != "lpm" or len(waiting) > LPM_FCFS_QUEUE:
            return False
        deprioritized: set[int] = set()
        temp: RadixCache | None = None
        for r in waiting:
            self._match(r, now)
            if r.match_len <= IN_BATCH_CHECK:
                key = self._fill(r, r.seq_len - 1)
                if temp is None:
                    temp = RadixCache()
                m, _ = temp.match_prefix(key, now)
                if m >= IN_BATCH_DEPRIORITIZE:
                    deprioritized.add(r.uid)
                else:
                    temp.insert(key, now)
        if deprioritized:
            waiting.sort(key=lambda r: float("inf") if r.uid in deprioritized else -r.match_len)
        else:
            waiting.sort(key=lambda r: -r.match_len)
        return True

    def _reserved_for_running(self) -> float:
        dec = self.dec
        if not dec.members:
            return 0.0
        if self.n_long_max:
            remaining = sum(
                min(r.max_tokens - dec.outputs(r), CLIP_MAX_NEW_TOKENS) for r in dec.members
            )
        else:
            remaining = dec.max_sum - dec.total_outputs()
        return remaining * self.new_token_ratio

    def _get_new_batch_prefill(self, now: float) -> list[tuple[Req, int, int, bool]] | None:
        """get_new_batch_prefill + PrefillAdder: [(req, prefix_len, new_tokens, completes_prompt)].

        The budgets are servelab's `_PrefillBudget` and the closing statistics its
        `_log_prefill_stats` (split out of this function by servelab)."""
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        running_bs = len(self.dec)
        if running_bs >= self.p.max_running:
            self.batch_is_full = True
            return None
        prefix_computed = self._calc_priority(now)
        tree = self.tree
        budget = _PrefillBudget(
            self.available + tree.evictable_size - self._reserved_for_running(),
            self.p.token_budget,
            self.chunk_size,
        )
        batch: list[tuple[Req, int, int, bool]] = []

        had_chunked = self.chunked is not None
        if self.chunked is not None:  # add_being_chunked_req: the continuing chunk goes first
            r = self.chunked
            extend = r.seq_len - r.match_len
            truncated = budget.chunk is not None and extend > budget.chunk
            n = min(extend, budget.chunk) if budget.chunk is not None else extend
            batch.append((r, r.match_len, n, not truncated))
            budget.prefill_one(
                r.match_len, n, 0 if truncated else min(r.max_tokens, CLIP_MAX_NEW_TOKENS)
            )
            self.chunked = r if truncated else None
        new_chunked: Req | None = None
        for r in self.waiting:
            if running_bs + len(batch) >= self.p.max_running:
                self.batch_is_full = True
                break
            if not prefix_computed:
                self._match(r, now)
            extend = r.seq_len - r.match_len
            max_new = min(r.max_tokens, CLIP_MAX_NEW_TOKENS)
            total = extend + max_new
            if total >= budget.total:
                self.batch_is_full = True
                break
            if extend > budget.input and batch:
                break
            node: Node = r.last_node  # type: ignore[assignment]
            budget.total += tree.inc_lock_ref(node)  # _lock_node while deciding
            result = _CONTINUE
            admitted = False
            if total > budget.total:
                result = _NO_TOKEN
            elif budget.chunk is None or extend <= budget.chunk:
                batch.append((r, r.match_len, extend, True))
                admitted = True
                budget.prefill_one(r.match_len, extend, max_new)
            elif budget.chunk == 0:
                result = _OTHER
            else:
                batch.append((r, r.match_len, budget.chunk, False))
                new_chunked = r
                admitted = True
                budget.prefill_one(r.match_len, budget.chunk, 0)
            if admitted:
                tree.inc_lock_ref(node)  # the request's own lock, held until it is cached
            budget.total += tree.dec_lock_ref(node)
            if result == _CONTINUE:
                result = budget.state()
            if result != _CONTINUE:
                if result == _NO_TOKEN:
                    self.batch_is_full = True
                break
        if not batch:
            return None
        taken = {id(x[0]) for x in batch}
        self.waiting = [r for r in self.waiting if id(r) not in taken]
        if new_chunked is not None:
            self.chunked = new_chunked
        self._log_prefill_stats(budget, running_bs, had_chunked)
        return batch

    def _log_prefill_stats(
        self, budget: _PrefillBudget, running_bs: int, had_chunked: bool
    ) -> None:
        """log_prefill_stats: gauges and the (lifetime, chunk-inflated) cache hit rate."""
        self.hit_tokens += budget.log_hit
        self.input_tokens += budget.log_input
        used = self._used_tokens()
        g = self.gauges
        g["sglang:num_running_reqs"] = float(running_bs)
        g["sglang:num_used_tokens"] = float(used)
        g["sglang:token_usage"] = round(used / self.total, 2)
        g["sglang:num_queue_reqs"] = float(len(self.waiting) + (1 if had_chunked else 0))
        denom = self.hit_tokens + self.input_tokens
        g["sglang:cache_hit_rate"] = self.hit_tokens / denom if denom else 0.0

    # ------------------------------------------------------------------ stepping

    def _receive(self, cutoff: float) -> None:
        inbox = self.inbox
        while inbox and inbox[0].arrival_s <= cutoff:
            self.waiting.append(inbox.popleft())

    def step(self, now: float) -> Iteration:
        """One scheduler iteration at `now`.

        With the overlap scheduler (on by default) batch k+1 is formed right after batch k is launched,
        before k's results are known: a request that arrives while batch k runs is first considered for
        batch k+2. So, when the engine has been busy without a gap, this step sees the requests that
        had arrived by the START of the previous iteration; after an idle gap it sees everything.
        """
        it = self._step(now)
        self._prev_start, self._prev_end = now, it.end_s
        return it

    def _step(self, now: float) -> Iteration:
        self._now = now
        busy = now <= self._prev_end and self.p.overlap_schedule
        self._receive(self._prev_start if busy else now)
        batch = self._get_new_batch_prefill(now)
        if batch is not None:
            return self._run_prefill(now, batch)
        if self.dec.members:
            return self._run_decode(now)
        if busy and self.inbox:  # nothing in flight to overlap with: the loop comes round again
            self._receive(now)
            batch = self._get_new_batch_prefill(now)
            if batch is not None:
                return self._run_prefill(now, batch)
        # idle with waiting requests: SGLang resets the ratio and retries; a request that can never
        # fit is refused rather than left to spin.
        self.new_token_ratio = self.init_ratio
        self.batch_is_full = False
        batch = self._get_new_batch_prefill(now)
        if batch is not None:
            return self._run_prefill(now, batch)
        if not self.waiting:
            raise RuntimeError("sglang model: step() called with nothing schedulable")
        r = self.waiting.pop(0)
        r.state = ABORTED
        r.error = "Request does not fit in the KV cache pool"
        return Iteration(now, 0.0, "none", 0, 0, 0, 0, 0, (), (), rejected=(r.rid,))

    def _run_prefill(self, now: float, batch: list[tuple[Req, int, int, bool]]) -> Iteration:
        need = sum(n for _, _, n, _ in batch)
        if self.available < need:
            self._evict(need)
            if self.available < need:
                raise RuntimeError("sglang model: Prefill out of memory (accounting error)")
        self.available -= need
        pairs = 0.0
        kv = 0.0
        sampled = 0
        cached = 0
        for r, prefix, n, completes in batch:
            r.state = PREFILLING
            pairs += n * prefix + n * (n + 1) / 2
            kv += prefix + n
            cached += prefix
            if completes:
                sampled += 1
        duration = self.cost.iteration_time(
            tokens=need,
            seqs=len(batch),
            sampled=sampled,
            attn_pairs=pairs,
            kv_tokens=kv,
            cuda_graph=False,
            start_s=now,
        )
        end_s = now + duration
        emitted: list[str] = []
        finished: list[str] = []
        for r, prefix, n, completes in batch:
            if not completes:
                self._cache_unfinished(r, prefix + n, end_s)
                continue
            r.out += 1
            r.pre_times.append(end_s)
            if self.track_emitted:
                emitted.append(r.rid)
            if r.out >= r.max_tokens:
                # the prefilled tokens are owned by r until cached
                r.match_len = prefix  # owned: [prefix, prefix + n)
                self._cache_finished(r, end_s)
                finished.append(r.rid)
            else:
                self._cache_unfinished(r, prefix + n, end_s)
                self._join(r)
        return Iteration(
            start_s=now,
            duration_s=duration,
            kind="prefill",
            batch_size=len(batch),
            prefill_tokens=need,
            computed_tokens=need,
            cached_tokens=cached,
            decode_tokens=0,
            emitted=tuple(emitted),
            finished=tuple(finished),
        )

    def _retract(self) -> list[Req]:
        """retract_decode: fewest outputs first (ties: longest prompt) until 20 steps of room."""
        dec = self.dec
        members = list(dec.members)
        members.sort(key=lambda r: (dec.outputs(r), -r.prompt_len), reverse=True)
        retracted: list[Req] = []
        first = True
        while self.available < len(members) * RETRACT_DECODE_STEPS or first:
            if len(members) == 1:
                break
            first = False
            r = members.pop()
            self._leave(r)
            self.available += r.prompt_len + r.out - 1 - r.match_len
            self.tree.dec_lock_ref(r.last_node)  # type: ignore[arg-type]
            r.last_node = None
            r.match_len = 0
            r.match_ver = -1
            r.state = WAITING
            retracted.append(r)
            self._evict(len(members) * RETRACT_DECODE_STEPS - self.available)
        total_max = dec.max_sum
        ratio = (dec.total_outputs() + RETRACT_DECODE_STEPS * len(dec)) / total_max
        self.new_token_ratio = min(1.0, ratio)
        self.num_retractions += len(retracted)
        self.waiting.extend(retracted)
        return retracted

    def _run_decode(self, now: float) -> Iteration:
        dec = self.dec
        retracted: list[Req] = []
        if self.available < len(dec):
            self._evict(len(dec))
        if self.available < len(dec):
            retracted = self._retract()
            self.batch_is_full = False
            if self.available < len(dec):
                self._evict(len(dec) - self.available)
                if self.available < len(dec):
                    raise RuntimeError("sglang model: no space left for decoding")
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        bs = len(dec)
        self.available -= bs
        graph = bs <= self.p.cuda_graph_max_bs
        duration = self.cost.iteration_time(
            tokens=bs,
            seqs=bs,
            sampled=bs,
            attn_pairs=0.0,
            kv_tokens=float(dec.ctx_sum),
            cuda_graph=graph,
            # decode contexts that are the same KV slots (a shared prefix in the radix tree)
            kv_repeat=max(0.0, float(dec.ctx_sum - self._used_tokens())),
            start_s=now,
        )
        end_s = now + duration
        emitted = tuple(r.rid for r in dec.members) if self.track_emitted else ()
        done = dec.advance(end_s)
        for r in done:
            if r.max_tokens > CLIP_MAX_NEW_TOKENS:
                self.n_long_max -= 1
            self._cache_finished(r, end_s)
        if done:
            self.batch_is_full = False
        self.forward_ct_decode += 1
        self._gen_tokens_since_log += bs
        if self.forward_ct_decode % DECODE_LOG_INTERVAL == 0:
            used = self._used_tokens()
            g = self.gauges
            g["sglang:num_running_reqs"] = float(bs)
            g["sglang:num_used_tokens"] = float(used)
            g["sglang:token_usage"] = used / self.total
            elapsed = end_s - self._last_decode_log
            g["sglang:gen_throughput"] = (
                self._gen_tokens_since_log / elapsed if elapsed > 0 else 0.0
            )
            g["sglang:num_queue_reqs"] = float(len(self.waiting))
            self._gen_tokens_since_log = 0
            self._last_decode_log = end_s
        return Iteration(
            start_s=now,
            duration_s=duration,
            kind="decode",
            batch_size=bs,
            prefill_tokens=0,
            computed_tokens=0,
            cached_tokens=0,
            decode_tokens=bs,
            emitted=emitted,
            finished=tuple(r.rid for r in done),
            preempted=tuple(r.rid for r in retracted),
            cuda_graph=graph,
        )

    # ------------------------------------------------------------------ metrics

    def kv_usage(self) -> float:
        """Exact token usage now (the gauge `sglang:token_usage` is refreshed only at log points)."""
        return self._used_tokens() / self.total

    def metrics(self) -> dict[str, float]:
        """SGLang 0.4.1 /metrics series with --enable-metrics (srt/metrics/collector.py)."""
        out = dict(self.gauges)
        out["sglang:prompt_tokens_total"] = float(self.prompt_tokens_total)
        out["sglang:generation_tokens_total"] = float(self.generation_tokens_total)
        if self._counts_retractions:
            # 0.5 counts retractions (observability/metrics_collector.py at 0.5.23)
            out["sglang:num_retracted_requests_total"] = float(self.num_retractions)
        return out
