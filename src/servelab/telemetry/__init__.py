"""servelab.telemetry: an engine's metric window, from the simulator's sampler or from Prometheus."""

from servelab.telemetry.canonical import TelemetryWindowError, canonicalize, canonicalize_files
from servelab.telemetry.prometheus import (
    PrometheusError,
    promql_queries,
    pull_scrape_files,
    pull_window,
)

__all__ = [
    "PrometheusError",
    "TelemetryWindowError",
    "canonicalize",
    "canonicalize_files",
    "promql_queries",
    "pull_scrape_files",
    "pull_window",
]
