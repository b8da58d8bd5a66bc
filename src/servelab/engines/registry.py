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

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from servelab.engines import llamacpp, sglang, sglang_v05, vllm, vllm_v1
from servelab.engines.base import UnknownEngine
from servelab.engines.spec import EngineSpec

__all__ = [
    "EngineView",
    "UnsupportedRelease",
    "check_release",
    "engine_names",
    "engine_spec",
    "engine_specs",
    "family_for",
    "product_of",
    "products",
    "register",
    "registered",
    "release_family",
    "unregister",
]

# The built-in engines (release families), in the order tables and figures show them, and so the
# order of a gap's two engines (numerator first): the study's two (a gap is vLLM ÷ SGLang), the
# current releases' families (docs/engines.md "Current releases"), vLLM's before SGLang's, then
# llama.cpp's llama-server (real only, no simulated model; against vLLM V1 on the CPU a gap is
# vLLM ÷ llama.cpp).
_BUILT_IN: tuple[EngineSpec, ...] = (
    vllm.SPEC,
    sglang.SPEC,
    vllm_v1.SPEC,
    sglang_v05.SPEC,
    llamacpp.SPEC,
)

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


class UnsupportedRelease(ValueError):
    """An engine release servelab has no rules for. The message names the family it belongs to (if
    any) and the nearest releases servelab implements."""


def product_of(engine: str) -> str:
    """The product a registered engine (release family) belongs to: "vllm" for vllm_v1."""
    return engine_spec(engine).product


def products() -> tuple[str, ...]:
    """The products (vllm, sglang, ...) the registered families belong to, in registry order."""
    return tuple(dict.fromkeys(spec.product for spec in _REGISTRY.values()))


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _nearest(product: str, version: Version | None) -> str:
    """The implemented releases of `product` nearest to `version` (one below, one above)."""
    known = sorted(
        (Version(release), release, spec.name)
        for spec in _REGISTRY.values()
        if spec.product == product
        for release in spec.releases
        if _version(release) is not None
    )
    if version is not None:
        below = [k for k in known if k[0] < version][-1:]
        above = [k for k in known if k[0] > version][:1]
        known = below + above or known
    return ", ".join(f"{release} (engine {name})" for _, release, name in known)


def release_family(product: str, version: str) -> EngineSpec | None:
    """The registered family of `product` whose `family_versions` range holds `version` (a
    version as printed: a leading `v` and local parts such as `+g3fb0d9099` are fine), or None."""
    parsed = _version(str(version).lstrip("v"))
    if parsed is None:
        return None
    for spec in _REGISTRY.values():
        in_range = spec.family_versions and parsed in SpecifierSet(
            spec.family_versions, prereleases=True
        )
        if spec.product == product and in_range:
            return spec
    return None


def family_for(product: str, version: str) -> EngineSpec:
    """The registered family whose rules `product` release `version` follows.

    A release a family implements maps to that family. Any other release is refused with
    UnsupportedRelease: its message says which family the release belongs to (by the families'
    `family_versions` ranges) and names the nearest implemented releases.
    """
    families = [spec for spec in _REGISTRY.values() if spec.product == product]
    if not families:
        raise UnknownEngine(f"unknown engine {product!r}: expected one of {', '.join(products())}")
    text = str(version).lstrip("v")
    for spec in families:
        if text in spec.releases:
            return spec
    parsed = _version(text)
    home = next(
        (
            spec
            for spec in families
            if parsed is not None
            and spec.family_versions
            and parsed in SpecifierSet(spec.family_versions, prereleases=True)
        ),
        None,
    )
    implemented = ", ".join(
        f"{release} ({spec.name})" for spec in families for release in spec.releases
    )
    if home is not None:
        where = (
            f"a release of the {home.title} family ({home.family_versions}; engine {home.name}), "
            f"whose rules servelab implements at {', '.join(home.releases)} only"
        )
    elif parsed is None:
        where = f"not a release number; servelab implements {product} at {implemented} only"
    else:
        where = f"servelab implements {product} at {implemented} only"
    raise UnsupportedRelease(
        f"{product} {version}: {where}; nearest supported releases: {_nearest(product, parsed)}"
    )


def check_release(engine: str, version: str) -> EngineSpec:
    """`engine`'s spec if it implements release `version`; UnsupportedRelease otherwise (naming
    the family `version` belongs to, which may be another engine of the same product)."""
    spec = engine_spec(engine)
    if str(version) in spec.releases:
        return spec
    try:
        home = family_for(spec.product, str(version))
    except UnsupportedRelease as exc:
        raise UnsupportedRelease(f"engine {engine}: {exc}") from None
    raise UnsupportedRelease(
        f"engine {engine} implements {spec.title} {', '.join(spec.releases)}; {spec.product} "
        f"{version} follows the rules of engine {home.name} ({home.title}): configure it as "
        f"engines.{home.name}"
    )


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
