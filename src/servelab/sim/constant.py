"""`ConstantModel`: a constant-cost engine model for the live sim server's tests and the
dispatcher benchmark (`servelab serve-sim --cost-model constant`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servelab.engines.metrics import METRIC_MAP
from servelab.engines.registry import engine_names
from servelab.sim.base import DECODING, FINISHED, EngineModel, Iteration, Req

__all__ = ["ConstantModel"]


class ConstantModel(EngineModel):
    """A trivial engine model for tests and the dispatcher benchmark: every iteration lasts exactly
    `itl_s` and gives one token to every request in the engine (new requests included: their
    first token comes at the end of the first iteration they join), with unlimited batching.

    Its true inter-token latency is therefore the server's achieved iteration length, which the
    dispatcher benchmark compares its measured ITL against. Metrics are exported under the
    engine's own names (engines.METRIC_MAP) with simple values. The prompt is taken as given (no
    BOS), and every request is decoding from the iteration it joins.
    """

    def __init__(self, engine: str, *, itl_s: float = 0.02) -> None:
        if engine not in engine_names():
            raise ValueError(f"unknown engine {engine!r}")
        if itl_s <= 0:
            raise ValueError(f"itl_s must be positive, got {itl_s}")
        self.engine = engine
        self.itl_s = itl_s
        self.bos_token_id = None
        self.reqs: dict[str, Req] = {}
        self._uid = 0
        self._times: dict[str, list[float]] = {}
        self._waiting: dict[str, Req] = {}
        self._running: dict[str, Req] = {}
        self._prompt_total = 0
        self._generation_total = 0

    def add_request(
        self, req_id: str, prompt_token_ids: Sequence[int] | np.ndarray, max_tokens: int, now: float
    ) -> None:
        if req_id in self._waiting or req_id in self._running:
            raise ValueError(f"request {req_id} added twice")
        self.reqs.pop(req_id, None)  # a finished request's id may come again
        ids = self._prompt_ids(req_id, prompt_token_ids, max_tokens)
        self._waiting[req_id] = self._new_request(req_id, ids, int(max_tokens), now)
        self._times[req_id] = []

    def abort(self, req_id: str) -> None:
        self._waiting.pop(req_id, None)
        self._running.pop(req_id, None)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def step(self, now: float) -> Iteration:
        for rid, r in self._waiting.items():
            self._prompt_total += r.prompt_len
            r.state = DECODING
            self._running[rid] = r
        self._waiting.clear()
        emitted = tuple(self._running)
        finished = []
        for rid in emitted:
            r = self._running[rid]
            r.out += 1
            self._times[rid].append(now + self.itl_s)
            if r.out >= r.max_tokens:
                r.state = FINISHED
                del self._running[rid]
                finished.append(rid)
        self._generation_total += len(emitted)
        return Iteration(
            start_s=now,
            duration_s=self.itl_s,
            kind="decode",
            batch_size=len(emitted),
            prefill_tokens=0,
            computed_tokens=0,
            cached_tokens=0,
            decode_tokens=len(emitted),
            emitted=emitted,
            finished=tuple(finished),
        )

    def token_times(self, req_id: str) -> np.ndarray:
        return np.asarray(self._times[req_id], dtype=np.float64)

    def output_tokens(self, req_id: str) -> int:
        return self.reqs[req_id].out

    def forget(self, req_id: str) -> None:
        self.reqs.pop(req_id, None)
        self._times.pop(req_id, None)

    def metrics(self) -> dict[str, float]:
        values = {
            "kv_cache_usage": min(1.0, len(self._running) / 256.0),
            "requests_running": float(len(self._running)),
            "requests_waiting": float(len(self._waiting)),
            "preemptions_total": 0.0,
            "prompt_tokens_total": float(self._prompt_total),
            "generation_tokens_total": float(self._generation_total),
            "prefix_cache_hit_rate": 0.0,
        }
        return {
            source: values[canonical]
            for canonical, source in METRIC_MAP[self.engine].items()
            if source is not None and canonical in values
        }
