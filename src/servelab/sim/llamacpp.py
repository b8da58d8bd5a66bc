"""A llama.cpp llama-server (0c1e570) scheduler: slots, one n_batch batch per iteration,
micro-batches of n_ubatch tokens, prompt reuse from each slot's tokens and from the host-memory
prompt cache.

Every mechanism below is read from the server's source at the pinned commit and cited as
"llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), <path>, <function>" (paths in the
llama.cpp tree, vendor/llama.cpp in the sdist; docs/simulator.md, "llama.cpp"):

- Slots: `max_running` slots (n_parallel), each with a context of `context_len` tokens (n_ctx_slot).
  A task takes a free slot when the server loop processes it; with none free it is deferred to the
  back of a FIFO queue; each slot release moves the front deferred task to the front of the task
  queue, processed before the next iteration (server_queue::defer, pop_deferred_task).
- Slot choice (get_available_slot): among free slots holding tokens, the one whose tokens share the
  longest common prefix with the prompt, if that prefix is more than `slot_prompt_similarity` of the
  prompt; else the least recently released slot (ties: the highest slot id, so the first tasks
  fill slots from the last one down).
- The host-memory prompt cache (server_prompt_cache, --cache-ram MiB, on by default): a slot chosen
  by LRU (or by similarity while keeping under half of its tokens) saves its tokens there and loads
  the cached prompt that keeps the most of both itself and the new prompt; on each task launch every
  idle slot is saved there and, with a unified KV cache, cleared (--cache-idle-slots, on).
- The batch of an iteration (update_slots / pre_decode): one token for every generating slot (slot
  id order), then prompt tokens of the slots still prefilling, in slot id order, while the batch
  holds fewer than n_batch (`token_budget`) tokens: a prompt is cut at the budget and continued next
  iteration. A new prompt reuses the common prefix with the slot's tokens (cache_prompt, on), but at
  least its last token is evaluated again; a prompt of n_ctx_slot tokens or more is refused.
- llama_decode splits the batch into micro-batches run one after the other (llama_context::decode):
  plain n_ubatch-token cuts with a unified KV cache (llama_batch_allocr::split_simple), else equal
  shares of consecutive slot ids (split_equal). The iteration's duration is one forward pass per
  micro-batch, summed. With a unified KV cache the slots share n_ctx cells: a batch that does not
  fit clears an idle slot, else is decoded in halves, and when not even one token fits every busy
  slot fails ("Context size has been exceeded.").
- Sampling (post_decode): every slot whose output token was in the batch samples one token at the
  end of the iteration: the first token comes with the iteration that finishes the prompt. A slot
  stops at max_tokens or when its tokens reach n_ctx_slot (process_token, no context shift).
- Results (`_send`): every streamed token, every final response and every prompt's start signal
  is a result, and each result wakes the HTTP thread of every request the server holds, in a
  slot or waiting for one. Those threads share the engine's core, so the next pass carries the
  wake-ups (a feature of the cost model, priced on the CPU platform).
- The HTTP pool (`_accept`): a request is a task only once a thread of cpp-httplib's pool has
  taken its connection. The pool spawns a thread for a new connection only when its count of
  idle threads is 0, and a notified idle thread counts as idle until it runs. So of a burst of
  connections that arrive together, only as many as there were idle threads get one; the rest
  wait, unheld, until a thread finishes its request or a later connection finds none idle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from servelab.engines.llamacpp import HTTP_DYNAMIC_THREADS, HTTP_IDLE_TIMEOUT_S
from servelab.engines.registry import product_of
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
from servelab.sim.params import EngineParams

__all__ = ["LlamacppModel"]

# slot states: llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
# tools/server/server-context.cpp, slot_state (WAIT_OTHER, for n_cmpl > 1, is not used)
_IDLE, _STARTED, _PROMPT, _DONE_PROMPT, _GENERATING = range(5)

_MIB = 2**20
_F32 = np.float32
# llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
# tools/server/server-context.cpp, get_available_slot: save the slot's tokens to the prompt cache
# when the chosen slot keeps less than this share of them
_F_KEEP_SAVE = _F32(0.5)
# llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
# tools/server/server-task.cpp, server_prompt_cache::load: "don't trash large prompts"
_F_KEEP_LOAD = _F32(0.25)
# llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-context.cpp, decode
_CONTEXT_EXCEEDED = "Context size has been exceeded."


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix (llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
    tools/server/server-common.cpp, server_tokens::get_common_prefix)."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class _Seq:
    """Tokens a slot or a prompt-cache entry holds: a prefix `ids` of some prompt, then `n_gen`
    tokens generated by request `owner`, which no prompt can match (the workload's prompts are
    token ids; simulated outputs have none)."""

    __slots__ = ("ids", "n_gen", "owner")

    def __init__(self, ids: np.ndarray, owner: int = -1, n_gen: int = 0) -> None:
        self.ids = ids
        self.owner = owner
        self.n_gen = n_gen

    def __len__(self) -> int:
        return int(self.ids.shape[0]) + self.n_gen


_EMPTY = _Seq(np.empty(0, dtype=np.int64))


def _seq_lcp(a: _Seq, b: _Seq) -> int:
    n = _lcp(a.ids, b.ids)
    if n == a.ids.shape[0] == b.ids.shape[0] and a.owner == b.owner and a.owner >= 0:
        n += min(a.n_gen, b.n_gen)
    return n


def _ratio(num: int, den: int) -> np.float32:
    """`float(num) / den` in single precision, as the server computes its similarities."""
    return _F32(num) / _F32(den) if den else _F32(np.nan)


class _PromptCache:
    """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-task.cpp,
    server_prompt_cache (alloc, load, update): saved slot states, oldest first, limited to
    `limit_mib` MiB (<= 0: no size limit) and to max(n_ctx, limit / bytes per token) tokens.

    A state's size is its tokens times the bytes of one token's K and V in the cache type (f16),
    plus the 12 bytes of cell metadata each (position, sequence count, sequence id) that
    llama_state_seq_get_data writes; the few header bytes are left out.
    """

    def __init__(self, limit_mib: int, limit_tokens: int, bytes_per_token: int) -> None:
        self.limit_size = _MIB * max(limit_mib, 0)
        self.limit_tokens = limit_tokens
        self.bytes_per_token = bytes_per_token + 12
        self.states: list[_Seq] = []

    def size(self) -> int:
        return sum(len(s) for s in self.states) * self.bytes_per_token

    def n_tokens(self) -> int:
        return sum(len(s) for s in self.states)

    def alloc(self, seq: _Seq) -> bool:
        """Save `seq` (server_prompt_cache::alloc)."""
        if len(seq) == 0:  # server_slot::prompt_save: nothing to save
            return False
        for s in self.states:  # already contained in an entry
            if _seq_lcp(s, seq) == len(seq):
                return False
        new = len(seq) * self.bytes_per_token
        if self.limit_size > 0 and new > self.limit_size:  # over-limit entries are skipped
            return False
        # entries fully contained in the new one are removed
        self.states = [s for s in self.states if _seq_lcp(s, seq) != len(s)]
        if self.limit_size > 0:
            while self.states and self.size() + new > self.limit_size:
                self.states.pop(0)
        self.states.append(seq)
        return True

    def best(self, held: _Seq, prompt: np.ndarray) -> int:
        """Index of the entry server_prompt_cache::load would restore for `prompt` into a slot
        holding `held`, or -1: one that keeps a larger share of both the prompt and itself."""
        lcp = _lcp(held.ids, prompt)
        f_keep_best = _ratio(lcp, len(held)) if len(held) else _F32(-1.0)
        f_sim_best = _ratio(lcp, prompt.shape[0])
        found = -1
        for i, s in enumerate(self.states):
            lcp = _lcp(s.ids, prompt)
            f_keep = _ratio(lcp, len(s))
            f_sim = _ratio(lcp, prompt.shape[0])
            if f_keep < _F_KEEP_LOAD:
                continue
            if f_keep_best < f_keep and f_sim_best < f_sim:
                f_keep_best, f_sim_best, found = f_keep, f_sim, i
        return found

    def update(self) -> None:
        """server_prompt_cache::update: drop the oldest entries over the size and token limits."""
        if self.limit_size > 0:
            while self.states and self.size() > self.limit_size:
                self.states.pop(0)
        per_token = max(1.0, float(_F32(self.size()) / _F32(max(1, self.n_tokens()))))
        limit = self.limit_tokens
        if self.limit_size > 0:
            limit = max(limit, int(self.limit_size / per_token))
        if self.limit_tokens > 0:
            while self.states and self.n_tokens() > limit:
                self.states.pop(0)


class _Slot:
    """One server_slot. While idle or STARTED its tokens are `seq`; while its task runs they are
    the task's computed prompt tokens and its outputs but the last. `kv`: the KV cells it holds."""

    __slots__ = ("id", "kv", "req", "seq", "state", "t_last")

    def __init__(self, slot_id: int) -> None:
        self.id = slot_id
        self.state = _IDLE
        self.req: Req | None = None
        self.seq = _EMPTY
        self.kv = 0
        self.t_last = -1  # server_slot::t_last_used before any release


class _Seg:
    """A slot's tokens in one batch: its decode token, or a piece of its prompt."""

    __slots__ = ("admitted", "n", "output", "pos0", "prompt", "req", "slot")

    def __init__(
        self, slot: _Slot, req: Req, prompt: bool, pos0: int, n: int, output: bool, admitted: bool
    ) -> None:
        self.slot = slot
        self.req = req
        self.prompt = prompt
        self.pos0 = pos0  # position of the first token (= tokens before it in the sequence)
        self.n = n
        self.output = output  # its last token's logits are sampled
        self.admitted = admitted  # the first piece of a prompt that starts in this iteration


class LlamacppModel(EngineModel):
    """llama-server 0c1e570's slots and update_slots (see the module docstring)."""

    engine = "llamacpp"

    def __init__(
        self,
        params: EngineParams,
        model: Any,
        cost: Any,
        *,
        track_emitted: bool = True,
    ) -> None:
        if product_of(params.engine) != "llamacpp":
            raise ValueError(
                f"LlamacppModel needs llama.cpp parameters, got engine {params.engine!r}"
            )
        if params.max_running < 1 or params.token_budget < 1 or params.context_len < 1:
            raise ValueError("llama.cpp: slots, n_batch and n_ctx_slot must be positive")
        self.p = params
        self.model = model
        self.bos_token_id = model.bos_token_id
        self.cost = cost
        self.track_emitted = track_emitted
        self.n_ctx_slot = int(params.context_len)
        self.n_batch = int(params.token_budget)
        self.n_ubatch = min(self.n_batch, int(params.ubatch_size or self.n_batch))
        self.n_ctx = int(params.kv_capacity_tokens)  # KV cells (all streams)
        self.unified = bool(params.kv_unified)
        # llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), src/llama-kv-cache.cpp,
        # llama_kv_cache::llama_kv_cache: n_stream = unified ? 1 : n_seq_max; init_batch splits a
        # batch by split_simple with one stream, else by split_equal
        self.equal_split = not self.unified and params.max_running > 1
        self.cache_prompt = bool(params.prefix_caching)
        self.similarity = _F32(params.slot_prompt_similarity)
        # f16 K and V (llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), common/common.h,
        # common_params::cache_type_k / cache_type_v)
        kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
        self.prompt_cache: _PromptCache | None = None
        # llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
        # tools/server/server-context.cpp, load_model
        if params.cache_ram_mib != 0:
            self.prompt_cache = _PromptCache(params.cache_ram_mib, self.n_ctx, kv_bytes)
        self.slots = [_Slot(i) for i in range(params.max_running)]
        self.queue: deque[Req] = deque()  # server_queue::queue_tasks (completion tasks)
        self.deferred: deque[Req] = deque()  # server_queue::queue_tasks_deferred
        self.dec = DecodeTracker()
        self.reqs: dict[str, Req] = {}
        self._uid = 0
        self._stamp = 0  # release order: server_slot::t_last_used
        self._busy = 0
        self._now = 0.0
        self._last_end = 0.0
        # /metrics (llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
        # tools/server/server-common.h, server_metrics)
        self.prompt_tokens_total = 0
        self.prompt_seconds_total = 0.0
        self.prompt_tokens_cached_total = 0
        self.tokens_predicted_total = 0
        self.tokens_predicted_seconds_total = 0.0
        self.n_decode_total = 0
        self.n_busy_slots_total = 0
        self._prompt_queued = 0
        self._prompt_start = 0.0
        self._wakeups = 0  # other requests' threads woken since the last pass (`_send`)
        # The HTTP pool (`_accept`): idle threads as (dynamic, idle since), in the order they began
        # to wait; connections no thread has taken (ThreadPool::jobs_); the dynamic threads alive;
        # each held request's thread (dynamic or not); the current burst's time and the idle
        # threads the pool counted when it began.
        self.http_threads = int(params.http_threads)
        self._idle_threads: deque[tuple[bool, float]] = deque(
            (False, 0.0) for _ in range(self.http_threads)
        )
        self.accepting: deque[Req] = deque()
        self._dynamic = 0
        self._thread_of: dict[str, bool] = {}
        self._burst_at: float | None = None
        self._burst_idle = 0

    # ------------------------------------------------------------------ requests

    def add_request(
        self, req_id: str, prompt_token_ids: Sequence[int] | np.ndarray, max_tokens: int, now: float
    ) -> None:
        ids = self._prompt_ids(req_id, prompt_token_ids, max_tokens)
        r = self._new_request(req_id, ids, max_tokens, now)
        r.phase = -1  # the slot it runs in
        self._accept(r, now)

    # ------------------------------------------------------------------ the HTTP pool

    def _accept(self, r: Req, now: float) -> None:
        """A connection accepted at `now`: cpp-httplib's ThreadPool::enqueue (vendored by
        llama.cpp 0c1e570 in llama-cpp-python 0.3.36, vendor/cpp-httplib/httplib.cpp) queues the
        job and spawns a dynamic thread only when `idle_thread_count_ == 0` (and the pool is
        under its fixed + 1024 threads), then notifies one waiting thread. A notified thread
        decrements the idle count only when it runs (ThreadPool::worker), so connections that
        arrive together (one instant here: a burst the client writes back to back) all see the
        idle count from before the burst: with any thread idle, none is spawned, and only that
        many of them are taken. A taken connection's request is posted (`_post`). With
        `http_threads` 0 no pool is modelled."""
        if self.http_threads == 0:
            self._post(r, dynamic=False)
            return
        self._expire(now)
        if now != self._burst_at:
            self._burst_at, self._burst_idle = now, len(self._idle_threads)
        self.accepting.append(r)
        if self._idle_threads:
            dynamic, _since = self._idle_threads.popleft()
            self._post(self.accepting.popleft(), dynamic=dynamic)
        elif self._burst_idle == 0 and self._dynamic < HTTP_DYNAMIC_THREADS:
            self._dynamic += 1
            self._post(self.accepting.popleft(), dynamic=True)

    def _expire(self, now: float) -> None:
        """Dynamic threads idle for CPPHTTPLIB_THREAD_POOL_IDLE_TIMEOUT exit (ThreadPool::worker)."""
        if any(d and now - since >= HTTP_IDLE_TIMEOUT_S for d, since in self._idle_threads):
            kept = [(d, t) for d, t in self._idle_threads if not d or now - t < HTTP_IDLE_TIMEOUT_S]
            self._dynamic -= len(self._idle_threads) - len(kept)
            self._idle_threads = deque(kept)

    def _post(self, r: Req, *, dynamic: bool) -> None:
        """A thread has taken `r`'s connection: the request is read and posted as a task
        (server_response_reader::post_task), held from now on (`_send`)."""
        self._thread_of[r.rid] = dynamic
        self.queue.append(r)

    def _thread_done(self, r: Req, t: float) -> None:
        """`r`'s response has ended at `t`: its thread takes the next waiting connection at once
        (ThreadPool::worker loops while jobs_ is not empty), else waits idle."""
        dynamic = self._thread_of.pop(r.rid, None)
        if dynamic is None:  # never had a thread (aborted while waiting for one)
            return
        if self.accepting:
            self._post(self.accepting.popleft(), dynamic=dynamic)
        else:
            self._idle_threads.append((dynamic, t))

    def abort(self, req_id: str) -> None:
        """A cancelled task leaves the queues or releases its slot (llama.cpp 0c1e570 (vendored
        in llama-cpp-python 0.3.36), tools/server/server-context.cpp, process_single_task,
        SERVER_TASK_TYPE_CANCEL; tools/server/server-queue.cpp, cleanup_pending_task)."""
        r = self.reqs.get(req_id)
        if r is None or r.state in (FINISHED, ABORTED):
            return
        if r.state == WAITING:
            if r in self.accepting:
                self.accepting.remove(r)
            elif r in self.queue:
                self.queue.remove(r)
            else:
                self.deferred.remove(r)
        else:
            if r.state == DECODING:
                self.dec.leave(r)
            self._release(self.slots[r.phase])
        r.state = ABORTED
        self._thread_done(r, self._last_end)
        self._flush_if_idle(self._last_end)

    def has_work(self) -> bool:
        return bool(self.queue) or self._busy > 0

    # ------------------------------------------------------------------ slots and the prompt cache

    def _available_slot(self, r: Req) -> _Slot | None:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
        tools/server/server-context.cpp, get_available_slot."""
        prompt = r.ids
        chosen: _Slot | None = None
        update_cache = False
        if self.similarity != 0:
            f_best = _F32(0.0)
            for s in self.slots:
                if s.state != _IDLE or len(s.seq) == 0:
                    continue
                f_sim = _ratio(_lcp(s.seq.ids, prompt), prompt.shape[0])
                if f_sim > f_best and f_sim > self.similarity:
                    f_best, chosen = f_sim, s
            if chosen is not None:
                f_keep = (f_best * _F32(prompt.shape[0])) / _F32(len(chosen.seq))
                update_cache = bool(f_keep < _F_KEEP_SAVE)
        if chosen is None:
            t_last = -1
            for s in self.slots:
                if s.state != _IDLE:
                    continue
                if chosen is None or s.t_last <= t_last:
                    t_last, chosen = s.t_last, s
            update_cache = chosen is not None
        if chosen is not None and update_cache and self.prompt_cache is not None:
            cache = self.prompt_cache
            cache.alloc(chosen.seq)  # server_slot::prompt_save
            i = cache.best(chosen.seq, prompt)  # server_slot::prompt_load
            if i >= 0:
                entry = cache.states[i]
                # llama_state_seq_set_data frees the slot's cells, then needs one per token
                # (llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), src/llama-kv-cache.cpp,
                # llama_kv_cache::state_read_meta); a failed restore
                # clears the slot and leaves the entry cached
                free = self.n_ctx - self._used_cells() + chosen.kv
                if self.unified and len(entry) > free:
                    self._clear(chosen)
                else:
                    del cache.states[i]
                    chosen.seq, chosen.kv = entry, len(entry)
            cache.update()
        return chosen

    def _launch(self, s: _Slot, r: Req) -> None:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-context.cpp,
        launch_slot_with_task, then process_single_task's cache_idle_slots pass (common/common.h,
        common_params::cache_idle_slots = true)."""
        s.req, s.state = r, _STARTED
        r.state, r.phase = PREFILLING, s.id
        self._busy += 1
        if self.prompt_cache is not None:
            for other in self.slots:
                if other.state != _IDLE:
                    continue
                if self.prompt_cache.alloc(other.seq):
                    self.prompt_cache.update()
                if self.unified:  # [TAG_IDLE_SLOT_CLEAR]
                    self._clear(other)

    def _clear(self, s: _Slot) -> None:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-context.cpp,
        server_slot::prompt_clear."""
        s.seq, s.kv = _EMPTY, 0

    def _used_cells(self) -> int:
        return sum(s.kv for s in self.slots)

    def _release(self, s: _Slot) -> None:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-context.cpp,
        server_slot::release: the slot keeps its tokens (prompt and outputs but the last, which
        was never fed back), the request's generation is counted (metrics_on_prediction) and the
        front deferred task moves to the front of the task queue (pop_deferred_task)."""
        r = s.req
        assert r is not None
        self._stamp += 1
        s.t_last = self._stamp
        if r.out > 0:
            self.tokens_predicted_total += r.out
            first = r.pre_times[0] if r.pre_times else 0.0
            last = self.dec.times[r.segs[-1][1] - 1] if r.segs else first
            self.tokens_predicted_seconds_total += max(1e-6, last - first)
        if s.state in (_PROMPT, _DONE_PROMPT):
            s.seq = _Seq(r.ids[: r.computed], r.uid)
        elif s.state == _GENERATING:
            s.seq = _Seq(r.ids, r.uid, r.out - 1)
        s.state, s.req = _IDLE, None
        self._busy -= 1
        if self.deferred:
            self.queue.appendleft(self.deferred.popleft())

    def _send(self, results: int) -> None:
        """`results` results sent to their requests' HTTP threads: llama.cpp 0c1e570 (vendored in
        llama-cpp-python 0.3.36), tools/server/server-queue.cpp, server_response::send pushes each
        under mutex_results and calls condition_results.notify_all(), which wakes every thread
        waiting in server_response::recv_with_timeout to scan the results and wait again. A
        request holds such a thread from the moment it is posted (server_response_reader::next),
        whether it has a slot or is deferred, and the HTTP pool gives every request a thread (8
        fixed "plus up to 1024 dynamic threads", tools/server/server-http.cpp,
        server_http_context::start). The wake-ups of threads other than the result's own are
        counted; the next pass carries them."""
        held = self._busy + len(self.deferred) + len(self.queue)
        self._wakeups += results * max(0, held - 1)

    def _flush_if_idle(self, t: float) -> None:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-context.cpp,
        update_slots with every slot idle: metrics_flush_idle."""
        if self._busy == 0 and self._prompt_queued:
            self.prompt_tokens_total += self._prompt_queued
            self.prompt_seconds_total += t - self._prompt_start
            self._prompt_queued = 0

    # ------------------------------------------------------------------ stepping

    def step(self, now: float) -> Iteration:
        self._now = now
        # llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
        # tools/server/server-queue.cpp, server_queue::process_new_tasks: every queued task, front
        # first, takes a slot or is deferred
        while self.queue:
            r = self.queue.popleft()
            s = self._available_slot(r)
            if s is None:
                self.deferred.append(r)
            else:
                self._launch(s, r)
        rejected: list[str] = []
        finished: list[str] = []
        segs = self._build_batch(rejected, finished)
        if not segs:
            self._flush_if_idle(now)
            return self._empty(now, rejected, finished)
        return self._run(now, segs, rejected, finished)

    def _build_batch(self, rejected: list[str], finished: list[str]) -> list[_Seg]:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
        tools/server/server-context.cpp, pre_decode (called by update_slots)."""
        segs: list[_Seg] = []
        dec = self.dec
        # one token for every generating slot (handle_last_sampled_token), in slot order
        for s in self.slots:
            if s.state == _GENERATING:
                r = s.req
                assert r is not None
                pos = r.prompt_len + dec.outputs(r) - 1  # the last sampled token's position
                segs.append(_Seg(s, r, False, pos, 1, True, False))
        size = len(segs)
        # then prompt tokens, slot by slot, while the batch holds fewer than n_batch tokens
        for s in self.slots:
            if size >= self.n_batch:
                break
            if s.state == _STARTED:
                r = s.req
                assert r is not None
                if not self._start_prompt(s, r, rejected, finished):
                    continue
            if s.state != _PROMPT:
                continue
            r = s.req
            assert r is not None
            start = r.computed
            n = min(r.prompt_len - start, self.n_batch - size)
            r.computed = start + n
            done = r.computed == r.prompt_len
            if done:
                s.state = _DONE_PROMPT
            segs.append(_Seg(s, r, True, start, n, done, start == r.cached_tokens))
            size += n
        return segs

    def _start_prompt(self, s: _Slot, r: Req, rejected: list[str], finished: list[str]) -> bool:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-context.cpp,
        pre_decode, a slot's first visit (SLOT_STATE_STARTED): refuse an empty or too long
        prompt, reuse the common prefix of the slot's tokens, at least one token to evaluate."""
        n = r.prompt_len
        if n == 0:  # "empty prompt - releasing slot": an empty response
            self._release(s)
            r.state = FINISHED
            finished.append(r.rid)
            self._thread_done(r, self._now)
            return False
        if n >= self.n_ctx_slot:
            r.error = (
                f"request ({n} tokens) exceeds the available context size ({self.n_ctx_slot} "
                "tokens), try increasing it"
            )
            self._release(s)
            r.state = ABORTED
            rejected.append(r.rid)
            self._thread_done(r, self._now)
            return False
        n_past = _lcp(s.seq.ids, r.ids) if self.cache_prompt else 0
        if n_past == n:  # [TAG_PROMPT_LOGITS] "need to evaluate at least 1 token"
            n_past -= 1
        self.prompt_tokens_cached_total += n_past
        r.cached_tokens = r.computed = n_past
        s.seq, s.kv = _EMPTY, n_past  # slot.prompt.tokens.keep_first(n_past); memory seq_rm
        s.state = _PROMPT
        # a streamed request's start signal (send_partial_response(..., is_begin = true)): the
        # dispatcher streams every request
        self._send(1)
        # process_token: generation stops when the slot's tokens reach n_ctx_slot
        r.max_tokens = min(r.max_tokens, self.n_ctx_slot - n)
        return True

    def _run(
        self, now: float, segs: list[_Seg], rejected: list[str], finished: list[str]
    ) -> Iteration:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-context.cpp,
        update_slots' decode loop: the batch in n_batch-token llama_decode calls (one unless
        the generating slots alone exceed n_batch, or a unified KV cache is short), then
        post_decode's sampling."""
        total = sum(g.n for g in segs)
        duration = 0.0
        off = 0
        n_batch = self.n_batch
        failed = False
        cached = sum(g.req.cached_tokens for g in segs if g.admitted)
        while off < total:
            n = min(n_batch, total - off)
            if self.unified and n > self.n_ctx - self._used_cells():
                # llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
                # tools/server/server-context.cpp, decode: llama_decode returned 1 (no memory slot)
                if n_batch == 1:
                    failed = True
                    break
                if not self._clear_idle_slot():  # try_clear_idle_slots
                    n_batch //= 2
                continue
            sub = self._cut(segs, off, n)
            start = now + duration
            duration += self._decode_time(sub, start)
            for g, _a, k in sub:
                g.slot.kv += k
            # metrics_post_decode
            self.n_decode_total += 1
            self.n_busy_slots_total += self._busy
            n_prompt = sum(k for g, _a, k in sub if g.prompt)
            if n_prompt:
                if self._prompt_queued == 0:
                    self._prompt_start = start
                self._prompt_queued += n_prompt
            # flushed after a decode with outputs (metrics_flush_prompt: when any are queued)
            if self._prompt_queued and any(g.output and a + k == g.n for g, a, k in sub):
                self.prompt_tokens_total += self._prompt_queued
                self.prompt_seconds_total += now + duration - self._prompt_start
                self._prompt_queued = 0
            off += n
            n_batch = self.n_batch
        end = now + duration
        self._last_end = end
        return self._sample(now, end, segs, off, failed, cached, rejected, finished)

    def _clear_idle_slot(self) -> bool:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-context.cpp,
        try_clear_idle_slots: clear the first idle slot holding tokens."""
        for s in self.slots:
            if s.state == _IDLE and s.kv > 0:
                self._clear(s)
                return True
        return False

    @staticmethod
    def _cut(segs: list[_Seg], off: int, n: int) -> list[tuple[_Seg, int, int]]:
        """The batch's tokens [off, off + n) as (segment, first token in it, tokens)."""
        out: list[tuple[_Seg, int, int]] = []
        pos = 0
        for g in segs:
            lo, hi = max(off, pos), min(off + n, pos + g.n)
            if lo < hi:
                out.append((g, lo - pos, hi - lo))
            pos += g.n
            if pos >= off + n:
                break
        return out

    def _micro_batches(self, sub: list[tuple[_Seg, int, int]]) -> list[list[tuple[_Seg, int, int]]]:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), src/llama-kv-cache.cpp,
        llama_kv_cache::init_batch with src/llama-batch.cpp, llama_batch_allocr::split_simple
        (one KV stream: consecutive n_ubatch-token cuts) or split_equal(n_ubatch, sequential)
        (one stream per slot: each micro-batch takes the same number of tokens from a run of
        consecutive slot ids, the first in batch order with tokens left)."""
        u = self.n_ubatch
        out: list[list[tuple[_Seg, int, int]]] = []
        if not self.equal_split:
            cur: list[tuple[_Seg, int, int]] = []
            room = u
            for g, a, k in sub:
                while k:
                    t = min(k, room)
                    cur.append((g, a, t))
                    a, k, room = a + t, k - t, room - t
                    if room == 0:
                        out.append(cur)
                        cur, room = [], u
            if cur:
                out.append(cur)
            return out
        left: list[list[Any]] = [[g, a, k] for g, a, k in sub]
        while True:
            chosen: list[list[Any]] = []
            last = -1
            for part in left:
                if part[2] == 0:
                    continue
                if chosen and part[0].slot.id != last + 1:  # "accept only increasing seq ids"
                    continue
                chosen.append(part)
                last = part[0].slot.id
                if len(chosen) > u:
                    break
            if not chosen:
                return out
            n_seqs = len(chosen)
            k = min(min(p[2] for p in chosen), max(1, u // n_seqs))
            out.append([(p[0], p[1], k) for p in chosen])
            for p in chosen:
                p[1] += k
                p[2] -= k

    def _decode_time(self, sub: list[tuple[_Seg, int, int]], start_s: float) -> float:
        """One llama_decode call from `start_s`: one forward pass per micro-batch, back to back,
        summed (llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), src/llama-context.cpp,
        llama_context::decode, process_ubatch). Each pass also carries its attention mask's work
        (`mask_work`)."""
        total = 0.0
        stored = sum(s.kv for s in self.slots) if self.unified else 0
        for ub in self._micro_batches(sub):
            wakeups, self._wakeups = self._wakeups, 0  # the first pass carries them
            tokens = sampled = admitted = 0
            pairs = kv = 0.0
            runs: list[tuple[int, int]] = []  # (first position, tokens) of each sequence
            for g, a, k in ub:
                tokens += k
                if g.output and a + k == g.n:
                    sampled += 1
                if g.prompt:
                    st = g.pos0 + a
                    pairs += k * st + k * (k + 1) / 2
                    kv += st + k
                    runs.append((st, k))
                    if g.admitted and a == 0:
                        admitted += 1
                else:
                    kv += g.pos0 + 1
                    runs.append((g.pos0, 1))
            cells, checks = self.mask_work(runs, stored)
            total += self.cost.iteration_time(
                tokens=tokens,
                seqs=len(ub),
                sampled=sampled,
                attn_pairs=pairs,
                kv_tokens=kv,
                cuda_graph=False,
                admitted=admitted,
                mask_cells=cells,
                mask_checks=checks,
                wakeups=wakeups,
                start_s=start_s + total,
            )
        return total

    def mask_work(self, runs: list[tuple[int, int]], stored: int) -> tuple[float, float]:
        """A pass's attention-mask work, for its sequences' (first position, tokens) `runs`:
        (cells, checks). Cells: every query token's mask row of `n_kv_view` cells, which the CPU
        flash attention reads for every KV tile, masked or not, before it skips a tile wholly
        masked (llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),
        ggml/src/ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_tiled). Checks: the cells
        the host tests one by one (empty, sequence, position) to fill that mask
        (src/llama-kv-cache.cpp, set_input_kq_mask_impl): all n_kv for a sequence's first token,
        then for each later token of it only the cells it recorded, those from 32 positions
        before the pass's first on (its own new tokens and up to 32 before them). `stored`: the
        slots' stored tokens, one unified stream's cells in use (0 with a stream a slot)."""
        used = max((st + k for st, k in runs), default=1)
        n_kv = self.n_kv_view(max(used, stored))
        tokens = sum(k for _st, k in runs)
        checks = sum(n_kv + (k - 1) * (k + min(32, st)) for st, k in runs)
        return float(tokens * n_kv), float(checks)

    def n_kv_view(self, used: int) -> int:
        """The length of the KV view a pass attends over, when its streams' cells are used up to
        `used`: llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), src/llama-kv-cache.cpp,
        llama_kv_cache::get_n_kv: used_max_p1 padded to max(n_pad, 256) (n_pad 1 for Llama:
        src/llama-model.cpp), at most the stream's cells (n_ctx_slot a slot's own stream; n_ctx one
        unified stream, whose cells in use `mask_work` takes as the slots' stored tokens: an
        approximation, as cells need not be contiguous)."""
        cells = self.n_ctx if self.unified else self.n_ctx_slot
        padded = -(-max(used, 1) // 256) * 256
        return min(cells, padded)

    def _sample(
        self,
        now: float,
        end: float,
        segs: list[_Seg],
        decoded: int,
        failed: bool,
        cached: int,
        rejected: list[str],
        finished: list[str],
    ) -> Iteration:
        """llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36), tools/server/server-context.cpp,
        post_decode: each slot whose output token was decoded samples one token; a slot at
        its limit is released (slot order). A failed decode's slots are `_fail_busy_slots`."""
        dec = self.dec
        pos = 0
        sampled: set[int] = set()
        n_dec = n_prompt = n_seqs = 0
        for g in segs:
            if pos < decoded:
                n_seqs += 1
            pos += g.n
            if g.prompt:
                n_prompt += max(0, min(g.n, decoded - (pos - g.n)))
            elif pos <= decoded:
                n_dec += 1
            if g.output and pos <= decoded:
                sampled.add(g.slot.id)
        if failed:  # generating slots whose token was not decoded get none
            for r in [r for r in dec.members if r.phase not in sampled]:
                dec.leave(r)
        releases: dict[int, _Slot] = {}
        emitted: tuple[str, ...] = ()
        if self.track_emitted:
            emitted = tuple(r.rid for r in dec.members)
        n_out = len(dec.members)
        if dec.members:
            for r in dec.advance(end):
                releases[r.phase] = self.slots[r.phase]
        firsts: list[str] = []
        for g in segs:
            s = g.slot
            if not g.prompt or s.id not in sampled:
                continue
            r = g.req
            s.state = _GENERATING
            r.out = 1
            r.pre_times.append(end)
            firsts.append(r.rid)
            if r.out >= r.max_tokens:
                releases[s.id] = s
            else:
                dec.join(r)
        if self.track_emitted:
            emitted += tuple(firsts)
        # a streamed token each (send_partial_response), a final response each (send_final_response)
        self._send(n_out + len(firsts) + len(releases))
        for sid in sorted(releases):
            s = releases[sid]
            done = s.req
            assert done is not None
            self._release(s)
            done.state = FINISHED
            finished.append(done.rid)
            self._thread_done(done, end)
        if failed:  # every busy slot fails; its tokens are cleared
            self._fail_busy_slots(rejected, end)
        if not self.has_work():  # the wake-ups meet an idle server: no pass waits for them
            self._wakeups = 0
        self._flush_if_idle(end)
        if n_prompt and n_dec:
            kind = "mixed"
        elif n_prompt:
            kind = "prefill"
        else:
            kind = "decode" if n_dec else "none"
        return Iteration(
            start_s=now,
            duration_s=end - now,
            kind=kind,
            batch_size=n_seqs,
            prefill_tokens=n_prompt,
            computed_tokens=n_prompt,
            cached_tokens=cached,
            decode_tokens=n_dec,
            emitted=emitted,
            finished=tuple(finished),
            rejected=tuple(rejected),
        )

    def _fail_busy_slots(self, rejected: list[str], end: float) -> None:
        """A failed decode (post_decode's error path, see `_sample`; split out of it by
        servelab): every busy slot's request fails with the context error and the slot is
        released and cleared, in slot order."""
        dec = self.dec
        for s in self.slots:
            if s.state == _IDLE:
                continue
            r = s.req
            assert r is not None
            if r in dec.members:
                dec.leave(r)
            r.error = _CONTEXT_EXCEEDED
            self._release(s)
            self._clear(s)
            r.state = ABORTED
            rejected.append(r.rid)
            self._thread_done(r, end)

    def _empty(self, now: float, rejected: list[str], finished: list[str]) -> Iteration:
        return Iteration(
            start_s=now,
            duration_s=0.0,
            kind="none",
            batch_size=0,
            prefill_tokens=0,
            computed_tokens=0,
            cached_tokens=0,
            decode_tokens=0,
            emitted=(),
            finished=tuple(finished),
            rejected=tuple(rejected),
        )

    # ------------------------------------------------------------------ metrics

    def metrics(self) -> dict[str, float]:
        """llama-server's /metrics series (llama.cpp 0c1e570 (vendored in llama-cpp-python
        0.3.36), tools/server/server-task.cpp, server_task_result_metrics::to_metrics), under its
        own names as METRIC_MAP maps them. Left out: the prompt_tokens_seconds and
        predicted_tokens_seconds gauges (averages over the window between two scrapes, which
        the scrape itself resets), llamacpp:n_tokens_max (a counter without `_total`), and the
        per-position speculative counter (only with speculative decoding)."""
        return {
            "llamacpp:prompt_tokens_total": float(self.prompt_tokens_total),
            "llamacpp:prompt_tokens_cached_total": float(self.prompt_tokens_cached_total),
            "llamacpp:prompt_seconds_total": self.prompt_seconds_total,
            "llamacpp:tokens_predicted_total": float(self.tokens_predicted_total),
            "llamacpp:tokens_predicted_seconds_total": self.tokens_predicted_seconds_total,
            "llamacpp:n_decode_total": float(self.n_decode_total),
            "llamacpp:spec_decode_num_draft_tokens_total": 0.0,
            "llamacpp:spec_decode_num_accepted_tokens_total": 0.0,
            "llamacpp:spec_decode_num_drafts_total": 0.0,
            "llamacpp:requests_processing": float(self._busy),
            "llamacpp:requests_deferred": float(len(self.deferred)),
            "llamacpp:n_busy_slots_per_decode": self.n_busy_slots_total
            / max(self.n_decode_total, 1),
        }
