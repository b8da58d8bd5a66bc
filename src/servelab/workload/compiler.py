"""The trace compiler: one seed -> trace.parquet + manifest.json (docs/workload.md, docs/architecture.md).

Layers, each from its own named random stream of the trace seed (`streams.substream`):
L1 arrivals ("arrivals"), L2 graphs ("topology", drawn only when `workload.topologies` lists a mix)
and tool delays ("tool_delay"), L3 prompts ("prefix", "suffix").
A condition with an imported `trace` is not compiled from streams: `compile_trace` hands it to
`servelab.workload.imported` (docs/workload.md, "Imported traces").
The seed depends only on (campaign seed, condition, rep) (`servelab.grid.config.trace_seed`), so both engines and both
arms replay byte-identical traces. Outputs hold no timestamps: the same inputs give byte-identical files.

`compile_trace_files` writes the trace under a temporary name, validates the bytes it wrote (the six checks),
and only then renames it into place and writes the manifest, which records the check results and the trace's
SHA-256. A trace failing a check is never published.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from servelab import __version__
from servelab.artifacts import (
    TRACE_SCHEMA,
    atomic_path,
    file_sha256,
    read_parquet,
    write_json,
    write_parquet,
)
from servelab.grid.config import Condition, ConfigError, conditions, offered_load, trace_seed
from servelab.grid.topology import (
    GraphTopology,
    graph_topologies,
    has_topologies,
    mean_requests_per_graph,
)
from servelab.workload.arrivals import arrival_times
from servelab.workload.imported import import_condition
from servelab.workload.prompts import LOCAL_WINDOW, build_prompts, prefix_length
from servelab.workload.tokenizer import DEFAULT_TOKENIZER
from servelab.workload.topology import (
    ToolDelay,
    draw_topologies,
    layered_rows,
    tool_delays,
    worker_id_width,
)
from servelab.workload.validate import (
    SHARING_TOLERANCE,
    TokenColumn,
    TraceValidationError,
    checks_for,
    measure_sharing,
    prefix_ids_sha256,
    run_checks,
)

__all__ = [
    "WorkloadSettings",
    "compile_from_config",
    "compile_trace",
    "compile_trace_files",
    "write_validated_trace",
]

_REP = re.compile(r"rep[1-9][0-9]*\Z")
_ROLES = ("planner", "worker", "aggregator")


@dataclass(frozen=True)
class WorkloadSettings:
    """A validated ``workload`` config section."""

    arrival_cv: float
    workers_per_graph: int
    max_tokens: dict[str, int]
    tool_delay: ToolDelay
    # `workload.topologies` as listed (None: not set, every graph the fanout of workers_per_graph)
    topologies: tuple[GraphTopology, ...] | None = None

    @property
    def graph_topologies(self) -> tuple[GraphTopology, ...]:
        """The topologies graphs are drawn from: as listed, or the one study fanout."""
        if self.topologies is not None:
            return self.topologies
        return (GraphTopology(shape="fanout", widths=(self.workers_per_graph,)),)

    @classmethod
    def from_config(cls, workload: Mapping[str, Any]) -> WorkloadSettings:
        """Validate ``config["workload"]``; errors name the key."""
        if not isinstance(workload, Mapping):
            raise ConfigError(
                f"config key workload: expected a mapping, got {type(workload).__name__}"
            )
        for key in ("arrival_cv", "workers_per_graph", "max_tokens", "tool_delay"):
            if key not in workload:
                raise ConfigError(f"config key workload.{key}: missing")
        cv = workload["arrival_cv"]
        if (
            isinstance(cv, bool)
            or not isinstance(cv, int | float)
            or not math.isfinite(cv)
            or cv <= 0
        ):
            raise ConfigError(
                f"config key workload.arrival_cv: must be a positive number, got {cv!r}"
            )
        workers = workload["workers_per_graph"]
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(
                f"config key workload.workers_per_graph: must be an integer >= 1, got {workers!r}"
            )
        caps = workload["max_tokens"]
        if not isinstance(caps, Mapping):
            raise ConfigError(
                "config key workload.max_tokens: expected a mapping of role to output cap"
            )
        max_tokens: dict[str, int] = {}
        for role in _ROLES:
            cap = caps.get(role)
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise ConfigError(
                    f"config key workload.max_tokens.{role}: must be an integer >= 1, got {cap!r}"
                )
            max_tokens[role] = cap
        return cls(
            arrival_cv=float(cv),
            workers_per_graph=workers,
            max_tokens=max_tokens,
            tool_delay=ToolDelay.from_config(workload["tool_delay"]),
            topologies=graph_topologies(workload) if has_topologies(workload) else None,
        )

    def as_dict(self) -> dict[str, Any]:
        """The settings as the manifest records them (`topologies` only when the config set it,
        so a study manifest is what it was before the key existed)."""
        out: dict[str, Any] = {
            "arrival_cv": self.arrival_cv,
            "workers_per_graph": self.workers_per_graph,
            "max_tokens": dict(self.max_tokens),
            "tool_delay": self.tool_delay.as_dict(),
        }
        if self.topologies is not None:
            out["topologies"] = [t.as_dict() for t in self.topologies]
        return out


def _positive(name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _validated(condition: Condition) -> Condition:
    """`condition` with its values checked and its numbers as the manifest records them (floats;
    `prompt_tokens` an int), or ValueError naming the bad value."""
    rate = _positive("rate", condition.rate)
    duration_s = _positive("duration_s", condition.duration_s)
    sharing = condition.sharing
    if isinstance(sharing, bool) or not isinstance(sharing, int | float) or not 0 <= sharing < 1:
        raise ValueError(f"sharing must be a number in [0, 1), got {sharing!r}")
    prompt_tokens = condition.prompt_tokens
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be a positive integer, got {prompt_tokens!r}")
    return replace(condition, rate=rate, sharing=float(sharing), duration_s=duration_s)


def compile_trace(
    *,
    condition: Condition,
    rep: str,
    seed: int,
    workload: Mapping[str, Any],
    tokenizer: str,
) -> tuple[pa.Table, dict[str, Any]]:
    """Compile the trace of `condition` (its id, λ, σ, L and duration) in memory: (TRACE_SCHEMA
    table, manifest without `checks` and `trace_sha256`). A condition with an imported `trace`
    is built from that trace (`servelab.workload.imported.import_condition`; `workload` unused)."""
    if not isinstance(condition.id, str) or not condition.id:
        raise ValueError(f"condition must be a non-empty string, got {condition.id!r}")
    if not isinstance(rep, str) or not _REP.match(rep):
        raise ValueError(f"rep must look like rep1, rep2, ..., got {rep!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if condition.trace is not None:
        return import_condition(condition=condition, rep=rep, seed=seed, tokenizer=tokenizer)
    cond = _validated(condition)
    rate, sharing, duration_s = cond.rate, cond.sharing, cond.duration_s
    prompt_tokens = cond.prompt_tokens
    settings = WorkloadSettings.from_config(workload)
    f = prefix_length(sharing, prompt_tokens)
    if prompt_tokens - f < 1:
        raise ValueError(
            f"sharing {sharing} leaves no unique suffix at prompt_tokens={prompt_tokens}"
        )
    if abs(f / prompt_tokens - sharing) > SHARING_TOLERANCE:
        raise ValueError(
            f"prompt_tokens={prompt_tokens} cannot realise sharing {sharing} within {SHARING_TOLERANCE}: "
            f"F = round(σ·L) = {f} gives {f / prompt_tokens:.4f}"
        )

    arrivals = arrival_times(seed, rate, settings.arrival_cv, duration_s)
    if arrivals.size == 0:
        raise ValueError(
            f"condition {cond.id} {rep}: no agent graph arrives within duration_s={duration_s} at rate {rate} "
            f"(expected {rate * duration_s:.2f}); lengthen the run"
        )
    topologies = settings.graph_topologies
    # each graph's shape: drawn only for a mix (a study trace draws nothing from "topology")
    choice = draw_topologies(seed, int(arrivals.size), topologies)
    widths = [topologies[k].widths for k in choice]
    n_workers = sum(topologies[k].workers for k in choice)
    delays = tool_delays(seed, n_workers, settings.tool_delay)
    rows = layered_rows(
        arrivals,
        delays,
        widths,
        settings.max_tokens,
        worker_width=worker_id_width(max(t.workers for t in topologies)),
    )
    n = len(rows)
    if n * prompt_tokens > np.iinfo(np.int32).max:
        raise ValueError(
            f"{n} requests x {prompt_tokens} tokens exceed one Parquet list column (2^31 ids)"
        )
    prompts = build_prompts(seed, rows.request_id, sharing, prompt_tokens, tokenizer)

    offsets = np.arange(0, n * prompt_tokens + 1, prompt_tokens, dtype=np.int32)
    table = pa.table(
        {
            "request_id": pa.array(rows.request_id, type=pa.string()),
            "graph_id": pa.array(rows.graph_id, type=pa.int32()),
            "role": pa.array(rows.role, type=pa.string()),
            "arrival_s": pa.array(rows.arrival_s, type=pa.float64()),
            "depends_on": pa.array(rows.depends_on, type=pa.list_(pa.string())),
            "tool_delay_s": pa.array(rows.tool_delay_s, type=pa.float64()),
            "prompt_token_ids": pa.ListArray.from_arrays(
                pa.array(offsets), pa.array(prompts.token_ids.ravel(), type=pa.int32())
            ),
            "prompt_text": pa.array(prompts.texts, type=pa.string()),
            "prefix_tokens": pa.array(np.full(n, f, dtype=np.int32), type=pa.int32()),
            "max_tokens": pa.array(rows.max_tokens, type=pa.int32()),
        },
        schema=TRACE_SCHEMA,
    )
    _, sigma = measure_sharing(TokenColumn(table), np.full(n, f))
    vocab = prompts.vocab
    manifest: dict[str, Any] = {
        "condition": cond.id,
        "rep": rep,
        "seed": seed,
        "rate": rate,
        "sharing": sharing,
        "prompt_tokens": prompt_tokens,
        "duration_s": duration_s,
        "tokenizer": tokenizer,
        "prefix_text": prompts.prefix_text,
        "prefix_sha256": hashlib.sha256(prompts.prefix_text.encode("utf-8")).hexdigest(),
        "prefix_ids_sha256": prefix_ids_sha256(prompts.prefix_ids),
        "prefix_tokens": f,
        "suffix_tokens": prompt_tokens - f,
        "achieved_sharing": float(np.mean(sigma)),
        "n_graphs": int(arrivals.size),
        "n_requests": n,
        "requests_per_graph": mean_requests_per_graph(workload),
        "offered_load_rps": offered_load(cond, workload),
        "workload": settings.as_dict(),
        "vocabulary": {
            "rule": "non-special ids decoding to ' ' + ASCII letters that encode back to exactly [id]",
            "subset_size": len(vocab),
            "vocab_size": vocab.vocab_size,
            "subset_sha256": vocab.sha256,
        },
        "verification": {
            "method": (
                f"prefix encoded once; each suffix encoded behind the prefix's last {LOCAL_WINDOW} "
                "tokens (add_special_tokens=False) and compared"
                if tokenizer == DEFAULT_TOKENIZER
                else "every full prompt encoded by the tokenizer (add_special_tokens=False) and compared"
            ),
            "prompts_encoded": n,
            "segments_redrawn": prompts.redrawn,
        },
        "engine_prompt_tokens": "L + 1: the engines prepend BOS to the L trace tokens",
        "servelab_version": __version__,
    }
    if settings.topologies is not None:
        drawn = np.bincount(choice, minlength=len(topologies))
        manifest["topologies"] = [
            {"name": t.name, "widths": list(t.widths), "weight": t.weight, "graphs": int(k)}
            for t, k in zip(topologies, drawn, strict=True)
        ]
    return table, manifest


def compile_trace_files(
    *,
    condition: Condition,
    rep: str,
    seed: int,
    workload: Mapping[str, Any],
    tokenizer: str,
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
) -> dict[str, Any]:
    """Compile the trace of `condition`, validate it and atomically write trace.parquet and
    manifest.json; return the manifest.

    Raises TraceValidationError (and writes nothing) if the compiled trace fails any of its checks
    (the six; an imported trace's five)."""
    table, manifest = compile_trace(
        condition=condition, rep=rep, seed=seed, workload=workload, tokenizer=tokenizer
    )
    return write_validated_trace(
        table, manifest, trace_path=trace_path, manifest_path=manifest_path
    )


def write_validated_trace(
    table: pa.Table,
    manifest: dict[str, Any],
    *,
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
) -> dict[str, Any]:
    """Write `table` under a temporary name, run the checks (`checks_for(manifest)`: the six, or
    an imported trace's five) on the bytes written, and only if all pass rename it into place and
    write `manifest` (with `trace_sha256` and `checks` added).

    Raises TraceValidationError (and writes nothing) if any check fails.
    """
    with atomic_path(trace_path) as tmp:
        write_parquet(tmp, table, TRACE_SCHEMA)
        manifest["trace_sha256"] = file_sha256(tmp)
        results = run_checks(read_parquet(tmp, TRACE_SCHEMA), manifest, where=str(trace_path))
        failures = {name: res.detail for name, res in results.items() if not res.ok}
        if failures:
            raise TraceValidationError(str(trace_path), failures)
        manifest["checks"] = {name: results[name].ok for name in checks_for(manifest)}
    write_json(manifest_path, manifest)
    return manifest


def compile_from_config(
    config: Mapping[str, Any],
    condition: str,
    rep: str,
    *,
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
) -> dict[str, Any]:
    """`compile_trace_files` for one (condition, rep) of a validated config (what the CLI calls)."""
    grid = conditions(config)
    if condition not in grid:
        raise ConfigError(f"unknown condition {condition!r}; the config defines {', '.join(grid)}")
    return compile_trace_files(
        condition=grid[condition],
        rep=rep,
        seed=trace_seed(int(config["campaign_seed"]), condition, rep),
        workload=config["workload"],
        tokenizer=str(config["tokenizer"]),
        trace_path=trace_path,
        manifest_path=manifest_path,
    )
