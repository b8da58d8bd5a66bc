"""Which settings still differ between two engines under their vendor defaults, by their own rules.

`defaults_diff` resolves each engine's vendor-default command line (the flags every deployment
passes plus the defaults arm's) on each GPU, before any run, and lays the settings the engines
share a meaning for side by side with the rule that set each value (`ResolvedConfig.rules`;
docs/engines.md "Which defaults still differ" cites every rule). Written as
`results/defaults_diff.csv` by the workflow. A value an engine resolves only at run time (SGLang's
max_running_requests, from its KV pool) is empty, and its row's `differs` is empty too; an engine
that does not chunk shows chunk_size `unchunked`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servelab.engines.base import ResolvedConfig
from servelab.engines.resolve import resolve

__all__ = ["SETTINGS", "GpuSpec", "defaults_diff", "defaults_diff_csv"]

# (setting, what it means for every engine); the order of the CSV's rows within a GPU.
SETTINGS: tuple[tuple[str, str], ...] = (
    ("chunked_prefill", "a prompt may be prefilled in pieces across scheduler steps"),
    ("chunk_size", "the largest piece (vLLM max_num_batched_tokens, SGLang chunked_prefill_size)"),
    ("token_budget", "tokens per step (vLLM max_num_batched_tokens, SGLang max_prefill_tokens)"),
    ("prefix_caching", "KV of a shared prompt prefix is reused (vLLM APC, SGLang radix cache)"),
    ("schedule_policy", "the order waiting requests are admitted in"),
    ("max_running_requests", "requests decoded at once (vLLM max_num_seqs)"),
    ("memory_fraction", "vLLM gpu_memory_utilization, SGLang mem_fraction_static"),
    ("cuda_graph_max_bs", "largest decode batch run as a captured CUDA graph"),
    ("context_len", "the longest sequence (prompt + output) accepted"),
)


@dataclass(frozen=True)
class GpuSpec:
    """A GPU as the rules see it: its name and nvidia-smi's memory.total."""

    name: str
    memory_mib: int


def _value(resolved: ResolvedConfig, setting: str) -> Any:
    if setting == "chunk_size" and not resolved.chunked_prefill:
        return "unchunked"
    if setting == "max_running_requests":
        if resolved.max_num_seqs is not None:
            return resolved.max_num_seqs
        return resolved.max_running_requests
    return getattr(resolved, setting)


def _rule(resolved: ResolvedConfig, setting: str, value: Any) -> str:
    rule = resolved.rules.get(setting)
    if rule is not None:
        return rule
    return "" if value is None else "unrecorded"


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def defaults_diff(
    engines: Mapping[str, Sequence[str]],
    gpus: Sequence[GpuSpec],
    *,
    versions: Mapping[str, str],
    model_max_position_embeddings: int,
) -> list[dict[str, str]]:
    """One row per (GPU, setting): each engine's resolved value and the rule that set it.

    `engines` maps each engine (registry name, in the order the columns should take) to its
    vendor-default flags; `versions` gives each engine's release. Raises ResolutionError (naming
    the engine and flag) when an engine refuses its own defaults on a GPU.
    """
    rows: list[dict[str, str]] = []
    for gpu in gpus:
        resolved = {
            engine: resolve(
                engine,
                list(flags),
                gpu_memory_mib=gpu.memory_mib,
                model_max_position_embeddings=model_max_position_embeddings,
                version=versions[engine],
                gpu_name=gpu.name,
            )
            for engine, flags in engines.items()
        }
        for setting, meaning in SETTINGS:
            row = {"gpu": gpu.name, "gpu_memory_mib": str(gpu.memory_mib), "setting": setting}
            values = []
            for engine, r in resolved.items():
                value = _value(r, setting)
                values.append(value)
                row[engine] = _text(value)
                row[f"{engine}_rule"] = _rule(r, setting, value)
            known = [v for v in values if v is not None]
            row["differs"] = (
                "" if len(known) < len(values) else _text(len({_text(v) for v in known}) > 1)
            )
            row["meaning"] = meaning
            rows.append(row)
    return rows


def defaults_diff_csv(rows: Sequence[Mapping[str, str]]) -> str:
    """The rows as CSV text (columns in the rows' order, LF line ends)."""
    if not rows:
        raise ValueError("defaults_diff: no rows (no GPU given)")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
