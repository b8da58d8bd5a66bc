"""Read what an engine resolved from its start-up log (docs/engines.md, "Reading what an engine
resolved").

`parse_startup_log(text)` returns each value the log SHOWS, with the exact line it came from, and
None for every value it does not show: it never fills in a default. The engine is detected from
the text by the start-up messages only it prints (`LogFormat.markers` of each registered engine);
each engine's module reads its own lines (see `servelab.engines.vllm` and `servelab.engines.sglang`
for their rules, `servelab.engines.logtext` for the rules all share).
"""

from __future__ import annotations

from types import MappingProxyType

from servelab.engines.base import CONFIG_FIELDS, ParsedLog, UnknownEngineLog
from servelab.engines.logtext import ANSI, readiness, split_lines
from servelab.engines.registry import engine_names, engine_spec, engine_specs

__all__ = ["CONFIG_FIELDS", "ParsedLog", "UnknownEngineLog", "detect_engine", "parse_startup_log"]


def _marker_counts(text: str) -> dict[str, int]:
    """How many distinct start-up messages of each engine appear as logger records."""
    specs = engine_specs()
    found: dict[str, set[int]] = {spec.name: set() for spec in specs}
    for raw in text.splitlines():
        clean: str | None = None
        for spec in specs:
            fmt = spec.log
            if len(found[spec.name]) == len(fmt.markers) or not fmt.marker_words.search(raw):
                continue
            if clean is None:
                clean = ANSI.sub("", raw)
            m = fmt.record.search(clean)
            if m is None:
                continue
            msg = m.group("msg")
            for i, pat in enumerate(fmt.markers):
                if pat.match(msg):
                    found[spec.name].add(i)
    return {name: len(ids) for name, ids in found.items()}


def engine_titles() -> str:
    """The registered engines' titles as a phrase: "vLLM or SGLang", "vLLM, SGLang or Toy"."""
    titles = [spec.title for spec in engine_specs()]
    return ", ".join(titles[:-1]) + " or " + titles[-1] if len(titles) > 1 else titles[0]


def detect_engine(text: str) -> str:
    """The registered engine whose start-up lines the log shows most; UnknownEngineLog when none
    does, or when two engines' lines appear equally."""
    counts = _marker_counts(text)
    found = sorted(((n, name) for name, n in counts.items() if n), reverse=True)
    if not found:
        hints = "; ".join(f"{spec.title}: {spec.log.marker_hint}" for spec in engine_specs())
        raise UnknownEngineLog(
            f"not a {engine_titles()} start-up log: none of any engine's start-up lines ({hints}) "
            "was found"
        )
    if len(found) > 1 and found[0][0] == found[1][0]:
        tied = [name for name in engine_names() if counts[name] == found[0][0]]
        titles = " and ".join(engine_spec(name).title for name in tied)
        raise UnknownEngineLog(
            f"the log shows start-up lines of both {titles} equally; give the engine"
        )
    return found[0][1]


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
            hint = f"; it looks like an {engine_spec(others[0][1]).title} log" if others else ""
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
