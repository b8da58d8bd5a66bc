"""One run through the live dispatcher: load and validate the trace, dispatch it, build the artifacts.

`dispatch_run_files` is the plain-value entry point (requests.parquet and run.json written through
servelab.artifacts). `dispatch_run` does the same without writing, for backends that put more
between the two files (the local backend pulls the Prometheus window before writing run.json, so a
run.json never exists without its scrape.parquet).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import pyarrow as pa

from servelab.artifacts import REQUESTS_SCHEMA, conform, write_json, write_parquet
from servelab.artifacts.runrecord import build_run_record
from servelab.dispatch.actions import TimedAction
from servelab.dispatch.client import WARMUP_MAX_TOKENS, Dispatcher, DispatchResult, pool_size
from servelab.dispatch.parallel import run_parallel
from servelab.dispatch.records import RequestRecord, RequestSpec
from servelab.grid.settings import DispatchSettings
from servelab.workload import load_trace, warmup_prompts
from servelab.workload.tokenizer import encode_batch, load_tokenizer

# Warm-up prompt length: the simulator's (servelab.sim.run.WARMUP_PROMPT_TOKENS), same protocol.
WARMUP_PROMPT_TOKENS = 128

__all__ = [
    "dispatch_run",
    "dispatch_run_files",
    "requests_table",
    "served_model",
    "tokenizer_counter",
    "warmup_specs",
]

log = logging.getLogger(__name__)


def requests_table(records: Sequence[RequestRecord], run_id: str) -> pa.Table:
    """The requests.parquet table (REQUESTS_SCHEMA) of a dispatch, rows in send order groups."""
    rows = [rec.row(run_id) for rec in records]
    table = (
        pa.Table.from_pylist(rows, schema=REQUESTS_SCHEMA)
        if rows
        else REQUESTS_SCHEMA.empty_table()
    )
    return conform(table, REQUESTS_SCHEMA, what=f"requests of {run_id}")


def warmup_specs(
    *, seed: int, n: int, tokenizer: str, prompt_tokens: int = WARMUP_PROMPT_TOKENS
) -> list[RequestSpec]:
    """The warm-up requests (the simulator's protocol): ids warmup-00.., role `warmup`, graph -1,
    `prompt_tokens`-token prompts (128 by default) from servelab.workload.warmup_prompts (sharing
    no prefix with the trace), 16 output tokens each."""
    if n <= 0:
        return []
    prompts = warmup_prompts(seed, n, prompt_tokens, tokenizer)
    width = max(2, len(str(n - 1)))
    return [
        RequestSpec(
            request_id=f"warmup-{i:0{width}d}",
            graph_id=-1,
            role="warmup",
            warmup=True,
            max_tokens=WARMUP_MAX_TOKENS,
            prompt=text,
        )
        for i, (text, _ids) in enumerate(prompts)
    ]


def tokenizer_counter(name: str) -> Callable[[list[str]], list[int]]:
    """Token counts of chunk texts with the workload tokenizer `name` (loaded on first use)."""

    def count(texts: list[str]) -> list[int]:
        if not texts:
            return []
        return [len(ids) for ids in encode_batch(load_tokenizer(name), list(texts))]

    return count


def served_model(base_url: str, timeout_s: float = 10.0) -> str:
    """The first model id the server lists at /v1/models."""
    resp = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout_s)
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data or "id" not in data[0]:
        raise ValueError(f"{base_url}/v1/models lists no model")
    return str(data[0]["id"])


def dispatch_run(
    *,
    base_url: str,
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
    arm: str,
    engine: str,
    condition: str,
    rep: str,
    backend: str,
    deployment_id: str,
    resolved_config: Mapping[str, Any],
    warmup_requests: int,
    request_timeout_s: float,
    success_threshold: float,
    warmup_prompt_tokens: int | None = None,
    warmup_spacing_s: float = 0.0,
    offered_load_rps: float,
    attempt: int,
    node_identity_fn: Callable[[], Mapping[str, Any]],
    health_timeout_s: float = DispatchSettings.health_timeout_s,
    model_name: str | None = None,
    ignore_eos: bool = True,
    progress_interval_s: float = 10.0,
    actions: Sequence[TimedAction] = (),
    count_tokens: Callable[[list[str]], list[int]] | None = None,
    extra: Mapping[str, Any] | None = None,
    workers: int = 1,
    client: str = DispatchSettings.client,
    node_watch_s: float = 0.0,
    node_change: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] | None = None,
) -> tuple[pa.Table, dict[str, Any], DispatchResult]:
    """Dispatch one run; return (requests table, run record, raw result) without writing anything.

    The trace is validated by servelab.workload.load_trace before anything is sent (a trace that
    fails a check is never dispatched). Node identity is read before the first request and after
    the last; the record's `node` holds both (`start`, `end`). `workers` > 1 spreads the graphs
    over that many processes (servelab.dispatch.parallel) for loads one event loop cannot read.
    `client` is `dispatch.client`: "paced" (a pacer process sends, the loop reads) or "httpx".
    With `node_watch_s` > 0 node identity is also read every that many seconds during the run, and
    the run stops (status interrupted) as soon as `node_change(start, now)` gives a reason: a
    reclaimed node does not keep a run going to its end.
    """
    loaded = load_trace(trace_path, manifest_path)
    manifest = loaded.manifest
    run_id = f"{arm}/{engine}/{condition}/{rep}"
    tokenizer = str(manifest["tokenizer"])
    warmup = warmup_specs(
        seed=loaded.seed,
        n=int(warmup_requests),
        tokenizer=tokenizer,
        prompt_tokens=WARMUP_PROMPT_TOKENS
        if warmup_prompt_tokens is None
        else warmup_prompt_tokens,
    )
    pool = pool_size(
        n_requests=len(loaded.requests),
        offered_load_rps=offered_load_rps,
        request_timeout_s=request_timeout_s,
        warmup_requests=len(warmup),
    )
    node_start = dict(node_identity_fn())
    if node_watch_s > 0:
        if node_change is None:
            raise ValueError("node_watch_s needs node_change")
        actions = [
            *actions,
            node_watch(node_identity_fn, node_start, node_change, every_s=node_watch_s),
        ]
    options: dict[str, Any] = dict(
        base_url=base_url,
        model=model_name or served_model(base_url),
        trace=loaded.requests,
        prompts={rid: p.text for rid, p in loaded.prompts.items()},
        warmup=warmup,
        warmup_spacing_s=warmup_spacing_s,
        request_timeout_s=request_timeout_s,
        health_timeout_s=health_timeout_s,
        ignore_eos=ignore_eos,
        pool=pool,
        progress_interval_s=progress_interval_s,
        count_tokens=count_tokens or tokenizer_counter(tokenizer),
        actions=actions,
        client=client,
    )
    log.info(
        "run %s: dispatching %d requests (+%d warm-up) to %s, pool %d",
        run_id,
        len(loaded.requests),
        len(warmup),
        base_url,
        pool,
    )
    if workers > 1:
        result = run_parallel(**options, workers=workers)
    else:
        result = Dispatcher(**options).run()
    try:
        node_end = dict(node_identity_fn())
    except Exception as exc:  # the node is gone: that is itself a change
        node_end = {"error": f"{type(exc).__name__}: {exc}"}
    table = requests_table(result.records, run_id)
    record_extra: dict[str, Any] = {
        "trace_start_s": result.trace_start_s,
        "dispatcher": {
            "base_url": base_url,
            "pool_size": result.pool_size,
            "client_cpu_s": round(result.client_cpu_s, 3),
            "duration_s": round(result.duration_s, 3),
            "chunk_token_sources": result.chunk_token_sources,
            "chunk_token_mismatches": result.chunk_token_mismatches,
            "send_overhead_s": result.send_overhead_s,
            "workers": workers,
            "client": client,
            "connections_opened": result.connections_opened,
            "stale_retries": result.stale_retries,
            # kept out when 0, so that a run dispatched at once reads as it always did
            **({"warmup_spacing_s": warmup_spacing_s} if warmup_spacing_s else {}),
        },
    }
    if result.interrupted:
        record_extra["interrupted_reason"] = result.interrupt_reason
    record_extra.update(extra or {})
    record = build_run_record(
        arm=arm,
        engine=engine,
        condition=condition,
        rep=rep,
        seed=loaded.seed,
        trace_sha256=loaded.trace_sha256,
        backend=backend,
        deployment_id=deployment_id,
        resolved_config=resolved_config,
        start_unix_s=result.start_unix_s,
        end_unix_s=result.end_unix_s,
        offered_load_rps=offered_load_rps,
        requests=table,
        success_threshold=success_threshold,
        attempt=attempt,
        node={"start": node_start, "end": node_end},
        interrupted=result.interrupted,
        extra=record_extra,
    )
    return table, record, result


def node_watch(
    node_identity_fn: Callable[[], Mapping[str, Any]],
    start: Mapping[str, Any],
    change: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None],
    *,
    every_s: float,
) -> TimedAction:
    """A watch (TimedAction with every_s) that stops the run when the node under it changes."""

    def check() -> str | None:
        return change(start, dict(node_identity_fn()))

    return TimedAction(at_s=every_s, action=check, reason="node watch", every_s=every_s)


def dispatch_run_files(
    *,
    requests_path: str | os.PathLike[str],
    run_json_path: str | os.PathLike[str],
    **kwargs: Any,
) -> dict[str, Any]:
    """`dispatch_run` (same keyword arguments), then write requests.parquet and run.json."""
    table, record, _ = dispatch_run(**kwargs)
    write_parquet(requests_path, table, REQUESTS_SCHEMA)
    write_json(run_json_path, record)
    log.info(
        "run %s: %s (%d/%d ok)",
        record["run_id"],
        record["status"],
        record["n_ok"],
        record["n_sent"],
    )
    return record
