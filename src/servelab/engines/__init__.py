"""servelab.engines: what each engine IS.

Its flags (parsed by the engine's own argument definitions), the configuration it resolves from
them by its own rules, its start-up log formats and their parser, the resolved-configuration gate,
and its /metrics names. One module per engine (`vllm`, `sglang`) builds its `EngineSpec`; the
registry (`servelab.engines.registry`) lists them. Used by `sim`, `deploy` and `telemetry`;
imports none of them. See docs/engines.md and docs/architecture.md.
"""

from servelab.engines.base import UnknownEngine
from servelab.engines.flags import EngineFlags, FlagError, parse_flags
from servelab.engines.gate import ResolvedConfigMismatch, check_resolved, kv_capacity_tokens
from servelab.engines.logparse import (
    CONFIG_FIELDS,
    ParsedLog,
    UnknownEngineLog,
    detect_engine,
    parse_startup_log,
)
from servelab.engines.metrics import (
    ENGINE_METRICS,
    METRIC_MAP,
    MetricSample,
    cache_config_info,
    canonical_metrics,
    canonical_values,
    parse_metrics_text,
)
from servelab.engines.registry import engine_names, engine_spec, engine_specs, registered
from servelab.engines.resolve import (
    DEFAULT_VERSIONS,
    PRINTED_VERSIONS,
    ResolutionError,
    ResolvedConfig,
    RuntimeLimits,
    resolve,
    runtime_limits,
)
from servelab.engines.spec import EngineSpec, LogFormat
from servelab.engines.startup_log import (
    LLAMA_31_8B_KV_BYTES_PER_TOKEN,
    probe_disagreement,
    render_startup_log,
    startup_log_flags,
)

__all__ = [
    "CONFIG_FIELDS",
    "DEFAULT_VERSIONS",
    "ENGINE_METRICS",
    "LLAMA_31_8B_KV_BYTES_PER_TOKEN",
    "METRIC_MAP",
    "PRINTED_VERSIONS",
    "EngineFlags",
    "EngineSpec",
    "FlagError",
    "LogFormat",
    "MetricSample",
    "ParsedLog",
    "ResolutionError",
    "ResolvedConfig",
    "ResolvedConfigMismatch",
    "RuntimeLimits",
    "UnknownEngine",
    "UnknownEngineLog",
    "cache_config_info",
    "canonical_metrics",
    "canonical_values",
    "check_resolved",
    "detect_engine",
    "engine_names",
    "engine_spec",
    "engine_specs",
    "kv_capacity_tokens",
    "parse_flags",
    "parse_metrics_text",
    "parse_startup_log",
    "probe_disagreement",
    "registered",
    "render_startup_log",
    "resolve",
    "runtime_limits",
    "startup_log_flags",
]
