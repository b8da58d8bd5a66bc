"""servelab.telemetry: an engine's metric window, from the simulator's sampler or from Prometheus."""

from servelab.telemetry.canonical import TelemetryWindowError, canonicalize, canonicalize_files

__all__ = ["TelemetryWindowError", "canonicalize", "canonicalize_files"]
