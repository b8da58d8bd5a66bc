"""servelab.dispatch: the live streaming dispatcher (paced or httpx client) and its run entry points.

- `dispatch_run_files(*, base_url, trace_path, manifest_path, arm, engine, condition, rep, backend,
  deployment_id, resolved_config, warmup_requests, request_timeout_s, success_threshold,
  offered_load_rps, attempt, node_identity_fn, requests_path, run_json_path, ...) -> dict`
- `dispatch_run(...) -> (requests table, run record, DispatchResult)`: the same, writing nothing.
- `Dispatcher`: the async core (warm-up, graph release on the real clock, streaming, timeouts).
"""

from servelab.dispatch.actions import TimedAction
from servelab.dispatch.client import CLIENTS, Dispatcher, DispatchError, DispatchResult, pool_size
from servelab.dispatch.parallel import run_parallel
from servelab.dispatch.records import RequestRecord, RequestSpec
from servelab.dispatch.run import dispatch_run, dispatch_run_files, requests_table

__all__ = [
    "CLIENTS",
    "DispatchError",
    "DispatchResult",
    "Dispatcher",
    "RequestRecord",
    "RequestSpec",
    "TimedAction",
    "dispatch_run",
    "dispatch_run_files",
    "pool_size",
    "requests_table",
    "run_parallel",
]
