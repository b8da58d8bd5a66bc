"""servelab.telemetry: an engine's metric window (and, on kubernetes, its GPU's energy and power),
from the simulator's sampler or from Prometheus."""

from servelab.telemetry.canonical import (
    GPU_METRIC_MAP,
    TelemetryWindowError,
    canonicalize,
    canonicalize_files,
)
from servelab.telemetry.prometheus import (
    PrometheusError,
    gpu_promql_queries,
    promql_queries,
    pull_gpu_window,
    pull_scrape_files,
    pull_window,
)

__all__ = [
    "GPU_METRIC_MAP",
    "PrometheusError",
    "TelemetryWindowError",
    "canonicalize",
    "canonicalize_files",
    "gpu_promql_queries",
    "promql_queries",
    "pull_gpu_window",
    "pull_scrape_files",
    "pull_window",
]
