"""A run's engine-metric window from Prometheus (HTTP API `query_range`), as scrape.parquet.

For each of the engine's source metrics (servelab.engines.METRIC_MAP) one range query over the
run's window [start, end] at the configured step; samples are kept under the engine's own metric
name with `t_s` in seconds from the run start (artifacts.SCRAPE_SCHEMA), the same raw form the
simulator writes, so one canonical mapping (telemetry.canonicalize) serves every backend.

**The window closes after the run.** A range query evaluates at start, start + step, ... and never
past `end`, and each evaluation sees the last scrape before it, so a window that ended at its own
time would lose what the engine counted in its last step and last scrape interval (a measured
case: docs/simulator.md, "Against the real engines", fix 7). The query therefore
runs on to the **closing time** (`closing_unix_s`): the first step of the grid at least one scrape
interval after the run's end, whose evaluation sees a scrape taken after the run's last token. The
samples past `end` are there for the counters; the canonical telemetry keeps them for counters
only (telemetry.canonicalize).

A missing or partial window is an error (TelemetryWindowError), never an empty table: the pulled
samples are checked with the same coverage rule the telemetry stage applies. Requests are retried
a bounded number of times on connection errors and 5xx answers.

The GPU's energy counter and power gauge (DCGM, `canonical.GPU_METRIC_MAP`) are pulled over the
same window when the backend names the engine GPU's label matchers (the kubernetes backend's
`kubernetes.gpu_metrics_selector`): `max by (UUID)` folds the series one GPU may be split into (an
exporter pod restarted, a pod label that came or went) and keeps two GPUs apart, so a selector
that matches more than one GPU is noticed, not summed. A GPU series that is missing or ambiguous
is logged and left out, never an error: a run is not failed over its energy figures, which are
then null.

The PromQL text lives here only (`promql_queries`, `gpu_promql_queries`); tests keep golden copies
of what they generate.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import httpx
import pyarrow as pa

from servelab.artifacts import SCRAPE_SCHEMA, write_parquet
from servelab.engines.metrics import METRIC_MAP, METRIC_PART_LABELS
from servelab.telemetry.canonical import GPU_METRIC_MAP, TelemetryWindowError, canonicalize

__all__ = [
    "PrometheusError",
    "closing_unix_s",
    "gpu_promql_queries",
    "promql_queries",
    "pull_gpu_window",
    "pull_scrape_files",
    "pull_window",
    "query_range",
]

log = logging.getLogger(__name__)

# One series per metric and run: `max` folds the (normally single) series a selector matches, so a
# series split by a label change (e.g. a restarted server) is never counted twice.
QUERY_TEMPLATE = "max({{{name},{matchers}}})"
# An engine whose series are split into parts by a label (EngineSpec.metric_part_labels): the
# parts of each series summed, then folded as above.
PARTS_TEMPLATE = "max(sum without ({parts}) ({{{name},{matchers}}}))"
# The GPU's series: one per GPU (dcgm-exporter labels every series with the GPU's UUID).
GPU_QUERY_TEMPLATE = "max by (UUID) ({{{name},{matchers}}})"


def name_matcher(metric: str) -> str:
    """The `__name__` matcher of an engine's metric as Prometheus may have stored it. A name with a
    namespace colon (`sglang:token_usage`) is matched with the colon or an underscore: an endpoint
    that negotiates OpenMetrics (SGLang 0.5.23's, through prometheus_client 0.26's ASGI app, which
    Prometheus 2.x asks for first) writes its samples' names with underscores
    (`sglang_token_usage`), while the text format, and vLLM's endpoint, keep the colon."""
    if ":" not in metric:
        return f'__name__="{metric}"'
    namespace, rest = metric.split(":", 1)
    return f'__name__=~"{namespace}[:_]{rest}"'


class PrometheusError(RuntimeError):
    """Prometheus did not answer a query usefully (after retries); the message names the query."""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _matchers(selector: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(selector.items()))


def gpu_promql_queries(selector: Mapping[str, str]) -> dict[str, str]:
    """The range query for each of the GPU's DCGM series, restricted by label `selector`."""
    if not selector:
        raise ValueError("a label selector is required (e.g. the engine's node)")
    matchers = _matchers(selector)
    return {
        source: GPU_QUERY_TEMPLATE.format(name=f'__name__="{source}"', matchers=matchers)
        for source in sorted(GPU_METRIC_MAP.values())
    }


def promql_queries(engine: str, selector: Mapping[str, str]) -> dict[str, str]:
    """The range query for each of `engine`'s source metrics, restricted by label `selector`."""
    if engine not in METRIC_MAP:
        raise ValueError(
            f"unknown engine {engine!r}; expected one of {', '.join(sorted(METRIC_MAP))}"
        )
    if not selector:
        raise ValueError("a label selector is required (e.g. the deployment label)")
    matchers = _matchers(selector)
    sources = sorted({s for s in METRIC_MAP[engine].values() if s is not None})
    parts = METRIC_PART_LABELS[engine]
    if parts:  # series split into parts (SGLang 0.5's is_streaming) are summed first
        template = PARTS_TEMPLATE.replace("{parts}", ", ".join(parts))
        return {
            source: template.format(name=name_matcher(source), matchers=matchers)
            for source in sources
        }
    return {
        source: QUERY_TEMPLATE.format(name=name_matcher(source), matchers=matchers)
        for source in sources
    }


def closing_unix_s(
    start_unix_s: float, end_unix_s: float, *, step_s: float, scrape_interval_s: float
) -> float:
    """The time a run's window is pulled to (module docstring): the first time of the step grid
    from `start_unix_s` at least `scrape_interval_s` after `end_unix_s`. The most recent scrape at
    that time was taken at or after the run's end (scrapes `scrape_interval_s` apart)."""
    if step_s <= 0 or scrape_interval_s < 0:
        raise ValueError(f"step {step_s} and scrape interval {scrape_interval_s}: bad values")
    steps = math.ceil((end_unix_s + scrape_interval_s - start_unix_s) / step_s - 1e-9)
    return start_unix_s + max(steps, 0) * step_s


def query_range(
    client: httpx.Client,
    query: str,
    *,
    start_unix_s: float,
    end_unix_s: float,
    step_s: float,
    retries: int = 3,
    backoff_s: float = 0.5,
) -> list[tuple[float, float]]:
    """(timestamp, value) pairs of `query` over [start, end] at `step_s`; bounded retries."""
    params = {
        "query": query,
        "start": f"{start_unix_s:.3f}",
        "end": f"{end_unix_s:.3f}",
        "step": f"{step_s:g}",
    }
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            resp = client.get("/api/v1/query_range", params=params)
        except httpx.TransportError as exc:
            last = f"{type(exc).__name__}: {exc}"
            continue
        if resp.status_code >= 500:
            last = f"HTTP {resp.status_code}: {resp.text[:200]}"
            continue
        try:
            body = resp.json()
        except ValueError:
            raise PrometheusError(f"query {query!r}: HTTP {resp.status_code}, not JSON") from None
        if resp.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(
                f"query {query!r}: HTTP {resp.status_code} {body.get('errorType', '')}: "
                f"{body.get('error', resp.text[:200])}"
            )
        result = body["data"]["result"]
        if body["data"].get("resultType") != "matrix":
            raise PrometheusError(
                f"query {query!r}: expected a matrix, got {body['data'].get('resultType')}"
            )
        if len(result) > 1:
            raise PrometheusError(f"query {query!r}: {len(result)} series, expected one")
        return [(float(ts), float(value)) for ts, value in (result[0]["values"] if result else [])]
    raise PrometheusError(f"query {query!r}: no answer after {retries + 1} attempts ({last})")


def pull_window(
    *,
    prometheus_url: str,
    engine: str,
    selector: Mapping[str, str],
    run_id: str,
    start_unix_s: float,
    end_unix_s: float,
    step_s: float,
    until_unix_s: float | None = None,
    require_full_window: bool = True,
    retries: int = 3,
    backoff_s: float = 0.5,
    timeout_s: float = 30.0,
) -> pa.Table:
    """The run's raw samples (SCRAPE_SCHEMA) on the step grid from the window's start to
    `until_unix_s` (the closing time, `closing_unix_s`; None: the window's end). With
    `require_full_window`, every series must cover the window (one missed step allowed at either
    end and between samples) or this raises TelemetryWindowError naming the series."""
    if end_unix_s <= start_unix_s:
        raise ValueError(f"run {run_id}: empty window {start_unix_s}..{end_unix_s}")
    if step_s <= 0:
        raise ValueError(f"run {run_id}: step must be positive, got {step_s}")
    if until_unix_s is not None and until_unix_s < end_unix_s:
        raise ValueError(f"run {run_id}: the window closes at {until_unix_s}, before its end")
    columns: dict[str, list[Any]] = {name: [] for name in SCRAPE_SCHEMA.names}
    queries = promql_queries(engine, selector)
    with httpx.Client(base_url=prometheus_url.rstrip("/"), timeout=timeout_s) as client:
        for source, query in queries.items():
            points = query_range(
                client,
                query,
                start_unix_s=start_unix_s,
                end_unix_s=_query_end(end_unix_s, until_unix_s, step_s),
                step_s=step_s,
                retries=retries,
                backoff_s=backoff_s,
            )
            _append_samples(columns, run_id, source, points, start_unix_s)
    table = pa.table(columns, schema=SCRAPE_SCHEMA)
    what = f"Prometheus {prometheus_url} window of run {run_id}"
    if table.num_rows == 0:
        raise TelemetryWindowError(f"{what}: no samples for selector {dict(selector)}")
    if require_full_window:
        canonicalize(
            table,
            engine=engine,
            run_id=run_id,
            duration_s=end_unix_s - start_unix_s,
            step_s=step_s,
            what=what,
            require_full_window=True,
        )
    return table


def _query_end(end_unix_s: float, until_unix_s: float | None, step_s: float) -> float:
    """The `end` of the range query: the window's end, or its closing time (a point of the step
    grid) plus a margin that keeps it in the grid however the two times round in the query."""
    if until_unix_s is None:
        return end_unix_s
    return until_unix_s + min(step_s / 2, 0.01)


def _append_samples(
    columns: dict[str, list[Any]],
    run_id: str,
    source: str,
    points: list[tuple[float, float]],
    start_unix_s: float,
) -> None:
    """One series' (unix time, value) points as SCRAPE_SCHEMA rows, times from the window start."""
    for ts, value in points:
        columns["run_id"].append(run_id)
        columns["t_s"].append(round(ts - start_unix_s, 6))
        columns["source_metric"].append(source)
        columns["value"].append(value)


def pull_gpu_window(
    *,
    prometheus_url: str,
    selector: Mapping[str, str],
    run_id: str,
    start_unix_s: float,
    end_unix_s: float,
    step_s: float,
    until_unix_s: float | None = None,
    retries: int = 3,
    backoff_s: float = 0.5,
    timeout_s: float = 30.0,
) -> pa.Table:
    """The engine GPU's raw DCGM samples over the run's window, to `until_unix_s` as
    `pull_window` (SCRAPE_SCHEMA rows under the DCGM
    names). A series Prometheus does not hold, or holds for more than one GPU, is logged and left
    out (module docstring); coverage is judged where the series is read (telemetry.canonical)."""
    columns: dict[str, list[Any]] = {name: [] for name in SCRAPE_SCHEMA.names}
    with httpx.Client(base_url=prometheus_url.rstrip("/"), timeout=timeout_s) as client:
        for source, query in gpu_promql_queries(selector).items():
            try:
                points = query_range(
                    client,
                    query,
                    start_unix_s=start_unix_s,
                    end_unix_s=_query_end(end_unix_s, until_unix_s, step_s),
                    step_s=step_s,
                    retries=retries,
                    backoff_s=backoff_s,
                )
            except PrometheusError as exc:
                log.warning("run %s: GPU series %s left out: %s", run_id, source, exc)
                continue
            if not points:
                log.warning(
                    "run %s: no GPU series %s for %s in %s: its energy figures will be null",
                    run_id,
                    source,
                    dict(selector),
                    prometheus_url,
                )
            _append_samples(columns, run_id, source, points, start_unix_s)
    return pa.table(columns, schema=SCRAPE_SCHEMA)


def pull_scrape_files(
    *,
    prometheus_url: str,
    engine: str,
    selector: Mapping[str, str],
    run_id: str,
    start_unix_s: float,
    end_unix_s: float,
    step_s: float,
    scrape_path: str | os.PathLike[str],
    scrape_interval_s: float,
    require_full_window: bool = True,
    settle_s: float = 0.0,
    retries: int = 3,
    gpu_selector: Mapping[str, str] | None = None,
) -> pa.Table:
    """`pull_window` to the window's closing time (`closing_unix_s`: Prometheus scrapes every
    `scrape_interval_s`), then write scrape.parquet atomically. `settle_s`: wait until that long
    after the closing time first, so Prometheus holds the scrape it sees there. `gpu_selector`:
    the engine GPU's label matchers; its DCGM series join the engine's (`pull_gpu_window`). None
    or empty: no GPU series (a backend without them)."""
    until = closing_unix_s(
        start_unix_s, end_unix_s, step_s=step_s, scrape_interval_s=scrape_interval_s
    )
    # bounded: never longer than the closing time's distance from the end, plus `settle_s`
    wait = min(until - end_unix_s + settle_s, until + settle_s - time.time())
    if wait > 0:
        time.sleep(wait)
    table = pull_window(
        prometheus_url=prometheus_url,
        engine=engine,
        selector=selector,
        run_id=run_id,
        start_unix_s=start_unix_s,
        end_unix_s=end_unix_s,
        step_s=step_s,
        until_unix_s=until,
        require_full_window=require_full_window,
        retries=retries,
    )
    if gpu_selector:
        gpu = pull_gpu_window(
            prometheus_url=prometheus_url,
            selector=gpu_selector,
            run_id=run_id,
            start_unix_s=start_unix_s,
            end_unix_s=end_unix_s,
            step_s=step_s,
            until_unix_s=until,
            retries=retries,
        )
        table = pa.concat_tables([table, gpu])
    write_parquet(scrape_path, table, SCRAPE_SCHEMA)
    log.info(
        "%s: %d samples of %d series from %s",
        scrape_path,
        table.num_rows,
        len(set(table.column("source_metric").to_pylist())),
        prometheus_url,
    )
    return table
