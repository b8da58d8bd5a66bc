"""Engine log text, read and written: the line machinery every engine's start-up-log parser and
renderer shares. Engine-neutral; each engine's module supplies its own record format, markers and
readers (see docs/engines.md for the rules).

- Lines are found anywhere in a physical line, so prefixes added by docker compose
  (`runner-llm-1  | `), Docker Desktop or `kubectl logs --timestamps` do not matter; carriage
  returns (tqdm bars) split lines; ANSI colour codes are ignored.
- A field is read only when its value is followed by its delimiter (`,`, `)`, `.` or the end of a
  complete line), so a line cut in the middle of a value leaves that value unknown. The last line
  of a text that does not end with a newline may be cut: values at its end are not read.
- When a line occurs several times the last occurrence counts; disagreeing occurrences are noted.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANSI",
    "BOOL",
    "CUDA_CONTEXT_GIB",
    "CUT",
    "INT",
    "LLAMA_31_8B_KV_BYTES_PER_TOKEN",
    "TORCH_DTYPES",
    "LogLine",
    "Reader",
    "field",
    "readiness",
    "split_lines",
    "token",
    "tqdm_shards",
]

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CUT = "\x00"  # appended to a possibly-cut last line so end-anchored patterns fail

# Prefixes other tools put before a line: docker compose "service-1  | ", ISO or plain timestamps.
_PREFIX = re.compile(
    r"^(?:[\w.-]+\s+\|\s?|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s)"
)


@dataclass
class LogLine:
    no: int  # 1-based
    raw: str  # exact text, as in the file
    text: str  # ANSI-free, prefixes removed, possibly with CUT appended
    msg: str | None  # the logger record's message for the engine being parsed, if any
    level: str | None


def _strip_prefixes(text: str) -> str:
    for _ in range(4):
        stripped = _PREFIX.sub("", text, count=1)
        if stripped == text:
            break
        text = stripped
    return text


# One-letter record levels (llama.cpp's common_log: I, W, E, D) under the names readiness checks.
_LEVEL_NAMES = {"D": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR"}


def split_lines(text: str, record: re.Pattern[str]) -> list[LogLine]:
    """The text's lines; `record` is the engine's logger-record pattern, with a `msg` group and,
    if its records carry one, a `level` group."""
    physical = text.splitlines()
    may_cut_last = bool(text) and not text.endswith(("\n", "\r"))
    has_level = "level" in record.groupindex
    out = []
    for i, raw in enumerate(physical):
        clean = ANSI.sub("", raw).rstrip()
        if may_cut_last and i == len(physical) - 1:
            clean += CUT
        m = record.search(clean)
        msg = m.group("msg") if m else None
        level = m.group("level") if m and has_level else None
        if level is not None:
            level = _LEVEL_NAMES.get(level, level)
        out.append(LogLine(i + 1, raw, _strip_prefixes(clean), msg, level))
    return out


class Reader:
    """Collects values with their evidence; the last occurrence wins, disagreements are noted."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.evidence: dict[str, str] = {}
        self.lines: dict[str, int] = {}
        self.notes: dict[str, str] = {}
        self.seen: dict[str, set[str]] = {}

    def put(self, name: str, value: Any, line: LogLine, note: str | None = None) -> None:
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


def field(body: str, name: str, value: str) -> re.Match[str] | None:
    """`name=value` in a repr-like body, with a delimiter after the value (`,`, `)`, space)."""
    return re.search(rf"(?:^|[\s,(]){re.escape(name)}=({value})(?=[,)\s])", body)


def dict_field(body: str, name: str, value: str) -> re.Match[str] | None:
    """`'name': value` in a Python dict repr (SGLang 0.5's `server_args={...}`), with a delimiter
    after the value (`,`, `}`, space)."""
    return re.search(rf"(?:^|[\s,{{])'{re.escape(name)}': ({value})(?=[,}}\s])", body)


def repr_field(body: str, name: str, value: str) -> re.Match[str] | None:
    """`name`'s value in either a dataclass repr (`name=value`) or a dict repr (`'name': value`)."""
    if body.startswith("{"):
        return dict_field(body, name, value)
    return field(body, name, value)


BOOL = r"True|False"
INT = r"-?\d+"
_FAILURE = re.compile(
    r"^(?:[\w.]+\.)?(?P<exc>\w*(?:Error|Exception)|KeyboardInterrupt|Killed)(?::\s.*)?$"
)
_FAIL_ANYWHERE = re.compile(
    r"CUDA out of memory|Engine process failed to start|Initialization failed\.|"
    r"Received sigquit|Traceback \(most recent call last\)"
)


def readiness(lines: list[LogLine], ready: re.Pattern[str]) -> tuple[bool, str | None]:
    """(ready, failure): whether the log shows the engine ready to serve (a line matching `ready`),
    and the first line showing a failed start-up before that (errors after readiness are not
    start-up failures)."""
    failure: str | None = None
    for line in lines:
        if ready.search(line.text):
            return True, failure
        if failure is None and (
            line.level in ("ERROR", "CRITICAL")
            or _FAILURE.match(line.text.replace(CUT, ""))
            or _FAIL_ANYWHERE.search(line.text)
        ):
            failure = line.raw
    return False, failure


# ------------------------------------------------------------------------------- writing logs

# Llama-3.1-8B in bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes (docs/engines.md).
LLAMA_31_8B_KV_BYTES_PER_TOKEN = 131072
CUDA_CONTEXT_GIB = 0.5

TORCH_DTYPES = {
    "auto": "torch.bfloat16",  # Llama-3.1's config.json says bfloat16
    "bfloat16": "torch.bfloat16",
    "half": "torch.float16",
    "float16": "torch.float16",
    "float": "torch.float32",
    "float32": "torch.float32",
}


def token(*parts: object) -> str:
    """A stable hex digest of `parts`: what a real engine randomises is derived from it."""
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()


def tqdm_shards(total: int, seconds: float) -> list[str]:
    """safetensors shard loading bars as vLLM's/SGLang's loaders print them (one line per update)."""
    lines = [f"Loading safetensors checkpoint shards:   0% Completed | 0/{total} [00:00<?, ?it/s]"]
    per = seconds / total
    for done in range(1, total + 1):
        pct = int(100 * done / total)
        elapsed = int(per * done)
        left = int(per * (total - done))
        lines.append(
            f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {done}/{total} "
            f"[00:{elapsed:02d}<00:{left:02d}, {1 / per:5.2f}it/s]"
        )
    lines.append(lines[-1])  # tqdm prints the final state again when it closes
    lines.append("")
    return lines
