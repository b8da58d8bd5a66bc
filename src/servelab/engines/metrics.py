"""Each engine's /metrics names and the canonical names telemetry uses (docs/architecture.md,
`telemetry.parquet`).

Each engine's module defines its map (`EngineSpec.metric_map`: canonical name -> the engine's
sample name) and every series it exports (`EngineSpec.metric_series`); `METRIC_MAP` and
`ENGINE_METRICS` read them from the registry. The study's engines:

| canonical               | vLLM 0.6.3                       | SGLang 0.4.1                      |
|-------------------------|----------------------------------|-----------------------------------|
| kv_cache_usage (0..1)   | vllm:gpu_cache_usage_perc        | sglang:token_usage                |
| requests_running        | vllm:num_requests_running        | sglang:num_running_reqs           |
| requests_waiting        | vllm:num_requests_waiting        | sglang:num_queue_reqs             |
| preemptions_total       | vllm:num_preemptions_total       | (none: omitted, see below)        |
| prompt_tokens_total     | vllm:prompt_tokens_total         | sglang:prompt_tokens_total        |
| generation_tokens_total | vllm:generation_tokens_total     | sglang:generation_tokens_total    |
| prefix_cache_hit_rate   | vllm:gpu_prefix_cache_hit_rate   | sglang:cache_hit_rate             |

A canonical metric an engine does not export (SGLang 0.4.1 has no preemption counter) is OMITTED
from its map (not mapped to a stand-in series, not filled with zeros): `canonical_metrics` does not
list it and telemetry records no such series for that engine's runs.

Caveats the analysis must respect: vLLM's hit rate is -1 when prefix caching is off and otherwise
a lifetime block-level rate; SGLang's is a lifetime token rate, refreshed only on prefill-batch
log lines and inflated by chunked prefill (docs/engines.md); SGLang's gauges are stale between its
log lines (every prefill batch and every 40 decode steps).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client.parser import text_string_to_metric_families

from servelab.engines.registry import EngineView, engine_names

__all__ = [
    "ENGINE_METRICS",
    "METRIC_LAZY",
    "METRIC_MAP",
    "METRIC_PART_LABELS",
    "MetricSample",
    "cache_config_info",
    "canonical_metrics",
    "canonical_values",
    "parse_metrics_text",
]

# {engine: {canonical name: the engine's sample name}}, from the registry.
METRIC_MAP: EngineView[Mapping[str, str]] = EngineView(
    lambda spec: MappingProxyType(dict(spec.metric_map))
)
# {engine: labels whose series are parts of one whole (summed)}, from the registry.
METRIC_PART_LABELS: EngineView[tuple[str, ...]] = EngineView(
    lambda spec: tuple(spec.metric_part_labels)
)
# {engine: series created only at their first event (absent from a run without one)}.
METRIC_LAZY: EngineView[frozenset[str]] = EngineView(lambda spec: frozenset(spec.metric_lazy))
# {engine: {metric family name: type}}: every series each engine exports, from the registry.
ENGINE_METRICS: EngineView[Mapping[str, str]] = EngineView(
    lambda spec: MappingProxyType(dict(spec.metric_series))
)

# The label naming the served model: `model_name` (vLLM; SGLang >= 0.4) or `name` (SGLang 0.3.x).
_MODEL_LABELS = ("model_name", "name")


@dataclass(frozen=True)
class MetricSample:
    """One sample of a Prometheus text exposition: its sample name (counters keep `_total`,
    histograms `_bucket`/`_sum`/`_count`), labels, value, and the family's name and type."""

    name: str
    labels: Mapping[str, str]
    value: float
    family: str
    type: str

    @property
    def model(self) -> str | None:
        for key in _MODEL_LABELS:
            if key in self.labels:
                return self.labels[key]
        return None


def canonical_metrics(engine: str) -> list[str]:
    """The canonical metric names `engine` provides, sorted (SGLang has no preemptions_total)."""
    if engine not in METRIC_MAP:
        raise ValueError(f"unknown engine {engine!r}: expected one of {', '.join(engine_names())}")
    return sorted(METRIC_MAP[engine])


def parse_metrics_text(text: str) -> list[MetricSample]:
    """Parse Prometheus text exposition (what GET /metrics returns) into samples, in text order.

    Uses prometheus_client's own parser; a malformed exposition raises ValueError.
    """
    out: list[MetricSample] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.append(
                    MetricSample(
                        name=sample.name,
                        labels=MappingProxyType(dict(sample.labels)),
                        value=float(sample.value),
                        family=family.name,
                        type=family.type,
                    )
                )
    except ValueError as exc:
        raise ValueError(f"malformed Prometheus text exposition: {exc}") from exc
    return out


def canonical_values(
    engine: str, samples: Iterable[MetricSample], *, model: str | None = None
) -> dict[str, float]:
    """{canonical name: value} for one scrape of `engine`, keys sorted.

    Only series of the mapped names are used; `model` keeps the series whose model label
    (`model_name=`, or `name=` before SGLang 0.4) equals it. A canonical metric the scrape does not
    contain is absent from the result; series that differ only in one of the engine's part labels
    (`EngineSpec.metric_part_labels`) are summed; more than one series otherwise raises
    ValueError.
    """
    if engine not in METRIC_MAP:
        raise ValueError(f"unknown engine {engine!r}: expected one of {', '.join(engine_names())}")
    wanted = {source: canonical for canonical, source in METRIC_MAP[engine].items()}
    found: dict[str, list[MetricSample]] = {}
    for sample in samples:
        if sample.name in wanted and (model is None or sample.model == model):
            found.setdefault(sample.name, []).append(sample)
    parts = METRIC_PART_LABELS[engine]
    out: dict[str, float] = {}
    for source, rows in found.items():
        # series that differ only in a part label (SGLang 0.5: is_streaming) are one, summed
        whole = {tuple(sorted((k, v) for k, v in r.labels.items() if k not in parts)) for r in rows}
        if len(whole) > 1:
            models = sorted(str(r.model) for r in rows)
            raise ValueError(
                f"{source}: {len(whole)} series in one scrape (models {', '.join(models)}); "
                "give the model to select one"
            )
        out[wanted[source]] = sum(r.value for r in rows)
    return dict(sorted(out.items()))


def cache_config_info(samples: Iterable[MetricSample]) -> dict[str, str] | None:
    """The labels of vLLM's `vllm:cache_config_info` (its CacheConfig, incl. num_gpu_blocks and
    enable_prefix_caching), or None when the scrape has none."""
    for sample in samples:
        if sample.name == "vllm:cache_config_info":
            return dict(sorted(sample.labels.items()))
    return None
