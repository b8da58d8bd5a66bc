"""Command-line flags as each engine's own argument parser reads them (`parse_flags`).

The engine's argument table comes from the registry; the parser is rebuilt from it by
`servelab.engines.cmdline`, so flags mean exactly what they mean to the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from servelab.engines.base import EngineFlags, FlagError, UnknownEngine
from servelab.engines.cmdline import parse_table
from servelab.engines.registry import engine_names, engine_spec

__all__ = ["EngineFlags", "FlagError", "parse_flags"]


def parse_flags(engine: str, flags: Sequence[str], version: str | None = None) -> EngineFlags:
    """Parse `flags` as `engine`'s server would (e.g. vLLM 0.6.3 api_server, SGLang 0.4.1
    launch_server), at release `version` of its family (None: the family's reference release).

    Raises FlagError (a ValueError) naming the flag when a known flag has a value the engine
    rejects, or when a flag the engine requires (SGLang's `--model-path`) is missing.
    """
    try:
        spec = engine_spec(engine)
    except UnknownEngine:
        raise FlagError(
            f"unknown engine {engine!r}: expected one of {', '.join(engine_names())}"
        ) from None
    return parse_table(
        engine,
        spec.flag_table_for(version),
        flags,
        normalise=spec.normalise_flags,
        required=spec.required_flags,
    )
