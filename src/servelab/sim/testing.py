"""Small engine models and a driver, for tests and experiments with hand-made workloads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servelab.sim.base import EngineModel, Iteration
from servelab.sim.cost import CostModel
from servelab.sim.params import EngineParams
from servelab.sim.presets import gpu_preset, model_preset
from servelab.sim.sglang import SglangModel
from servelab.sim.vllm import VllmModel

__all__ = ["drive", "small_sglang", "small_vllm"]

_MODEL = "llama-3.1-8b"


def small_vllm(
    *,
    kv_tokens: int = 8192,
    chunked: bool = False,
    budget: int | None = None,
    prefix_caching: bool = True,
    max_running: int = 256,
) -> VllmModel:
    """A vLLM model on the L4 cost model with an arbitrary (small) KV capacity."""
    if budget is None:
        budget = 512 if chunked else 16384
    params = EngineParams(
        engine="vllm",
        chunked_prefill=chunked,
        chunk_size=budget if chunked else None,
        token_budget=budget,
        prefix_caching=prefix_caching,
        context_len=16384,
        max_running=max_running,
        kv_capacity_tokens=kv_tokens,
        prompt_limit=16384 if chunked else min(16384, budget),
        overlap_schedule=False,
    )
    m = model_preset(_MODEL)
    return VllmModel(params, m, CostModel(m, gpu_preset("L4"), "vllm"))


def small_sglang(
    *,
    kv_tokens: int = 8192,
    chunk: int | None = 2048,
    policy: str = "lpm",
    max_running: int = 2048,
) -> SglangModel:
    """An SGLang model on the L4 cost model with an arbitrary (small) KV capacity."""
    params = EngineParams(
        engine="sglang",
        chunked_prefill=chunk is not None,
        chunk_size=chunk,
        token_budget=16384,
        prefix_caching=True,
        context_len=16384,
        max_running=max_running,
        kv_capacity_tokens=kv_tokens,
        prompt_limit=min(16383, kv_tokens - 1) - 5,
        schedule_policy=policy,
        block_size=1,
        cuda_graph_max_bs=8,
    )
    m = model_preset(_MODEL)
    return SglangModel(params, m, CostModel(m, gpu_preset("L4"), "sglang"))


def drive(
    model: EngineModel,
    arrivals: Sequence[tuple[float, str, np.ndarray, int]] = (),
    *,
    start_s: float = 0.0,
    max_iterations: int = 1_000_000,
) -> list[Iteration]:
    """Run `model` until idle, adding (time, id, prompt ids, max_tokens) arrivals between iterations."""
    pending = sorted(arrivals, key=lambda a: (a[0], a[1]))
    now = start_s
    out: list[Iteration] = []
    i = 0
    for _ in range(max_iterations):
        while i < len(pending) and pending[i][0] <= now:
            t, rid, ids, max_tokens = pending[i]
            model.add_request(rid, ids, max_tokens, t)
            i += 1
        if model.has_work():
            it = model.step(now)
            out.append(it)
            now = it.end_s
        elif i < len(pending):
            now = pending[i][0]
        else:
            return out
    raise RuntimeError("drive: the model did not go idle")
