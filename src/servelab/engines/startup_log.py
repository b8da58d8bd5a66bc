"""Start-up logs in each engine's real line formats, rendered from a ResolvedConfig.

The simulator and the live sim server print exactly this text, so the one parser
(`logparse.parse_startup_log`) confirms the resolved configuration on every backend. Each
engine's module renders its own lines (`EngineSpec.render_startup_log`; the formats are described
there and in docs/engines.md).

Run-time facts the caller supplies: the KV capacity, the weights' size and a fixed start time.
Everything else a real engine randomises (IPC path, PIDs, SGLang's random seed when not flagged)
is derived from the flags, so the same inputs always give the same bytes. Durations (weight
loading, graph capture) are fixed illustrative values.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from servelab.engines.base import CONFIG_FIELDS, ParsedLog, ResolvedConfig
from servelab.engines.logtext import LLAMA_31_8B_KV_BYTES_PER_TOKEN
from servelab.engines.registry import engine_spec

__all__ = [
    "LLAMA_31_8B_KV_BYTES_PER_TOKEN",
    "probe_disagreement",
    "render_startup_log",
    "startup_log_flags",
]

# What a start-up probe changes on purpose: the log level (EngineSpec.startup_probe).
_PROBE_CHANGES = frozenset({"verbosity"})


def startup_log_flags(engine: str, flags: Sequence[str]) -> list[str]:
    """The flags of the start whose log the gate reads: the deployment's own, or those of the
    engine's start-up probe when its measured start would not show the resolution
    (`EngineSpec.startup_probe`)."""
    probe = engine_spec(engine).startup_probe
    probed = probe(flags) if probe is not None else None
    return list(flags) if probed is None else probed


def render_startup_log(
    resolved: ResolvedConfig,
    *,
    kv_capacity_tokens: int,
    weights_gib: float,
    timestamp: datetime,
    kv_bytes_per_token: int = LLAMA_31_8B_KV_BYTES_PER_TOKEN,
) -> str:
    """The engine's start-up log for `resolved`, ending when the server is ready.

    `kv_capacity_tokens` is vLLM's num_gpu_blocks * block_size or SGLang's max_total_num_tokens
    (before --max-total-tokens caps it); `weights_gib` the loaded weights; `timestamp` the first
    line's time (later lines follow at fixed offsets).
    """
    if weights_gib <= 0:
        raise ValueError(f"weights_gib={weights_gib}: must be positive")
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token={kv_bytes_per_token}: must be positive")
    try:
        spec = engine_spec(resolved.engine)
    except ValueError:
        raise ValueError(f"unknown engine {resolved.engine!r}") from None
    if spec.render_startup_log is None:
        raise ValueError(f"engine {resolved.engine!r} has no start-up log renderer")
    text = spec.render_startup_log(
        resolved, kv_capacity_tokens, weights_gib, timestamp, kv_bytes_per_token
    )
    return "\n".join(text) + "\n"


def probe_disagreement(probe: ParsedLog, measured: ParsedLog) -> str:
    """Every value both logs show that differs, as "name: probe X, measured Y" ("" when none):
    the measured start must run the configuration its start-up probe confirmed. The probe shows
    more (the lines its log level adds); only what both show is compared."""
    shown_probe, shown_measured = probe.to_dict(), measured.to_dict()
    pairs = [(name, shown_probe[name], shown_measured[name]) for name in CONFIG_FIELDS]
    pairs += [
        (name, value, measured.facts[name])
        for name, value in sorted(probe.facts.items())
        if name in measured.facts and name not in _PROBE_CHANGES
    ]
    return "; ".join(
        f"{name}: probe {a!r}, measured {b!r}"
        for name, a, b in pairs
        if a is not None and b is not None and a != b
    )
