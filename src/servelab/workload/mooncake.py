"""Reading a Mooncake trace: the request log format of the FAST'25 "Mooncake" paper's trace release.

The format, as kvcache-ai/Mooncake documents it in FAST25-release/README.md ("Trace Format"; read at
commit 1d0e4c7587b57b78a1997be370b349b79828c5dd, the file's latest change as of the repository's
commit 3b5a594133958449a1feaf1c9e0fc1b553e34a28), for its files `traces/conversation_trace.jsonl`,
`traces/toolagent_trace.jsonl`, `traces/synthetic_trace.jsonl` and the older
`arxiv-trace/mooncake_trace.jsonl`: JSONL, one request per line, each a JSON object with

- `timestamp`: the request's arrival, in milliseconds relative to the trace's start;
- `input_length`: its prompt, in tokens (no text or token ids are released);
- `output_length`: its output, in tokens;
- `hash_ids`: its "remapped prefix block hashes", one per 512-token block of the prompt (the last
  block may be partial); identical ids mark reusable prefix KV-cache blocks.

What this reader holds every line to (an error names the file, the line and the key): a JSON
object; `timestamp` a finite number >= 0, never below the previous line's (the trace is replayed
in file order); `input_length` and `output_length` integers >= 1; `hash_ids` a list of integers
>= 0, exactly ceil(input_length / 512) of them. Blank lines are skipped; other keys are ignored.
Nothing here knows servelab's traces: `servelab.workload.imported` turns the records into one.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BLOCK_TOKENS",
    "REFERENCE",
    "TraceImportError",
    "TraceRecord",
    "read_mooncake",
]

# Tokens per hash id (the README: "The block size is 512 tokens").
BLOCK_TOKENS = 512
# Where the format is defined (recorded in every imported trace's manifest).
REFERENCE = (
    "kvcache-ai/Mooncake FAST25-release/README.md, 'Trace Format' "
    "(commit 1d0e4c7587b57b78a1997be370b349b79828c5dd)"
)
_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceImportError(ValueError):
    """An imported trace that cannot be read or replayed; the message names the file, and the line
    and key where one is at fault."""


@dataclass(frozen=True)
class TraceRecord:
    """One request of an imported trace, as its file gives it."""

    line: int  # 1-based line of the file
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _integer(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def _record(obj: Any, line: int, where: str) -> TraceRecord:
    if not isinstance(obj, dict):
        raise TraceImportError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in _KEYS:
        if key not in obj:
            raise TraceImportError(f"{where}: key {key!r}: missing")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise TraceImportError(
            f"{where}: key 'timestamp': must be a number of milliseconds >= 0, got {ts!r}"
        )
    for key in ("input_length", "output_length"):
        if not _integer(obj[key], 1):
            raise TraceImportError(
                f"{where}: key {key!r}: must be an integer >= 1 (tokens), got {obj[key]!r}"
            )
    hashes = obj["hash_ids"]
    if not isinstance(hashes, list):
        raise TraceImportError(
            f"{where}: key 'hash_ids': must be a list of integers, got {type(hashes).__name__}"
        )
    for j, h in enumerate(hashes):
        if not _integer(h, 0):
            raise TraceImportError(
                f"{where}: key 'hash_ids': item {j} must be an integer >= 0, got {h!r}"
            )
    length = obj["input_length"]
    blocks = -(-length // BLOCK_TOKENS)
    if len(hashes) != blocks:
        raise TraceImportError(
            f"{where}: key 'hash_ids': {len(hashes)} id(s) for input_length {length}, expected "
            f"ceil({length} / {BLOCK_TOKENS}) = {blocks} (one per {BLOCK_TOKENS}-token block)"
        )
    return TraceRecord(
        line=line,
        timestamp_ms=float(ts),
        input_length=length,
        output_length=obj["output_length"],
        hash_ids=tuple(hashes),
    )


def read_mooncake(path: str | os.PathLike[str]) -> list[TraceRecord]:
    """Every request of a Mooncake trace file, in file order; TraceImportError names the line and
    key of the first fault (module docstring)."""
    file = Path(path)
    records: list[TraceRecord] = []
    try:
        handle = file.open(encoding="utf-8")
    except OSError as exc:
        raise TraceImportError(f"{file}: cannot read the trace ({exc.strerror or exc})") from exc
    with handle:
        try:
            for line, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                where = f"{file}, line {line}"
                try:
                    obj = json.loads(text, parse_constant=_reject_constant)
                except ValueError as exc:
                    raise TraceImportError(f"{where}: not valid JSON ({exc})") from exc
                record = _record(obj, line, where)
                if records and record.timestamp_ms < records[-1].timestamp_ms:
                    before = records[-1]
                    raise TraceImportError(
                        f"{where}: key 'timestamp': {obj['timestamp']!r} ms is before line "
                        f"{before.line}'s {before.timestamp_ms:g} ms (timestamps must not decrease)"
                    )
                records.append(record)
        except UnicodeDecodeError as exc:
            raise TraceImportError(f"{file}: not UTF-8 text ({exc.reason})") from exc
    if not records:
        raise TraceImportError(f"{file}: no requests (an empty trace)")
    return records
