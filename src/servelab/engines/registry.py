"""The engine registry: the one place that lists the engines servelab knows.

Everything that differs between engines (flag tables, resolution rules, start-up-log parsing,
/metrics names, the server's entrypoint) is an `EngineSpec` registered here; the config schema,
CLI choices, parser dispatch, telemetry mapping and analysis iterate this registry. Adding an
engine is a new module that builds its `EngineSpec` plus one line in `_BUILT_IN`
(docs/architecture.md, "Engine registry"). Tests register a toy engine with `registered(...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar

from servelab.engines import llamacpp, sglang, vllm
from servelab.engines.base import UnknownEngine
from servelab.engines.spec import EngineSpec

__all__ = [
    "EngineView",
    "engine_names",
    "engine_spec",
    "engine_specs",
    "register",
    "registered",
    "unregister",
]

# The built-in engines, in the order tables and figures show them: the study's two (a gap is
# vLLM ÷ SGLang), then llama.cpp's llama-server (real only, no simulated model).
_BUILT_IN: tuple[EngineSpec, ...] = (vllm.SPEC, sglang.SPEC, llamacpp.SPEC)

_REGISTRY: dict[str, EngineSpec] = {spec.name: spec for spec in _BUILT_IN}


def register(spec: EngineSpec) -> None:
    """Add an engine. A name already registered is refused (unregister it first)."""
    if spec.name in _REGISTRY:
        raise ValueError(f"engine {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec


def unregister(name: str) -> None:
    """Remove an engine that `register` added; the built-in engines stay."""
    if any(spec.name == name for spec in _BUILT_IN):
        raise ValueError(f"engine {name!r} is built in and cannot be unregistered")
    _REGISTRY.pop(name, None)


@contextmanager
def registered(spec: EngineSpec) -> Iterator[EngineSpec]:
    """Register `spec` for the duration of a `with` block (tests, plug-ins)."""
    register(spec)
    try:
        yield spec
    finally:
        unregister(spec.name)


def engine_names() -> tuple[str, ...]:
    """The registered engines' names, in registration order."""
    return tuple(_REGISTRY)


def engine_specs() -> tuple[EngineSpec, ...]:
    return tuple(_REGISTRY.values())


def engine_spec(name: str) -> EngineSpec:
    """The registered engine `name`; UnknownEngine (a ValueError) lists the registered ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownEngine(
            f"unknown engine {name!r}: expected one of {', '.join(_REGISTRY)}"
        ) from None


T = TypeVar("T")


class EngineView(Mapping[str, T], Generic[T]):
    """A read-only {engine name: value} mapping read from the registry at each access, so a
    constant such as METRIC_MAP follows engines registered later."""

    def __init__(self, attribute: Callable[[EngineSpec], T]) -> None:
        self._attribute = attribute

    def __getitem__(self, name: str) -> T:
        spec = _REGISTRY.get(name)
        if spec is None:
            raise KeyError(name)
        return self._attribute(spec)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_REGISTRY))

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return f"EngineView({dict(self)!r})"
