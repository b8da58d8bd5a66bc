"""What configuration an engine resolves from its flags, by the engine's OWN rules.

`resolve` parses the flags with the engine's argument table and applies the resolution rules of
the engine's module (`servelab.engines.vllm`, `servelab.engines.sglang`; docs/engines.md cites each
rule's upstream source). `runtime_limits` gives the limits an engine derives at start-up from its
KV-cache capacity.
"""

from __future__ import annotations

from collections.abc import Sequence

from servelab.engines.base import (
    ResolutionError,
    ResolvedConfig,
    RuntimeLimits,
    UnknownEngine,
)
from servelab.engines.flags import parse_flags
from servelab.engines.registry import (
    EngineView,
    UnsupportedRelease,
    check_release,
    engine_names,
    engine_spec,
)

__all__ = [
    "DEFAULT_VERSIONS",
    "PRINTED_VERSIONS",
    "ResolutionError",
    "ResolvedConfig",
    "RuntimeLimits",
    "resolve",
    "runtime_limits",
]

# The release whose rules each engine's module implements (the study's: Appendix A).
DEFAULT_VERSIONS: EngineView[str] = EngineView(lambda spec: spec.version)
# What each release prints as its version in the start-up log (None: nothing).
PRINTED_VERSIONS: EngineView[str | None] = EngineView(lambda spec: spec.printed_version)


def resolve(
    engine: str,
    flags: Sequence[str],
    *,
    gpu_memory_mib: int,
    model_max_position_embeddings: int = 131072,
    version: str | None = None,
    gpu_name: str = "",
) -> ResolvedConfig:
    """Resolve `engine`'s configuration from its command-line `flags` by the engine's own rules.

    `gpu_memory_mib` is what nvidia-smi reports as memory.total (an L4: 23034); `gpu_name` the
    device's name (vLLM V1's batch defaults exclude A100s); rules that do not depend on them
    ignore them. `model_max_position_embeddings` stands in for the model's config.json (Llama-3.1-8B:
    131072). `version` must be a release the engine's family implements (default: its reference
    release, on the CPU platform its CPU release); another release is refused naming the family it follows and the nearest supported.
    Raises ResolutionError (or FlagError for a malformed flag), both ValueErrors naming the flag.
    """
    try:
        spec = engine_spec(engine)
    except UnknownEngine:
        raise ResolutionError(
            f"unknown engine {engine!r}: expected one of {', '.join(engine_names())}"
        ) from None
    if version is None:
        version = spec.cpu_version if gpu_name == "CPU" and spec.cpu_version else spec.version
    version = str(version)
    try:
        check_release(engine, version)
    except UnsupportedRelease as exc:
        raise ResolutionError(str(exc)) from None
    if int(gpu_memory_mib) <= 0:
        raise ResolutionError(f"gpu_memory_mib={gpu_memory_mib}: must be positive")
    if int(model_max_position_embeddings) <= 0:
        raise ResolutionError(
            f"model_max_position_embeddings={model_max_position_embeddings}: must be positive"
        )
    return spec.resolve(
        parse_flags(engine, flags, version),
        gpu_memory_mib=int(gpu_memory_mib),
        max_pos=int(model_max_position_embeddings),
        version=version,
        gpu_name=str(gpu_name),
    )


def runtime_limits(resolved: ResolvedConfig, *, kv_capacity_tokens: int) -> RuntimeLimits:
    """The limits the engine derives at start-up once its KV pool holds `kv_capacity_tokens`."""
    if kv_capacity_tokens <= 0:
        raise ResolutionError(f"kv_capacity_tokens={kv_capacity_tokens}: must be positive")
    return engine_spec(resolved.engine).runtime_limits(resolved, kv_capacity_tokens)
