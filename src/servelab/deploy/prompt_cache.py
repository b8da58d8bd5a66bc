"""A run is measured from a prompt cache that holds none of its own prompts.

An engine keeps its prefix cache between runs. Each (condition, repetition) has its own seeded
prompts, so a run normally finds nothing of its own in the cache. A retry, or a redo on a
deployment that stayed up, sends the same prompts again, and the engine serves them from the cache
the earlier attempt filled. The run then measures a warm cache the design never asked for. On the
real vLLM V1 of 2026-12-02, four retried runs computed 0.1% of their prompt tokens where the trace
makes them compute half (docs/campaigns.md, "A cold prompt cache").

The check reads the engine's own count of prompt tokens served from its cache over the run's
window (canonical `prompt_tokens_cached_total`, where the engine exports one). It compares that
count with the most the run's own prompts can share:

    reusable = Σ_requests (1 + longest common prefix with another prompt of the run)
             + warm-ups · (1 + warm-up prompt tokens)

The 1 is the BOS the engines prepend. A warm-up counts whole, because a retry's warm-ups repeat
the first attempt's. The bound does not depend on send order, so it holds whatever order the
engine serves the prompts in. Counting in blocks (vLLM) or per slot (llama.cpp) only lowers the
engine's count. A run whose engine counted more than this was served from a cache that held its
prompts before it began, and it is refused.

Before a run, `fresh_server_reason` says whether the live backends must start the engine afresh:
when the server has served the run's trace (a retry or a redo), and, for an engine whose cost of a
request grows with what it has served (`EngineSpec.history_cost`: llama-server scans every prompt
its host cache keeps on every task), when it has served anything. Such a run would otherwise
measure the campaign's run order along with its own condition.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from servelab.engines.metrics import METRIC_MAP
from servelab.engines.registry import engine_spec

__all__ = [
    "CACHED_METRIC",
    "cached_tokens",
    "fresh_server_reason",
    "prompt_cache_check",
    "refusal",
    "reusable_tokens",
]

CACHED_METRIC = "prompt_tokens_cached_total"


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def fresh_server_reason(engine: str, served_traces: Sequence[str], trace_sha256: str) -> str | None:
    """Why a run of the trace with SHA-256 `trace_sha256` must start on a freshly started server
    of `engine`, which has served `served_traces` since it started, or None when it need not."""
    if trace_sha256 in served_traces:
        return "it has served this trace: its prefix cache may hold the run's prompts"
    history_cost = engine_spec(engine).history_cost
    if served_traces and history_cost:
        return (
            f"it has served {len(served_traces)} trace(s), and a request costs {engine} more the "
            f"more it has served ({history_cost})"
        )
    return None


def reusable_tokens(prompts: list[np.ndarray]) -> int:
    """Σ (1 + longest common prefix with another prompt of the set), over the set's prompts.

    The prompt sharing the longest prefix with a given one is next to it in lexicographic order,
    so comparing each prompt with its neighbours in that order finds it."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].tolist())
    best = [0] * len(prompts)
    for left, right in itertools.pairwise(order):
        shared = _common_prefix(prompts[left], prompts[right])
        best[left] = max(best[left], shared)
        best[right] = max(best[right], shared)
    return sum(1 + b for b in best)


def cached_tokens(scrape: pa.Table, engine: str) -> float | None:
    """The increase of the engine's cached-prompt-token counter over the scrape's window (a
    reset, which a restarted engine would show, counts from zero). None: the engine exports no
    such counter, or the window holds none of it."""
    source = METRIC_MAP[engine].get(CACHED_METRIC)
    if source is None:
        return None
    rows = scrape.filter(pc.equal(scrape.column("source_metric"), source))
    if rows.num_rows == 0:
        return None
    order = pc.sort_indices(rows, sort_keys=[("t_s", "ascending")])
    values = np.asarray(rows.column("value").take(order).to_numpy(zero_copy_only=False))
    steps = np.diff(values)
    # a drop is a reset: the counter restarted from zero, and its new value is the increase
    return float(np.where(steps >= 0, steps, values[1:]).sum())


def prompt_cache_check(
    *,
    scrape: pa.Table,
    engine: str,
    trace_path: str | os.PathLike[str],
    warmup_requests: int,
    warmup_prompt_tokens: int,
) -> dict[str, Any]:
    """The run record's `prompt_cache` section: the engine's cached count, the run's reusable
    bound, and `warm` (the cache held the run's prompts before it began: the run is refused).
    `warm` is None where the engine counts no cached tokens."""
    cached = cached_tokens(scrape, engine)
    if cached is None:
        return {"cached_tokens": None, "reusable_tokens": None, "warm": None}
    column = pq.read_table(trace_path, columns=["prompt_token_ids"]).column("prompt_token_ids")
    prompts = [np.asarray(ids, dtype=np.int64) for ids in column.to_pylist()]
    reusable = reusable_tokens(prompts) + int(warmup_requests) * (1 + int(warmup_prompt_tokens))
    return {"cached_tokens": cached, "reusable_tokens": reusable, "warm": cached > reusable}


def refusal(check: Mapping[str, Any]) -> str | None:
    """Why a run with this `prompt_cache` section is refused, or None."""
    if not check.get("warm"):
        return None
    return (
        f"prompt cache: the engine served {check['cached_tokens']:.0f} prompt tokens from its "
        f"cache, more than the {check['reusable_tokens']} the run's own prompts can share; the "
        "cache held this run's prompts before it began (an earlier attempt on a live engine)"
    )
