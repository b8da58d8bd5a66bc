"""Read what an engine resolved from its start-up log (DESIGN.md "Reading what an engine resolved").

`parse_startup_log(text)` returns each value the log SHOWS, with the exact line it came from, and
None for every value it does not show: it never fills in a default. Rules (docs/engines.md):

- Lines are found anywhere in a physical line, so prefixes added by docker compose
  (`runner-llm-1  | `), Docker Desktop or `kubectl logs --timestamps` do not matter; carriage
  returns (tqdm bars) split lines; ANSI colour codes are ignored.
- A field is read only when its value is followed by its delimiter (`,`, `)`, `.` or the end of a
  complete line), so a line cut in the middle of a value leaves that value unknown. The last line
  of a text that does not end with a newline may be cut: values at its end are not read.
- When a line occurs several times (vLLM's frontend and engine process both log the chunked-prefill
  line; a log may hold several start-ups) the last occurrence counts; disagreeing occurrences are
  reported in `notes`.

vLLM (research/engines.md A2): `version` from "vLLM API server version X" or the engine line's
"(vX)" (any string: `dev`, `0.6.1.dev238+ge2c6e0a82`, `999.999.999`); `chunked_prefill` from the
engine line's `chunked_prefill_enabled=` (0.6.3's missing comma before multi_step_stream_outputs
and 0.6.6's field order both handled), else "Chunked prefill is enabled with
max_num_batched_tokens=N." or the ">32K" warning (both mean on); when a COMPLETE engine line of a
version without that field (0.6.2) is present and neither line is, it is off: an implicit reading,
marked in `notes`. `chunk_size` (only when chunking is on) from "Chunked prefill is enabled with
max_num_batched_tokens=N.", else from an explicit `max_num_batched_tokens=N` in the args line.
`prefix_caching` and `context_len` (max_seq_len) from the engine line; context_len else from
"Maximum concurrency for N tokens per request". `schedule_policy` from the args line's
`scheduling_policy` (vLLM 0.6.3 uses it verbatim). The args line's `None` values are configured,
not resolved, and are never read.

SGLang (B2): everything from `server_args=ServerArgs(...)` (printed after `__post_init__`, so
resolved) and the `max_total_num_tokens=..., context_len=N` summary line: chunked prefill on iff
chunked_prefill_size > 0 (`-1` disables), `prefix_caching` = not disable_radix_cache,
`schedule_policy` as printed except that lpm/dfs-weight with the radix cache disabled is fcfs (the
engine's own fallback, noted), `context_len` from the summary line (else an explicit
`context_length=N`, noted). SGLang 0.4.x prints no version: `version` is None.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from servelab.engines.flags import ENGINE_NAMES

__all__ = ["CONFIG_FIELDS", "ParsedLog", "UnknownEngineLog", "detect_engine", "parse_startup_log"]

CONFIG_FIELDS = (
    "version",
    "chunked_prefill",
    "chunk_size",
    "prefix_caching",
    "context_len",
    "schedule_policy",
)

_ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang"}


class UnknownEngineLog(ValueError):
    """The text is not a start-up log of the engine(s) looked for."""


@dataclass(frozen=True)
class ParsedLog:
    """What a start-up log shows. Every configuration value is None when the log does not show it.

    `evidence[name]` is the exact log line (as in the file) that a value came from and
    `evidence_lines[name]` its 1-based line number; `notes[name]` says how a value was read when
    the reading is not direct (implicit, a configured value, the engine's fallback, conflicts).
    `facts` holds other values the log shows (KV blocks, token pool, memory fraction, ...).
    `ready` says whether the log shows the engine ready to serve; `failure` is the first line that
    shows a failed start-up (an exception, an ERROR record, CUDA OOM) before it became ready.
    """

    engine: str
    version: str | None = None
    chunked_prefill: bool | None = None
    chunk_size: int | None = None
    prefix_caching: bool | None = None
    context_len: int | None = None
    schedule_policy: str | None = None
    evidence: Mapping[str, str] = field(default_factory=dict)
    evidence_lines: Mapping[str, int] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    facts: Mapping[str, Any] = field(default_factory=dict)
    ready: bool = False
    failure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine}
        for name in CONFIG_FIELDS:
            out[name] = getattr(self, name)
        out["evidence"] = dict(sorted(self.evidence.items()))
        out["evidence_lines"] = dict(sorted(self.evidence_lines.items()))
        out["notes"] = dict(sorted(self.notes.items()))
        out["facts"] = dict(sorted(self.facts.items()))
        out["ready"] = self.ready
        out["failure"] = self.failure
        return dict(sorted(out.items()))

    def to_json(self) -> str:
        """One JSON object, keys sorted."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2, ensure_ascii=False)


# ----------------------------------------------------------------------------------- lines

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CUT = "\x00"  # appended to a possibly-cut last line so end-anchored patterns fail

_VLLM_RECORD = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? "
    r"\[?(?P<src>[\w.-]+\.py):\d+\] (?P<msg>.*)$"
)
_SGLANG_RECORD = re.compile(
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?P<proc>(?: [A-Z]{2}\d+)*)\] (?P<msg>.*)$"
)
# Prefixes other tools put before a line: docker compose "service-1  | ", ISO or plain timestamps.
_PREFIX = re.compile(
    r"^(?:[\w.-]+\s+\|\s?|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s)"
)


@dataclass
class _Line:
    no: int  # 1-based
    raw: str  # exact text, as in the file
    text: str  # ANSI-free, prefixes removed, possibly with _CUT appended
    msg: str | None  # the logger record's message for the engine being parsed, if any
    level: str | None


def _strip_prefixes(text: str) -> str:
    for _ in range(4):
        stripped = _PREFIX.sub("", text, count=1)
        if stripped == text:
            break
        text = stripped
    return text


def _lines(text: str, engine: str) -> list[_Line]:
    physical = text.splitlines()
    may_cut_last = bool(text) and not text.endswith(("\n", "\r"))
    out = []
    for i, raw in enumerate(physical):
        clean = _ANSI.sub("", raw).rstrip()
        if may_cut_last and i == len(physical) - 1:
            clean += _CUT
        record = (_VLLM_RECORD if engine == "vllm" else _SGLANG_RECORD).search(clean)
        msg = record.group("msg") if record else None
        level = record.group("level") if record and engine == "vllm" else None
        out.append(_Line(i + 1, raw, _strip_prefixes(clean), msg, level))
    return out


# --------------------------------------------------------------------------- engine detection

# Messages (the part after the logger prefix) that only each engine's start-up prints.
_MARKERS: dict[str, tuple[re.Pattern[str], ...]] = {
    "vllm": (
        re.compile(r"Initializing an? (?:V\d )?LLM engine \(v[^\s()]*\) with config:"),
        re.compile(r"vLLM API server version \S"),
        re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=\d"),
        re.compile(r"# (?:GPU|CPU) blocks: \d"),
        re.compile(r"args: Namespace\(.*(?:max_num_batched_tokens|enable_chunked_prefill)="),
        re.compile(r"Chunked prefill is enabled by default for models with max_model_len > 32K"),
    ),
    "sglang": (
        re.compile(r"server_args=ServerArgs\("),
        re.compile(r"max_total_num_tokens=\d+, "),
        re.compile(r"The server is fired up and ready to roll!"),
        re.compile(r"(?:Prefill|Decode) batch\. #"),
        re.compile(r"Load weight begin\. avail mem="),
        re.compile(r"Capture cuda graph begin\."),
    ),
}
_RECORDS = {"vllm": _VLLM_RECORD, "sglang": _SGLANG_RECORD}
# Words every marker message contains: lines without any are skipped cheaply.
_MARKER_WORDS = re.compile(
    r"LLM engine|server version|Chunked prefill is enabled| blocks: |Namespace\(|ServerArgs\(|"
    r"max_total_num_tokens=|ready to roll| batch\. #|Load weight begin|Capture cuda graph begin"
)


def _marker_counts(text: str) -> dict[str, int]:
    """How many distinct start-up messages of each engine appear as logger records."""
    found: dict[str, set[int]] = {e: set() for e in _MARKERS}
    for raw in text.splitlines():
        if not _MARKER_WORDS.search(raw):
            continue
        clean = _ANSI.sub("", raw)
        for engine, record in _RECORDS.items():
            if len(found[engine]) == len(_MARKERS[engine]):
                continue
            m = record.search(clean)
            if m is None:
                continue
            msg = m.group("msg")
            for i, pat in enumerate(_MARKERS[engine]):
                if pat.match(msg):
                    found[engine].add(i)
    return {e: len(ids) for e, ids in found.items()}


def detect_engine(text: str) -> str:
    """ "vllm" or "sglang" from the log's own lines; UnknownEngineLog when neither or both."""
    counts = _marker_counts(text)
    found = sorted((n, e) for e, n in counts.items() if n)
    if not found:
        raise UnknownEngineLog(
            "not a vLLM or SGLang start-up log: none of either engine's start-up lines "
            "(vLLM: 'Initializing an LLM engine (v...) with config:', 'vLLM API server version'; "
            "SGLang: 'server_args=ServerArgs(', 'max_total_num_tokens=...') was found"
        )
    if len(found) == 2 and found[0][0] == found[1][0]:
        raise UnknownEngineLog(
            "the log shows start-up lines of both vLLM and SGLang equally; give the engine"
        )
    return found[-1][1]


# ------------------------------------------------------------------------------ the reader


class _Reader:
    """Collects values with their evidence; the last occurrence wins, disagreements are noted."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.evidence: dict[str, str] = {}
        self.lines: dict[str, int] = {}
        self.notes: dict[str, str] = {}
        self.seen: dict[str, set[str]] = {}

    def put(self, name: str, value: Any, line: _Line, note: str | None = None) -> None:
        self.seen.setdefault(name, set()).add(repr(value))
        self.values[name] = value
        self.evidence[name] = line.raw
        self.lines[name] = line.no
        if note:
            self.notes[name] = note
        else:
            self.notes.pop(name, None)

    def has(self, name: str) -> bool:
        return name in self.values

    def conflicts(self) -> None:
        for name, values in self.seen.items():
            if len(values) > 1 and name in self.values:
                prior = self.notes.get(name)
                msg = (
                    f"the log shows {len(values)} different values ({', '.join(sorted(values))}); "
                    f"the last, at line {self.lines[name]}, is used"
                )
                self.notes[name] = f"{prior}; {msg}" if prior else msg


def _field(body: str, name: str, value: str) -> re.Match[str] | None:
    """`name=value` in a repr-like body, with a delimiter after the value (`,`, `)`, space)."""
    return re.search(rf"(?:^|[\s,(]){re.escape(name)}=({value})(?=[,)\s])", body)


_BOOL = r"True|False"
_INT = r"-?\d+"
_FAILURE = re.compile(
    r"^(?:[\w.]+\.)?(?P<exc>\w*(?:Error|Exception)|KeyboardInterrupt|Killed)(?::\s.*)?$"
)
_FAIL_ANYWHERE = re.compile(
    r"CUDA out of memory|Engine process failed to start|Initialization failed\.|"
    r"Received sigquit|Traceback \(most recent call last\)"
)


_READY = {
    "vllm": re.compile(
        r"Uvicorn running on|Application startup complete\.|Graph capturing finished in|"
        r"init engine \(profile, create kv cache, warmup model\) took"
    ),
    "sglang": re.compile(r"The server is fired up and ready to roll!"),
}


def _readiness(lines: list[_Line], engine: str) -> tuple[bool, str | None]:
    """(ready, failure): whether the log shows the engine ready to serve, and the first line
    showing a failed start-up before that (errors after readiness are not start-up failures)."""
    failure: str | None = None
    for line in lines:
        if _READY[engine].search(line.text):
            return True, failure
        if failure is None and (
            line.level in ("ERROR", "CRITICAL")
            or _FAILURE.match(line.text.replace(_CUT, ""))
            or _FAIL_ANYWHERE.search(line.text)
        ):
            failure = line.raw
    return False, failure


# The messages _parse_vllm reads (a cheap first test: most lines of a long log are none of them).
_VLLM_INTERESTING = re.compile(
    r"vLLM API server version |Initializing an? |Chunked prefill is enabled |args: Namespace\(|"
    r"# (?:GPU|CPU) blocks: |Maximum concurrency for |Loading model weights took "
)


def _parse_vllm(lines: list[_Line]) -> _Reader:
    r = _Reader()
    engine_line: _Line | None = None
    engine_cfg = ""
    chunk_line: _Line | None = None
    chunk_value: int | None = None
    auto_line: _Line | None = None
    args_line: _Line | None = None
    args_body = ""
    concurrency: tuple[_Line, int] | None = None
    for line in lines:
        msg = line.msg
        if msg is None or not _VLLM_INTERESTING.match(msg):
            continue
        if m := re.match(r"vLLM API server version ([^\s\x00]+)$", msg):
            r.put("version", m.group(1), line)
        elif m := re.match(
            r"Initializing an? (?:V\d )?LLM engine \(v([^\s()]+)\) with config: (.*)$", msg
        ):
            r.put("version", m.group(1), line)
            engine_line, engine_cfg = line, m.group(2)
            for name, key, pat, conv in (
                ("chunked_prefill", "chunked_prefill_enabled", _BOOL, lambda v: v == "True"),
                ("prefix_caching", "enable_prefix_caching", _BOOL, lambda v: v == "True"),
                ("context_len", "max_seq_len", r"\d+", int),
                ("tensor_parallel_size", "tensor_parallel_size", r"\d+", int),
            ):
                if f := _field(engine_cfg, key, pat):
                    r.put(name, conv(f.group(1)), line)
        elif m := re.match(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)\.", msg):
            chunk_line, chunk_value = line, int(m.group(1))
        elif msg.startswith("Chunked prefill is enabled by default for models with max_model_len"):
            auto_line = line
        elif m := re.match(r"args: Namespace\((.*)$", msg):
            args_line, args_body = line, m.group(1)
        elif m := re.match(r"# GPU blocks: (\d+), # CPU blocks: (\d+)$", msg):
            r.put("num_gpu_blocks", int(m.group(1)), line)
            r.put("num_cpu_blocks", int(m.group(2)), line)
        elif m := re.match(r"# CPU blocks: (\d+)$", msg):
            r.put("num_cpu_blocks", int(m.group(1)), line)
        elif m := re.match(r"Maximum concurrency for (\d+) tokens per request: ([\d.]+)x$", msg):
            r.put("max_concurrency", float(m.group(2)), line)
            concurrency = (line, int(m.group(1)))
        elif m := re.match(r"Loading model weights took ([\d.]+) GB$", msg):
            r.put("weights_gib", float(m.group(1)), line)

    # chunked_prefill: the engine line's resolved flag, else the lines that only print when on.
    if not r.has("chunked_prefill"):
        if chunk_line is not None:
            r.put("chunked_prefill", True, chunk_line)
        elif auto_line is not None:
            r.put("chunked_prefill", True, auto_line)
        elif engine_line is not None and _complete_engine_line(engine_cfg):
            r.put(
                "chunked_prefill",
                False,
                engine_line,
                "implicit: this version's engine line has no chunked_prefill_enabled field and "
                "the log has no 'Chunked prefill is enabled' line, which vLLM prints whenever "
                "chunked prefill is on",
            )
    if r.values.get("chunked_prefill") is True:
        if chunk_line is not None:
            r.put("chunk_size", chunk_value, chunk_line)
        elif args_line is not None and (f := _field(args_body, "max_num_batched_tokens", r"\d+")):
            r.put(
                "chunk_size",
                int(f.group(1)),
                args_line,
                "configured explicitly in the args line; vLLM uses an explicit "
                "max_num_batched_tokens verbatim",
            )
    if not r.has("context_len") and concurrency is not None:
        r.put("context_len", concurrency[1], concurrency[0])
    if args_line is not None and (f := _field(args_body, "scheduling_policy", r"'[\w-]+'")):
        r.put(
            "schedule_policy",
            f.group(1).strip("'"),
            args_line,
            "from the args line: vLLM 0.6.3 schedules by this policy verbatim",
        )
    return r


def _complete_engine_line(cfg: str) -> bool:
    """True when the engine-config message ends with its own closing parenthesis.

    The message is `... with config: model=..., mm_processor_kwargs=None)`: outside quoted strings
    its parentheses are unbalanced by exactly the one final `)`. A line cut anywhere (including
    right after a nested `DecodingConfig(...)`) fails this test.
    """
    if _CUT in cfg or not cfg.endswith(")"):
        return False
    depth, quote = 0, ""
    for ch in cfg:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
    return depth == -1 and not quote


def _parse_sglang(lines: list[_Line]) -> _Reader:
    r = _Reader()
    args_size: tuple[_Line, int | None] | None = None
    summary_size: tuple[_Line, int | None] | None = None
    explicit_context: tuple[_Line, int] | None = None
    for line in lines:
        msg = line.msg
        if msg is None or not msg.startswith(("server_args=", "max_total_num_tokens=")):
            continue
        if m := re.match(r"server_args=ServerArgs\((.*)$", msg):
            body = m.group(1)
            if f := _field(body, "chunked_prefill_size", rf"{_INT}|None"):
                args_size = (line, None if f.group(1) == "None" else int(f.group(1)))
            radix = _field(body, "disable_radix_cache", _BOOL)
            if radix:
                r.put("prefix_caching", radix.group(1) == "False", line)
            if f := _field(body, "schedule_policy", r"'[\w-]+'"):
                policy = f.group(1).strip("'")
                if radix and radix.group(1) == "True" and policy in ("lpm", "dfs-weight"):
                    note = (
                        f"schedule_policy='{policy}' with disable_radix_cache=True: SGLang falls "
                        "back to fcfs (schedule_policy.py)"
                    )
                    r.put("schedule_policy", "fcfs", line, note)
                else:
                    r.put("schedule_policy", policy, line)
            if f := _field(body, "context_length", r"\d+"):
                explicit_context = (line, int(f.group(1)))
            for name, pat, conv in (
                ("mem_fraction_static", r"[\d.]+", float),
                ("cuda_graph_max_bs", r"\d+", int),
                ("tp_size", r"\d+", int),
            ):
                if f := _field(body, name, pat):
                    r.put(name, conv(f.group(1)), line)
        elif msg.startswith("max_total_num_tokens="):
            for name in (
                "max_total_num_tokens",
                "max_prefill_tokens",
                "max_running_requests",
                "context_len",
            ):
                if f := re.search(rf"(?:^|, ){name}=(\d+)(?=,|$)", msg):
                    r.put(name, int(f.group(1)), line)
            if f := re.search(rf"(?:^|, )chunked_prefill_size=({_INT}|None)(?=,|$)", msg):
                summary_size = (line, None if f.group(1) == "None" else int(f.group(1)))

    # chunked prefill: server_args (resolved by __post_init__); a newer summary line that also
    # prints chunked_prefill_size is the scheduler's own value and wins if they disagree.
    chosen = summary_size or args_size
    if chosen is not None:
        line, size = chosen
        note = None
        if summary_size and args_size and summary_size[1] != args_size[1]:
            note = (
                f"server_args (line {args_size[0].no}) shows chunked_prefill_size={args_size[1]}, "
                f"the scheduler's summary line shows {summary_size[1]}; the summary line is used"
            )
        elif summary_size is not None and args_size is not None:
            line = args_size[0]  # they agree: cite the resolution itself
        if size is not None and size > 0:
            r.put("chunked_prefill", True, line, note)
            r.put("chunk_size", size, line, note)
        else:
            why = f"chunked_prefill_size={size}: a value <= 0 (or None) disables chunking"
            r.put("chunked_prefill", False, line, f"{note}; {why}" if note else why)
    if not r.has("context_len") and explicit_context is not None:
        r.put(
            "context_len",
            explicit_context[1],
            explicit_context[0],
            "configured explicitly (context_length); SGLang uses it verbatim",
        )
    return r


_FACTS = {
    "vllm": ("num_gpu_blocks", "num_cpu_blocks", "max_concurrency", "weights_gib"),
    "sglang": (
        "max_total_num_tokens",
        "max_prefill_tokens",
        "max_running_requests",
        "mem_fraction_static",
        "cuda_graph_max_bs",
        "tp_size",
    ),
}


def parse_startup_log(text: str, engine: str | None = None) -> ParsedLog:
    """Parse a vLLM or SGLang start-up log (engine detected from the text unless given).

    Raises UnknownEngineLog (a ValueError) when the text is from neither engine, or when `engine`
    is given and the text shows none of that engine's start-up lines.
    """
    if engine is None:
        engine = detect_engine(text)
    elif engine not in ENGINE_NAMES:
        raise UnknownEngineLog(
            f"unknown engine {engine!r}: expected one of {', '.join(ENGINE_NAMES)}"
        )
    else:
        counts = _marker_counts(text)
        if not counts[engine]:
            other = next(e for e in ENGINE_NAMES if e != engine)
            hint = f"; it looks like an {_ENGINE_TITLES[other]} log" if counts[other] else ""
            raise UnknownEngineLog(
                f"not a {_ENGINE_TITLES[engine]} start-up log: none of its start-up lines was "
                f"found{hint}"
            )
    lines = _lines(text, engine)
    reader = _parse_vllm(lines) if engine == "vllm" else _parse_sglang(lines)
    reader.conflicts()
    ready, failure = _readiness(lines, engine)
    config = {name: reader.values.get(name) for name in CONFIG_FIELDS}
    keep = set(CONFIG_FIELDS) | set(_FACTS[engine])
    facts = {k: reader.values[k] for k in _FACTS[engine] if k in reader.values}
    if engine == "vllm" and "tensor_parallel_size" in reader.values:
        facts["tensor_parallel_size"] = reader.values["tensor_parallel_size"]
        keep.add("tensor_parallel_size")
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
