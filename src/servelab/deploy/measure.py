"""One live measurement: the step the local and Kubernetes backends share.

Dispatch the trace to the engine (servelab.dispatch.dispatch_run), record a reclamation when the
backend names one, write requests.parquet, pull the run's Prometheus window into scrape.parquet
(and the engine GPU's energy and power series, when the backend names them), check that the
engine's prompt cache held none of the run's prompts before it began (servelab.deploy.prompt_cache;
a run it did is refused), and write run.json last (a run.json on disk means the run's files are
complete). A backend says only what differs: where the engine and its Prometheus series are, how
node identity is read, which timed actions run during the dispatch, and its own part of the record
(`LiveTarget`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servelab.artifacts import REQUESTS_SCHEMA, write_json, write_parquet
from servelab.deploy.backend import RunRequest
from servelab.deploy.machine_load import LoadWatch
from servelab.deploy.prompt_cache import prompt_cache_check, refusal
from servelab.dispatch import DispatchResult, TimedAction, dispatch_run
from servelab.dispatch.run import WARMUP_PROMPT_TOKENS
from servelab.telemetry.prometheus import pull_scrape_files

__all__ = ["LiveTarget", "NodeChange", "measure_live"]

log = logging.getLogger(__name__)

# (identity at the start, identity now) -> why the node changed, or None when it did not.
NodeChange = Callable[[Mapping[str, Any], Mapping[str, Any]], str | None]


@dataclass(frozen=True)
class LiveTarget:
    """What one live backend contributes to a run's measurement."""

    backend: str
    base_url: str  # the engine's OpenAI-compatible server
    node_identity: Callable[[], Mapping[str, Any]]
    prometheus_url: str
    metrics_selector: Mapping[str, str]  # label matchers of this deployment's series
    # How often Prometheus scrapes the engine: the window is pulled to a time whose latest scrape
    # came after the run's end (servelab.telemetry.prometheus.closing_unix_s).
    scrape_interval_s: float
    # How long after that closing time to wait before pulling, so Prometheus holds its scrape.
    scrape_settle_s: float
    # Why the run's node changed, from the finished record and dispatch result (None: it did not).
    reclamation: Callable[[Mapping[str, Any], DispatchResult], str | None]
    extra: Mapping[str, Any] = field(default_factory=dict)  # the backend's part of run.json
    actions: Sequence[TimedAction] = ()
    node_watch_s: float = 0.0  # 0: node identity read at the start and end only
    node_change: NodeChange | None = None
    progress_interval_s: float = 10.0
    # The machine's load over the run (servelab.deploy.machine_load): recorded in run.json, and a
    # run whose pinned cores another job shared is refused (status failed).
    machine_load: LoadWatch | None = None
    # Label matchers of the engine GPU's DCGM series, pulled beside the engine's (empty: the
    # backend has none; the run's energy figures are then null).
    gpu_selector: Mapping[str, str] = field(default_factory=dict)


def measure_live(request: RunRequest, target: LiveTarget) -> dict[str, Any]:
    """Measure one attempt of a run against a live engine; write its three files; return run.json."""
    dispatch = request.dispatch
    if target.machine_load is not None:
        target.machine_load.start()
    table, record, result = dispatch_run(
        base_url=target.base_url,
        **request.trace_and_coordinates(),
        backend=target.backend,
        deployment_id=str(request.deployment["deployment_id"]),
        resolved_config=request.resolved_config,
        warmup_requests=dispatch.warmup_requests,
        warmup_prompt_tokens=dispatch.warmup_prompt_tokens,
        warmup_spacing_s=dispatch.warmup_spacing_s or 0.0,
        request_timeout_s=dispatch.request_timeout_s,
        health_timeout_s=dispatch.health_timeout_s,
        success_threshold=request.success_threshold,
        offered_load_rps=request.offered_load_rps,
        attempt=request.attempt,
        node_identity_fn=target.node_identity,
        ignore_eos=dispatch.ignore_eos,
        workers=dispatch.workers,
        client=dispatch.client,
        progress_interval_s=target.progress_interval_s,
        actions=list(target.actions),
        node_watch_s=target.node_watch_s,
        node_change=target.node_change,
        extra=dict(target.extra),
    )
    if target.machine_load is not None:
        load = target.machine_load.stop()
        record["machine_load"] = load
        if load["refused"]:
            _refuse(record, f"machine load: {load['refused']}")
    reason = target.reclamation(record, result)
    if reason:
        record["reclaimed_reason"] = reason
        record["status"] = "interrupted"
        log.warning("run %s: %s", record["run_id"], reason)
    write_parquet(request.requests_path, table, REQUESTS_SCHEMA)
    scrape = pull_scrape_files(
        prometheus_url=target.prometheus_url,
        engine=request.engine,
        selector=dict(target.metrics_selector),
        run_id=record["run_id"],
        start_unix_s=record["start_unix_s"],
        end_unix_s=record["end_unix_s"],
        step_s=request.telemetry.step_s,
        scrape_interval_s=target.scrape_interval_s,
        scrape_path=request.scrape_path,
        require_full_window=record["status"] == "ok",
        settle_s=target.scrape_settle_s,
        gpu_selector=dict(target.gpu_selector) or None,
    )
    # a cache that held this run's prompts before it began measures what the design did not ask
    # for (servelab.deploy.prompt_cache): recorded always, and such a run is refused
    record["prompt_cache"] = prompt_cache_check(
        scrape=scrape,
        engine=request.engine,
        trace_path=request.trace_path,
        warmup_requests=dispatch.warmup_requests,
        warmup_prompt_tokens=(
            WARMUP_PROMPT_TOKENS
            if dispatch.warmup_prompt_tokens is None
            else dispatch.warmup_prompt_tokens
        ),
    )
    warm = refusal(record["prompt_cache"])
    if warm:
        _refuse(record, warm)
    write_json(request.run_json_path, record)
    log.info(
        "run %s: %s, %d/%d ok, lag median %s s",
        record["run_id"],
        record["status"],
        record["n_ok"],
        record["n_sent"],
        record["dispatcher_lag_s"]["median"],
    )
    return record


def _refuse(record: dict[str, Any], why: str) -> None:
    """A complete run that is no measurement: failed (so the campaign retries it), saying why.
    The first refusal's reason stays."""
    if record["status"] == "ok":
        record["status"] = "failed"
        record["refused_reason"] = why
        log.warning("run %s: refused: %s", record["run_id"], why)
