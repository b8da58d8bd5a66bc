"""The dispatcher spread over worker processes, for loads one event loop cannot read fast enough.

Graph release never crosses a graph (every request's predecessors are in its own graph: the
validator's `graphs_acyclic_resolvable` check), so the trace is split by graph, round-robin in
arrival order, and each worker process runs an ordinary `Dispatcher` over its graphs with its own
`ReleaseTracker`, event loop and connections. They share the run's clock: this process polls
health and sends the warm-up, then hands every worker the clock origin (a `time.perf_counter()`
value; CLOCK_MONOTONIC is system-wide on Linux) and the trace start. Timed actions run here; one
that stops the run is forwarded to every worker. Records come back over pipes and are merged in
trace order; tokens per chunk are counted here once.

Workers are started (spawn) and have built their request bodies before the warm-up, so process
start-up never delays the trace. An action due during the warm-up runs when the warm-up ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Any

from servelab.dispatch.actions import TimedAction, run_timed_action
from servelab.dispatch.client import (
    Dispatcher,
    DispatchError,
    DispatchResult,
    fill_token_counts,
    overhead_summary,
)
from servelab.dispatch.records import RequestSpec
from servelab.grid.settings import DispatchSettings
from servelab.workload.release import TraceRequest

__all__ = ["run_parallel"]

log = logging.getLogger(__name__)

WORKER_READY_TIMEOUT_S = 120.0


def _worker_main(conn: Any, kwargs: dict[str, Any]) -> None:
    """A worker process: prepare, wait for the clock, dispatch its graphs, send the result."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # The dispatcher says "ready" once it can send on time (its pacer process up), then takes
    # the run's clock over `conn`.
    dispatcher = Dispatcher(**kwargs, control=conn, await_go=True, defer_token_counts=True)
    try:
        result: Any = dispatcher.run()
    except Exception as exc:  # reported to the supervisor, which raises it
        result = DispatchError(f"dispatch worker failed: {type(exc).__name__}: {exc}")
    conn.send(("result", result))
    conn.close()


def _partition(trace: Sequence[TraceRequest], workers: int) -> list[list[TraceRequest]]:
    order: dict[int, int] = {}
    for r in trace:
        order.setdefault(r.graph_id, len(order))
    parts: list[list[TraceRequest]] = [[] for _ in range(workers)]
    for r in trace:
        parts[order[r.graph_id] % workers].append(r)
    return parts


def run_parallel(
    *,
    base_url: str,
    model: str,
    trace: Sequence[TraceRequest],
    prompts: dict[str, str | Sequence[int]],
    warmup: Sequence[RequestSpec],
    workers: int,
    request_timeout_s: float = 300.0,
    health_timeout_s: float = DispatchSettings.health_timeout_s,
    ignore_eos: bool = True,
    pool: int = 64,
    progress_interval_s: float = 10.0,
    count_tokens: Callable[[list[str]], list[int]] | None = None,
    actions: Sequence[TimedAction] = (),
    client: str = DispatchSettings.client,
    warmup_spacing_s: float = 0.0,
) -> DispatchResult:
    """Dispatch `trace` with `workers` processes; the same result as `Dispatcher.run()`."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    graph_of = {r.request_id: r.graph_id for r in trace}
    for r in trace:
        for dep in r.depends_on:
            if graph_of.get(dep) != r.graph_id:
                raise ValueError(f"request {r.request_id} depends on {dep} of another graph")
    ctx = multiprocessing.get_context("spawn")
    parts = _partition(trace, workers)
    conns, procs = [], []
    try:
        for part in parts:
            parent, child = ctx.Pipe()
            kwargs = {
                "base_url": base_url,
                "model": model,
                "trace": part,
                "prompts": {r.request_id: prompts[r.request_id] for r in part},
                "request_timeout_s": request_timeout_s,
                "ignore_eos": ignore_eos,
                "pool": max(8, math.ceil(pool / workers)),
                "progress_interval_s": progress_interval_s,
                "client": client,
            }
            proc = ctx.Process(target=_worker_main, args=(child, kwargs), daemon=True)
            proc.start()
            child.close()
            conns.append(parent)
            procs.append(proc)
        for conn in conns:
            if not conn.poll(WORKER_READY_TIMEOUT_S):
                raise DispatchError(
                    f"a dispatch worker was not ready in {WORKER_READY_TIMEOUT_S:g} s"
                )
            kind, payload = conn.recv()
            if kind != "ready":  # the worker failed before it could send: its error
                raise payload if isinstance(payload, Exception) else DispatchError(str(payload))
        head = Dispatcher(
            base_url=base_url,
            model=model,
            trace=[],
            prompts={},
            warmup=warmup,
            warmup_spacing_s=warmup_spacing_s,
            request_timeout_s=request_timeout_s,
            health_timeout_s=health_timeout_s,
            ignore_eos=ignore_eos,
            pool=max(8, len(warmup)),
            progress_interval_s=1e9,
            defer_token_counts=True,
            client=client,
        )
        cpu0 = time.process_time()
        head_result = head.run()
        origin = head._t0
        for conn in conns:
            conn.send(("go", origin, head_result.trace_start_s))
        results, stop_reason = asyncio.run(_supervise(conns, actions, origin))
        cpu = time.process_time() - cpu0
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in conns:
            conn.close()
    for result in results:
        if isinstance(result, Exception):
            raise result
    by_id = {rec.request_id: rec for res in [head_result, *results] for rec in res.records}
    ordered = [by_id[s.request_id] for s in warmup] + [by_id[r.request_id] for r in trace]
    if stop_reason is not None:  # the workers' own wording, with the supervisor's reason
        for rec in ordered:
            if rec.error and "run interrupted" in rec.error and stop_reason not in rec.error:
                rec.error = f"{rec.error} ({stop_reason})"
    sources, mismatches = fill_token_counts(ordered, count_tokens)
    duration = max([head_result.duration_s, *(r.duration_s for r in results)])
    samples = [x for res in [head_result, *results] for x in res.send_overhead_samples]
    return DispatchResult(
        records=ordered,
        start_unix_s=head_result.start_unix_s,
        end_unix_s=head_result.start_unix_s + duration,
        duration_s=duration,
        trace_start_s=head_result.trace_start_s,
        interrupted=stop_reason is not None,
        interrupt_reason=stop_reason,
        pool_size=sum(r.pool_size for r in results),
        client_cpu_s=cpu + sum(r.client_cpu_s for r in results),
        chunk_token_sources=sources,
        chunk_token_mismatches=mismatches,
        send_overhead_s=overhead_summary(samples),
        send_overhead_samples=samples,
        connections_opened=(
            None
            if head_result.connections_opened is None
            else sum(r.connections_opened or 0 for r in [head_result, *results])
        ),
        stale_retries=sum(r.stale_retries for r in [head_result, *results]),
        clock_origin_s=origin,
    )


async def _supervise(
    conns: list[Any], actions: Sequence[TimedAction], origin: float
) -> tuple[list[Any], str | None]:
    """Run the timed actions on the run's clock; collect every worker's result."""
    loop = asyncio.get_running_loop()
    results: list[Any] = [None] * len(conns)
    waits = []
    state: dict[str, str | None] = {"stop": None}

    for i, conn in enumerate(conns):
        fut: asyncio.Future[None] = loop.create_future()

        def on_message(i: int = i, conn: Any = conn, fut: asyncio.Future[None] = fut) -> None:
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError) as exc:
                kind, payload = "result", DispatchError(f"dispatch worker {i} died: {exc!r}")
            if kind == "result":
                results[i] = payload
                loop.remove_reader(conn.fileno())
                if not fut.done():
                    fut.set_result(None)

        loop.add_reader(conn.fileno(), on_message)
        waits.append(fut)

    started: set[TimedAction] = set()

    def stop(reason: str) -> None:
        if state["stop"] is None:
            state["stop"] = reason
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.send(("stop", reason))

    async def timed(action: TimedAction) -> None:
        await run_timed_action(
            action, clock=lambda: time.perf_counter() - origin, stop=stop, started=started
        )

    tasks = {a: asyncio.create_task(timed(a)) for a in actions}
    await asyncio.gather(*waits)
    for action, task in tasks.items():
        if action not in started:
            task.cancel()
    for task in tasks.values():
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return results, state["stop"]
