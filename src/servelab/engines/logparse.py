"""Read what an engine resolved from its start-up log (docs/engines.md, "Reading what an engine
resolved").

`parse_startup_log(text)` returns each value the log SHOWS, with the exact line it came from, and
None for every value it does not show: it never fills in a default. The engine is detected from
the text by the start-up messages only it prints (`LogFormat.markers` of each registered engine);
each engine's module reads its own lines (see `servelab.engines.vllm` and `servelab.engines.sglang`
for their rules, `servelab.engines.logtext` for the rules all share).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

from servelab.engines.base import CONFIG_FIELDS, ParsedLog, UnknownEngineLog
from servelab.engines.logtext import ANSI, readiness, split_lines
from servelab.engines.registry import engine_names, engine_spec, engine_specs, release_family
from servelab.engines.spec import EngineSpec, LogFormat

__all__ = ["CONFIG_FIELDS", "ParsedLog", "UnknownEngineLog", "detect_engine", "parse_startup_log"]


def _records(
    text: str,
    specs: tuple[EngineSpec, ...],
    words: Callable[[LogFormat], re.Pattern[str]],
    patterns: Callable[[LogFormat], tuple[re.Pattern[str], ...]],
) -> dict[str, set[int]]:
    """Which of each spec's `patterns` match a logger record's message in `text`."""
    found: dict[str, set[int]] = {spec.name: set() for spec in specs}
    for raw in text.splitlines():
        clean: str | None = None
        for spec in specs:
            fmt = spec.log
            pats = patterns(fmt)
            if len(found[spec.name]) == len(pats) or not words(fmt).search(raw):
                continue
            if clean is None:
                clean = ANSI.sub("", raw)
            m = fmt.record.search(clean)
            if m is None:
                continue
            msg = m.group("msg")
            for i, pat in enumerate(pats):
                if pat.match(msg):
                    found[spec.name].add(i)
    return found


def _marker_counts(text: str) -> dict[str, int]:
    """How many distinct start-up messages of each engine appear as logger records."""
    found = _records(text, engine_specs(), lambda f: f.marker_words, lambda f: f.markers)
    return {name: len(ids) for name, ids in found.items()}


def _product_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """Each product's count: the best of its release families' (they share most markers)."""
    out: dict[str, int] = {}
    for spec in engine_specs():
        out[spec.product] = max(out.get(spec.product, 0), counts[spec.name])
    return out


def _product_title(product: str) -> str:
    return engine_spec(next(s.name for s in engine_specs() if s.product == product)).title


def engine_titles() -> str:
    """The registered products' titles as a phrase: "vLLM or SGLang", "vLLM, SGLang or Toy"."""
    titles = list(dict.fromkeys(_product_title(spec.product) for spec in engine_specs()))
    return ", ".join(titles[:-1]) + " or " + titles[-1] if len(titles) > 1 else titles[0]


def _family_words(fmt: LogFormat) -> re.Pattern[str]:
    return re.compile("|".join(p.pattern for p in fmt.family_marks) or r"(?!)")


def _family(text: str, product: str) -> str:
    """The release family of `product` whose own start-up lines the log shows."""
    families = tuple(s for s in engine_specs() if s.product == product)
    if len(families) == 1:
        return families[0].name
    found = _records(text, families, _family_words, lambda f: f.family_marks)
    shown = [spec.name for spec in families if found[spec.name]]
    if len(shown) == 1:
        return shown[0]
    if not shown:
        # No line of a family's own: the version the log prints names its family, if any (by
        # the families' release ranges, or as the very string a family's release prints: vLLM
        # 0.6.3 prints "dev").
        homes = set()
        for spec in families:
            version = spec.log.read(split_lines(text, spec.log.record)).values.get("version")
            if version is None:
                continue
            homes |= {s.name for s in families if s.printed_version == str(version)}
            if (home := release_family(product, str(version))) is not None:
                homes.add(home.name)
        if len(homes) == 1:
            return homes.pop()
    what = "; ".join(
        f"{spec.title}: {', '.join(repr(p.pattern) for p in spec.log.family_marks)}"
        for spec in families
    )
    if not shown:
        names = " or ".join(f"--engine {spec.name}" for spec in families)
        raise UnknownEngineLog(
            f"a {_product_title(product)} start-up log of no release family servelab can tell: "
            f"it shows {_product_title(product)} start-up lines, but neither a version nor any "
            f"of the lines that tell its families apart ({what}); give the engine ({names})"
        )
    raise UnknownEngineLog(
        f"the log shows lines of several {_product_title(product)} release families "
        f"({', '.join(shown)}); give the engine"
    )


def detect_engine(text: str) -> str:
    """The registered engine (release family) whose start-up lines the log shows most.

    The product (vLLM, SGLang, ...) is the one whose start-up lines the log shows most; its
    release family is the one whose own lines (`LogFormat.family_marks`) appear. UnknownEngineLog
    when no product's lines appear, when two products' appear equally, or when the family cannot
    be told; its message names what was seen.
    """
    counts = _product_counts(_marker_counts(text))
    found = sorted(((n, name) for name, n in counts.items() if n), reverse=True)
    if not found:
        hints = "; ".join(
            f"{spec.title}: {spec.log.marker_hint}"
            for spec in {s.product: s for s in reversed(engine_specs())}.values()
        )
        raise UnknownEngineLog(
            f"not a {engine_titles()} start-up log: none of any engine's start-up lines ({hints}) "
            "was found"
        )
    if len(found) > 1 and found[0][0] == found[1][0]:
        tied = [
            p for p in dict.fromkeys(s.product for s in engine_specs()) if counts[p] == found[0][0]
        ]
        titles = " and ".join(_product_title(p) for p in tied)
        raise UnknownEngineLog(
            f"the log shows start-up lines of both {titles} equally; give the engine"
        )
    return _family(text, found[0][1])


def parse_startup_log(text: str, engine: str | None = None) -> ParsedLog:
    """Parse a start-up log of a registered engine (detected from the text unless given).

    Raises UnknownEngineLog (a ValueError) when the text is from no registered engine, or when
    `engine` is given and the text shows none of that engine's start-up lines.
    """
    if engine is None:
        engine = detect_engine(text)
    elif engine not in engine_names():
        raise UnknownEngineLog(
            f"unknown engine {engine!r}: expected one of {', '.join(engine_names())}"
        )
    else:
        counts = _marker_counts(text)
        if not counts[engine]:
            others = sorted(
                ((n, name) for name, n in counts.items() if n and name != engine), reverse=True
            )
            hint = (
                f"; it looks like an {_product_title(engine_spec(others[0][1]).product)} log"
                if others
                else ""
            )
            raise UnknownEngineLog(
                f"not a {engine_spec(engine).title} start-up log: none of its start-up lines was "
                f"found{hint}"
            )
    spec = engine_spec(engine)
    lines = split_lines(text, spec.log.record)
    reader = spec.log.read(lines)
    reader.conflicts()
    ready, failure = readiness(lines, spec.log.ready)
    config = {name: reader.values.get(name) for name in CONFIG_FIELDS}
    facts = {k: reader.values[k] for k in spec.log.facts if k in reader.values}
    keep = set(CONFIG_FIELDS) | set(facts)
    return ParsedLog(
        engine=engine,
        **config,
        evidence=MappingProxyType({k: v for k, v in reader.evidence.items() if k in keep}),
        evidence_lines=MappingProxyType({k: v for k, v in reader.lines.items() if k in keep}),
        notes=MappingProxyType({k: v for k, v in reader.notes.items() if k in keep}),
        facts=MappingProxyType(facts),
        ready=ready,
        failure=failure,
    )
