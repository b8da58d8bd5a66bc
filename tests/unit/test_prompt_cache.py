"""The prompt-cache check (servelab.deploy.prompt_cache): a run is refused when its engine served
more prompt tokens from its cache than the run's own prompts can share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servelab.artifacts import SCRAPE_SCHEMA
from servelab.deploy.prompt_cache import (
    cached_tokens,
    fresh_server_reason,
    prompt_cache_check,
    refusal,
    reusable_tokens,
)
from servelab.engines.registry import engine_names, engine_spec

DATA = Path(__file__).resolve().parents[1] / "data" / "prompt_cache"


def brute_force(prompts: list[np.ndarray]) -> int:
    total = 0
    for i, a in enumerate(prompts):
        best = 0
        for j, b in enumerate(prompts):
            if i != j:
                n = 0
                while n < min(len(a), len(b)) and a[n] == b[n]:
                    n += 1
                best = max(best, n)
        total += 1 + best
    return total


def test_reusable_tokens_by_hand() -> None:
    prompts = [np.array(p) for p in ([1, 2, 3, 4], [1, 2, 3, 9], [5, 6], [1, 2])]
    # LCPs with the best other prompt: 3, 3, 0, 2; plus one BOS each
    assert reusable_tokens(prompts) == 4 + 4 + 1 + 3


@pytest.mark.parametrize("seed", range(5))
def test_reusable_tokens_equals_the_pairwise_maximum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 3, size=rng.integers(0, 6)) for _ in range(3)]
    prompts = [
        np.concatenate([prefixes[rng.integers(0, 3)], rng.integers(0, 3, size=rng.integers(0, 6))])
        for _ in range(25)
    ]
    assert reusable_tokens(prompts) == brute_force(prompts)


def scrape(values: list[float], source: str = "vllm:prompt_tokens_cached_total") -> pa.Table:
    return pa.table(
        {
            "run_id": ["r"] * len(values),
            "t_s": [float(i) for i in range(len(values))],
            "source_metric": [source] * len(values),
            "value": values,
        },
        schema=SCRAPE_SCHEMA,
    )


def test_cached_tokens_is_the_counter_increase_and_a_reset_counts_from_zero() -> None:
    assert cached_tokens(scrape([100.0, 150.0, 400.0]), "vllm_v1") == 300.0
    assert cached_tokens(scrape([100.0, 150.0, 20.0, 50.0]), "vllm_v1") == 50.0 + 20.0 + 30.0
    # out of time order in the file: sorted by time first
    table = scrape([100.0, 150.0, 400.0]).take([2, 0, 1])
    assert cached_tokens(table, "vllm_v1") == 300.0


def test_an_engine_without_a_cached_counter_is_not_judged(tmp_path: Path) -> None:
    # vLLM 0.6.3 exports a hit-rate gauge, no counter of cached tokens
    assert cached_tokens(scrape([1.0, 2.0]), "vllm") is None
    assert cached_tokens(scrape([1.0, 2.0], source="other"), "vllm_v1") is None
    check = prompt_cache_check(
        scrape=scrape([1.0, 2.0]),
        engine="vllm",
        trace_path=tmp_path / "absent.parquet",  # not read
        warmup_requests=2,
        warmup_prompt_tokens=128,
    )
    assert check == {"cached_tokens": None, "reusable_tokens": None, "warm": None}
    assert refusal(check) is None


def study_shaped_trace(path: Path, n: int, seed: int) -> Path:
    """n prompts of 1,024 tokens, the first 512 one prefix all share (the CPU pair's shape)."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 128_000, size=512)
    prompts = [np.concatenate([prefix, rng.integers(0, 128_000, size=512)]) for _ in range(n)]
    pq.write_table(
        pa.table(
            {"prompt_token_ids": pa.array([p.tolist() for p in prompts], pa.list_(pa.int32()))}
        ),
        path,
    )
    return path


@pytest.mark.parametrize(
    ("name", "n_requests", "warm"), [("warm", 414, True), ("cold", 342, False)]
)
def test_the_real_retried_run_is_refused_and_a_first_attempt_is_not(
    tmp_path: Path, name: str, n_requests: int, warm: bool
) -> None:
    """Real vLLM V1 scrapes (tests/data/prompt_cache/README.md): a retry that ran on the engine
    its first attempt had filled, and a first attempt, each against a trace of its shape."""
    real = pq.read_table(DATA / f"{name}_scrape.parquet")
    trace = study_shaped_trace(tmp_path / "trace.parquet", n_requests, seed=n_requests)
    check = prompt_cache_check(
        scrape=real,
        engine="vllm_v1",
        trace_path=trace,
        warmup_requests=2,
        warmup_prompt_tokens=128,
    )
    assert check["reusable_tokens"] == n_requests * 513 + 2 * 129
    assert check["warm"] is warm
    reason = refusal(check)
    assert (reason is not None) is warm
    if reason:
        assert f"{check['cached_tokens']:.0f}" in reason and "prompt cache" in reason


def test_a_run_needs_a_fresh_server_after_its_own_trace_or_on_an_engine_with_a_history_cost() -> (
    None
):
    """A retry or a redo of a trace needs a fresh server on any engine; an engine whose requests
    cost more the more it has served needs one after any trace; a server that has served nothing
    needs none."""
    for engine in ("vllm_v1", "llamacpp"):
        assert fresh_server_reason(engine, [], "a") is None
        assert "has served this trace" in str(fresh_server_reason(engine, ["b", "a"], "a"))
    assert fresh_server_reason("vllm_v1", ["b", "c"], "a") is None  # the same server goes on
    reason = fresh_server_reason("llamacpp", ["b", "c"], "a")
    assert reason is not None and reason.startswith("it has served 2 trace(s)")
    assert "server_prompt_cache::alloc" in reason  # the cited cost


def test_llamacpp_is_the_engine_whose_requests_cost_more_with_its_history() -> None:
    """llama-server's host prompt cache keeps every prompt and scans them all on every task
    (benchmarks/llamacpp_trace_cost.py measures it); vLLM's and SGLang's prefix caches are looked
    up by block hash and radix tree, at a cost that does not grow with the entries kept."""
    costly = {name for name in engine_names() if engine_spec(name).history_cost}
    assert costly == {"llamacpp"}
    assert "0c1e570" in str(engine_spec("llamacpp").history_cost)
