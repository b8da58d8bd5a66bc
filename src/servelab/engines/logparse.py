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
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from servelab.engines.base import CONFIG_FIELDS, ParsedLog, UnknownEngineLog
from servelab.engines.logtext import ANSI, readiness, split_lines
from servelab.engines.registry import engine_names, engine_spec, engine_specs, release_family
from servelab.engines.spec import EngineSpec, LogFormat

__all__ = [
    "CONFIG_FIELDS",
    "FamilyDisagreement",
    "ParsedLog",
    "UnknownEngineLog",
    "UnknownReleaseFamily",
    "detect_engine",
    "parse_startup_log",
]


class UnknownReleaseFamily(UnknownEngineLog):
    """A log of a known product that shows none of the lines telling its release families apart
    (an excerpt, typically). `families`: the product's families, each a candidate."""

    def __init__(self, message: str, product: str, families: tuple[str, ...]) -> None:
        super().__init__(message)
        self.product = product
        self.families = families


class FamilyDisagreement(UnknownEngineLog):
    """An excerpt of no telling family that the candidate families would read differently."""


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
        raise UnknownReleaseFamily(
            f"a {_product_title(product)} start-up log of no release family servelab can tell: "
            f"it shows {_product_title(product)} start-up lines, but neither a version nor any "
            f"of the lines that tell its families apart ({what}); give the engine ({names})",
            product,
            tuple(spec.name for spec in families),
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


def parse_startup_log(
    text: str, engine: str | None = None, *, family_open: bool = False
) -> ParsedLog:
    """Parse a start-up log of a registered engine (detected from the text unless given).

    Raises UnknownEngineLog (a ValueError) when the text is from no registered engine, or when
    `engine` is given and the text shows none of that engine's start-up lines.

    `family_open`: a log of a known product whose release family the text cannot tell (an
    excerpt: a start-up tail, a runtime batch line, a log without its version line) is read by
    every candidate family; when all of them read the shown lines the same way, that reading is
    returned with the family left open (`ParsedLog.open_families` names the candidates, `engine`
    is the product). Where they would read it differently, FamilyDisagreement names each
    difference. Without it, such a log is refused (the gate always knows its engine).
    """
    if engine is None:
        try:
            engine = detect_engine(text)
        except UnknownReleaseFamily as unknown:
            if not family_open:
                raise
            return _read_with_family_open(text, unknown)
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
    return _read(text, engine)


def _read(text: str, engine: str) -> ParsedLog:
    """The log read with `engine`'s rules."""
    spec = engine_spec(engine)
    lines = split_lines(text, spec.log.record)
    reader = spec.log.read(lines)
    reader.conflicts()
    ready, failure = readiness(lines, spec.log.ready)
    config: dict[str, Any] = {name: reader.values.get(name) for name in CONFIG_FIELDS}
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


def _read_with_family_open(text: str, unknown: UnknownReleaseFamily) -> ParsedLog:
    """Read by every candidate family. The settings (and how each was read) must agree, or
    FamilyDisagreement names each difference; a fact some family does not read is left out of
    the reading, and its notes say so."""
    parsed = {name: _read(text, name) for name in unknown.families}
    settings = {
        name: {k: getattr(log, k) for k in CONFIG_FIELDS}
        | {f"notes.{k}": v for k, v in log.notes.items() if k in CONFIG_FIELDS}
        for name, log in parsed.items()
    }
    first_name = unknown.families[0]
    keys = sorted(set().union(*settings.values()))
    differ = [
        k for k in keys if any(r.get(k) != settings[first_name].get(k) for r in settings.values())
    ]
    fact_names = sorted(set().union(*(log.facts for log in parsed.values())))
    differ += [
        f"facts.{k}"
        for k in fact_names
        if all(k in log.facts for log in parsed.values())
        and any(log.facts[k] != parsed[first_name].facts[k] for log in parsed.values())
    ]
    if differ:

        def value(name: str, key: str) -> Any:
            if key.startswith("facts."):
                return parsed[name].facts.get(key.removeprefix("facts."))
            return settings[name].get(key)

        what = "; ".join(
            f"{key}: " + ", ".join(f"{n} reads {value(n, key)!r}" for n in unknown.families)
            for key in differ
        )
        names = " or ".join(f"--engine {name}" for name in unknown.families)
        raise FamilyDisagreement(
            f"a {_product_title(unknown.product)} log of no release family servelab can tell, "
            f"which its families would read differently ({what}); give the engine ({names})"
        )
    first = parsed[first_name]
    partial = [k for k in fact_names if not all(k in log.facts for log in parsed.values())]
    notes = dict(first.notes)
    for k in partial:
        readers = ", ".join(n for n, log in parsed.items() if k in log.facts)
        notes[k] = f"left out: only {readers} reads this line (the release family is open)"
    return replace(
        first,
        engine=unknown.product,
        open_families=unknown.families,
        facts=MappingProxyType({k: v for k, v in first.facts.items() if k not in partial}),
        evidence=MappingProxyType({k: v for k, v in first.evidence.items() if k not in partial}),
        evidence_lines=MappingProxyType(
            {k: v for k, v in first.evidence_lines.items() if k not in partial}
        ),
        notes=MappingProxyType(notes),
    )
