"""Shared pieces of the simulated engines: the request record, the iteration result, the decode tracker.

An engine model is a stepping state machine that knows nothing about the clock it runs on: the one
interface `EngineModel` (`add_request(...)`, `abort(...)`, `has_work()`, `step(now) -> Iteration`,
`metrics()`, and the per-request read-outs it implements once for every engine). The virtual-time
runner (`sim.runner`) and the real-time server (`sim.server`) both drive it the same way: call
`step(now)`, wait `Iteration.duration_s` (virtually or really), and read what the iteration produced.
Which model imitates which engine is listed in `sim.models`.

Hot-path design: every engine runs all of its decoding requests in every decode step (vLLM V0 and SGLang
0.4.1 both do, given max_num_seqs/max_running_requests), so a decode step emits exactly one token per
decoding request. `DecodeTracker` exploits that: it keeps one time per decode step and, per request, the
ranges of steps it took part in, so a step costs O(1) Python work however large the batch is, and a
request's token times are reconstructed once, when it leaves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["DecodeTracker", "EngineModel", "Iteration", "Req"]

# request states
WAITING = 0
PREFILLING = 1  # admitted, prompt not fully computed (chunked prefill in progress)
DECODING = 2
FINISHED = 3
ABORTED = 4


class Req:
    """One request inside an engine model. Engine-specific fields are documented where they are used."""

    __slots__ = (
        "arrival_s",
        "blocks",
        "cached_tokens",
        "computed",
        "d0",
        "error",
        "extend_len",
        "g0",
        "hashes",
        "ids",
        "key",
        "last_node",
        "match_len",
        "match_ver",
        "max_tokens",
        "n_blocks",
        "out",
        "phase",
        "pre_times",
        "prompt_len",
        "ready_s",
        "rid",
        "segs",
        "state",
        "uid",
    )

    def __init__(
        self, rid: str, uid: int, ids: np.ndarray, max_tokens: int, arrival_s: float
    ) -> None:
        self.rid = rid
        self.uid = uid  # dense integer id, unique within the model
        self.ids = ids  # prompt token ids as the engine sees them (BOS included), int64
        self.prompt_len = int(ids.shape[0])
        self.max_tokens = int(max_tokens)
        self.arrival_s = float(arrival_s)
        # when the engine's scheduler can first see it (a front end before it: vLLM V1 on the CPU)
        self.ready_s = self.arrival_s
        # output tokens generated (while decoding: as of the request's last join or leave)
        self.out = 0
        self.state = WAITING
        self.d0 = 0  # decode step index at which the request (re)joined the decode batch
        self.g0 = 0  # output tokens at that moment
        self.segs: list[tuple[int, int]] = []  # [d0, d1) decode-step ranges it emitted a token in
        self.pre_times: list[float] = []  # tokens emitted by prefill iterations (first token)
        self.computed = 0  # prompt tokens computed so far in the current prefill
        self.cached_tokens = 0  # tokens served from the prefix cache in the current prefill
        self.extend_len = 0
        self.phase = -1
        self.hashes: list[int] = []
        self.blocks: list[int] = []
        self.n_blocks = 0
        self.last_node: object = None
        self.key = b""  # SGLang: radix-tree key of the prompt
        self.match_len = 0
        self.match_ver = -1
        self.error: str | None = None

    @property
    def seq_len(self) -> int:
        """Prompt plus generated tokens (what a recompute/retraction has to prefill again)."""
        return self.prompt_len + self.out

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Req({self.rid!r}, P={self.prompt_len}, out={self.out}/{self.max_tokens})"


@dataclass(slots=True)
class Iteration:
    """What one engine iteration did. Token results become visible at `start_s + duration_s`."""

    start_s: float
    duration_s: float
    kind: str  # "prefill", "decode" or "mixed" (prefill chunks and decodes in one forward pass)
    batch_size: int  # sequences in the forward pass
    # prompt tokens scheduled (the engine's accounting, cache hits included for vLLM)
    prefill_tokens: int
    computed_tokens: int  # prompt tokens actually computed (cache hits excluded)
    cached_tokens: int  # prompt tokens served from the prefix cache
    decode_tokens: int  # decode tokens (one per decoding request)
    emitted: tuple[str, ...]  # requests that received one output token at the end of the iteration
    finished: tuple[str, ...]  # requests that completed (their last token is in this iteration)
    # vLLM recompute preemptions / SGLang retractions
    preempted: tuple[str, ...] = field(default=())
    rejected: tuple[str, ...] = field(default=())  # requests the engine refused (prompt too long)
    cuda_graph: bool = False

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


class DecodeTracker:
    """The decode batch of one engine: membership, per-step times and token accounting in O(1) per step.

    At decode step `d` a member joined at (d0, g0) holds `g0 + d - d0` output tokens before the step and
    attends over `prompt_len + g0 + d - d0` tokens; the step gives it one more token.
    """

    __slots__ = ("ctx_sum", "finish_at", "g_minus_d", "max_sum", "members", "step", "times")

    def __init__(self) -> None:
        self.step = 0  # index of the next decode step
        self.times: list[float] = []  # end time of each decode step
        self.members: dict[Req, None] = {}  # insertion order = join order
        self.finish_at: dict[int, list[Req]] = {}
        self.ctx_sum = 0  # Σ context length (incl. the token being decoded) at the next step
        self.g_minus_d = 0  # Σ (g0 - d0): outputs of members = g_minus_d + n*step
        self.max_sum = 0  # Σ max_tokens of members

    def __len__(self) -> int:
        return len(self.members)

    def join(self, r: Req) -> None:
        """`r` (with `r.out` tokens, r.out < r.max_tokens) decodes from the next step on."""
        r.state = DECODING
        r.d0 = self.step
        r.g0 = r.out
        self.members[r] = None
        self.finish_at.setdefault(self.step + r.max_tokens - r.out - 1, []).append(r)
        self.ctx_sum += r.prompt_len + r.out
        self.g_minus_d += r.out - self.step
        self.max_sum += r.max_tokens

    def outputs(self, r: Req) -> int:
        """Output tokens `r` holds now (before the next step)."""
        return r.g0 + self.step - r.d0

    def total_outputs(self) -> int:
        return self.g_minus_d + len(self.members) * self.step

    def leave(self, r: Req) -> None:
        """Remove `r` before the next step (preemption, retraction, abort) or right after its last one."""
        del self.members[r]
        end = self.step
        if end > r.d0:
            r.segs.append((r.d0, end))
        r.out = r.g0 + end - r.d0
        self.ctx_sum -= r.prompt_len + r.out
        self.g_minus_d -= r.g0 - r.d0
        self.max_sum -= r.max_tokens
        due = r.d0 + r.max_tokens - r.g0 - 1
        lst = self.finish_at.get(due)
        if lst is not None and r in lst:
            lst.remove(r)
            if not lst:
                del self.finish_at[due]

    def advance(self, end_s: float) -> list[Req]:
        """Run one decode step ending at `end_s`; return the members that finished with it (removed)."""
        d = self.step
        self.times.append(end_s)
        self.step = d + 1
        self.ctx_sum += len(self.members)
        done = self.finish_at.pop(d, None)
        if not done:
            return []
        for r in done:
            del self.members[r]
            r.segs.append((r.d0, d + 1))
            r.out = r.g0 + d + 1 - r.d0
            self.ctx_sum -= r.prompt_len + r.out
            self.g_minus_d -= r.g0 - r.d0
            self.max_sum -= r.max_tokens
        return done

    def token_times(self, r: Req) -> np.ndarray:
        """Every output token's time for `r` so far (prefill tokens and decode steps), ascending."""
        parts = [np.asarray(r.pre_times, dtype=np.float64)]
        times = self.times
        for d0, d1 in r.segs:
            parts.append(np.asarray(times[d0:d1], dtype=np.float64))
        if r.state == DECODING and self.step > r.d0:
            parts.append(np.asarray(times[r.d0 : self.step], dtype=np.float64))
        out = np.concatenate(parts)
        out.sort(kind="stable")
        return out


class EngineModel(ABC):
    """The interface every simulated engine implements (see the module docstring).

    A subclass keeps its requests in `reqs` and its decoding requests in `dec`; the per-request
    read-outs (`token_times`, `output_tokens`, `prompt_tokens`, `error`, `forget`) and the common
    part of `add_request` (`_new_request`) are implemented here once.
    """

    engine: str
    reqs: dict[str, Req]
    dec: DecodeTracker
    _uid: int
    bos_token_id: int | None

    @abstractmethod
    def add_request(
        self, req_id: str, prompt_token_ids: Sequence[int] | np.ndarray, max_tokens: int, now: float
    ) -> None:
        """Queue a request (the engine prepends BOS itself when the model has one)."""

    @abstractmethod
    def abort(self, req_id: str) -> None:
        """Drop a request wherever it is, freeing its memory (client timeout or disconnect)."""

    @abstractmethod
    def has_work(self) -> bool:
        """True when a call to `step` would run an iteration."""

    @abstractmethod
    def step(self, now: float) -> Iteration:
        """Choose and run one iteration starting at `now` by the engine's rules."""

    @abstractmethod
    def metrics(self) -> dict[str, float]:
        """Current values of the engine's own /metrics series (gauges and counters)."""

    def _prompt_ids(
        self, req_id: str, prompt_token_ids: Sequence[int] | np.ndarray, max_tokens: int
    ) -> np.ndarray:
        """The prompt as the engine holds it (BOS prepended when the model has one), after the
        checks every engine makes of a new request."""
        if req_id in self.reqs:
            raise ValueError(f"request {req_id}: already in the engine")
        if max_tokens < 1:
            raise ValueError(f"request {req_id}: max_tokens must be >= 1")
        ids = np.asarray(prompt_token_ids, dtype=np.int64)
        if self.bos_token_id is not None:
            ids = np.concatenate((np.array([self.bos_token_id], dtype=np.int64), ids))
        return ids

    def _new_request(self, req_id: str, ids: np.ndarray, max_tokens: int, now: float) -> Req:
        """Record a new request (ids as `_prompt_ids` returned them, possibly cut)."""
        r = Req(req_id, self._uid, ids, max_tokens, now)
        self._uid += 1
        self.reqs[req_id] = r
        return r

    def token_times(self, req_id: str) -> np.ndarray:
        """Times of every output token the request has received so far."""
        return self.dec.token_times(self.reqs[req_id])

    def output_tokens(self, req_id: str) -> int:
        """Output tokens generated so far."""
        r = self.reqs[req_id]
        return self.dec.outputs(r) if r.state == DECODING else r.out

    def forget(self, req_id: str) -> None:
        """Release the bookkeeping of a finished or aborted request."""
        r = self.reqs.pop(req_id, None)
        if r is not None and r.state not in (FINISHED, ABORTED):
            self.reqs[req_id] = r
            raise ValueError(f"request {req_id}: still in the engine")

    def prompt_tokens(self, req_id: str) -> int:
        """Prompt tokens as the engine reports them in usage (BOS included)."""
        return self.reqs[req_id].prompt_len

    def error(self, req_id: str) -> str | None:
        """Why the engine refused a request (None if it did not)."""
        return self.reqs[req_id].error
