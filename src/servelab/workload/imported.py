"""Imported traces: a public production trace replayed as a servelab trace (docs/workload.md,
"Imported traces").

A production trace gives each request an arrival time, its prompt and output lengths and, for its
prompt, one hash id per block of tokens (Mooncake: `servelab.workload.mooncake`, 512-token
blocks). This module turns such records into servelab's own compiled trace (TRACE_SCHEMA and its
manifest), so the dispatcher, the simulator and the analysis run it unchanged:

- **Prompts from blocks.** Each distinct hash id becomes one block of tokens, drawn from the
  round-trip-safe subset of the tokenizer (as the compiler's prompts: `servelab.workload.prompts`)
  by a generator of its own, keyed by the trace seed and the hash id (stream "blocks",
  `streams.keyed_substream`). A prompt is the concatenation of its hash ids' blocks, the last one
  cut to the prompt's length. The same hash id is therefore the same tokens in every request that
  has it, and different ids are different draws: the prefix sharing the trace records is
  reproduced token for token. Every block's first token is drawn from the even positions of the
  subset, as every trace prompt's first token is, so a warm-up prompt (odd positions) can never
  share a first token with a trace prompt. Every prompt is encoded by the tokenizer and compared
  with its ids; one that does not give them back is an error naming the request and its line.
- **The seed.** Blocks are keyed by the trace seed, which depends on (campaign seed, condition,
  rep): two repetitions, or two conditions, replay the same sharing structure with different
  tokens, so no run can hit blocks a previous run of the same deployment left in its cache.
- **No graphs.** Such traces record no dependencies between requests. Every request is its own
  one-request agent graph: role planner, no predecessors, no tool delay, sent at its arrival
  whatever the engine does (open loop). Its output cap (`max_tokens`) is the trace's
  `output_length`.
- **Time.** The replay keeps the trace's arrival pattern and scales its clock by one factor,
  time_scale = source rate / rate, the source rate being the requests per second of the whole
  (kept) trace, (n - 1) / (last - first timestamp). It starts at source time `start_s`
  (arrival 0) and keeps every request that arrives before `duration_s`. Without a rate the clock
  is the trace's own (time_scale 1).
- **Accounting.** A row's `prefix_tokens` is the longest prefix its prompt shares with any earlier
  prompt (`validate.shared_with_earlier`), the manifest's `achieved_sharing` the mean share; the
  manifest also records `imported.recorded_sharing`, the same measured on the hash ids (whole
  blocks, and a shared last block up to the shorter one), which the token ids meet or exceed (by
  chance, a first token of two different blocks may coincide).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from servelab import __version__
from servelab.artifacts import TRACE_SCHEMA, file_sha256
from servelab.grid.config import Condition, TraceSource
from servelab.workload.mooncake import (
    BLOCK_TOKENS,
    REFERENCE,
    TraceImportError,
    TraceRecord,
    read_mooncake,
)
from servelab.workload.prompts import TRACE_PARITY, PromptError, draw_positions
from servelab.workload.streams import keyed_substream
from servelab.workload.tokenizer import (
    DEFAULT_TOKENIZER,
    encode_batch,
    load_tokenizer,
    safe_vocabulary,
)
from servelab.workload.topology import request_id
from servelab.workload.validate import (
    TokenColumn,
    measure_sharing,
    prefix_ids_sha256,
    shared_with_earlier,
)

__all__ = [
    "IMPORT_FORMATS",
    "ImportFormat",
    "TraceImportError",
    "TraceWindow",
    "import_condition",
    "import_trace",
    "recorded_shared_tokens",
]

# Encode at most this many tokens per tokenizer batch.
_BATCH_TOKENS = 1 << 20

_GRAPHS_NOTE = (
    "none recorded: every request is its own one-request graph (role planner, no dependencies, "
    "no tool delay), sent at its arrival whatever the engine does (open loop)"
)


@dataclass(frozen=True)
class ImportFormat:
    """A trace format servelab imports: its reader, its block size, where it is defined."""

    read: Callable[[Path], list[TraceRecord]]
    block_tokens: int
    reference: str


IMPORT_FORMATS: dict[str, ImportFormat] = {
    "mooncake": ImportFormat(read=read_mooncake, block_tokens=BLOCK_TOKENS, reference=REFERENCE),
}


@dataclass(frozen=True)
class TraceWindow:
    """What part of a trace is replayed and how fast (module docstring, "Time").

    `rate`: requests per second of the replay (None: the trace's own clock); `duration_s`: the
    replay's length (None: up to the trace's last request); `start_s`: the source time, in seconds
    of the trace's own timestamps, that becomes arrival 0; `max_request_tokens`: requests whose
    prompt plus output tokens exceed it are dropped before anything else (None: none)."""

    rate: float | None = None
    duration_s: float | None = None
    start_s: float = 0.0
    max_request_tokens: int | None = None


def _positive(value: float | None, name: str, where: str) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise TraceImportError(f"{where}: {name} must be a positive number, got {value!r}")


def _select(
    records: Sequence[TraceRecord], window: TraceWindow, where: str
) -> tuple[list[TraceRecord], np.ndarray, dict[str, Any]]:
    """The records the window replays, their arrival times, and how they were chosen."""
    _positive(window.rate, "rate", where)
    _positive(window.duration_s, "duration_s", where)
    if not (math.isfinite(window.start_s) and window.start_s >= 0):
        raise TraceImportError(f"{where}: start_s must be >= 0, got {window.start_s!r}")
    limit = window.max_request_tokens
    kept = [r for r in records if limit is None or r.input_length + r.output_length <= limit]
    if not kept:
        raise TraceImportError(
            f"{where}: no request has at most max_request_tokens={limit} prompt plus output tokens"
        )
    times = np.asarray([r.timestamp_ms for r in kept], dtype=np.float64)
    span_s = float(times[-1] - times[0]) / 1000.0
    source_rate = (len(kept) - 1) / span_s if span_s > 0 else None
    if window.rate is None:
        scale, rate = 1.0, source_rate
    elif source_rate is None:
        raise TraceImportError(
            f"{where}: the trace's requests all arrive at one time, so it has no rate to scale "
            f"to {window.rate} requests/s"
        )
    else:
        scale, rate = source_rate / window.rate, window.rate
    start_ms = window.start_s * 1000.0
    arrivals = (times - start_ms) / 1000.0 * scale
    inside = arrivals >= 0
    duration_s = window.duration_s
    if duration_s is None:
        # up to the last request, and one mean gap beyond it (as a renewal process's window)
        last = float(arrivals[-1]) if inside.any() else 0.0
        duration_s = last + (1.0 / rate if rate else 1.0)
    inside &= arrivals < duration_s
    chosen = np.flatnonzero(inside)
    if chosen.size == 0:
        raise TraceImportError(
            f"{where}: no request arrives in the replay window (source time from {window.start_s} s, "
            f"{duration_s} s of replay at time scale {scale:.6g})"
        )
    selected = [kept[i] for i in chosen]
    if rate is None:  # one request, or all at one time: the replay's own rate
        rate = chosen.size / duration_s
    how = {
        "records": len(records),
        "kept_records": len(kept),
        "max_request_tokens": limit,
        "dropped_over_length": len(records) - len(kept),
        "source_rate_rps": source_rate,
        "start_s": float(window.start_s),
        "time_scale": scale,
        "first_line": selected[0].line,
        "last_line": selected[-1].line,
    }
    return selected, arrivals[chosen], {"rate": rate, "duration_s": float(duration_s), **how}


def recorded_shared_tokens(records: Sequence[TraceRecord], block_tokens: int) -> np.ndarray:
    """Per record, in order, the prompt tokens the hash ids say it shares with an earlier record:
    the longest run of leading ids equal to an earlier record's, counted in tokens (each whole
    block, and a last block up to the shorter of the two)."""
    children: dict[tuple[int, int], int] = {}
    longest: list[int] = [0]  # per trie node: the longest block an earlier record had there
    out = np.zeros(len(records), dtype=np.int64)
    for i, rec in enumerate(records):
        node, shared, walking = 0, 0, True
        last = len(rec.hash_ids) - 1
        for j, h in enumerate(rec.hash_ids):
            size = block_tokens if j < last else rec.input_length - block_tokens * last
            child = children.get((node, h))
            if walking and child is not None:
                shared += min(size, longest[child])
                walking = longest[child] >= size
            else:
                walking = False
            if child is None:
                child = len(longest)
                children[(node, h)] = child
                longest.append(0)
            longest[child] = max(longest[child], size)
            node = child
        out[i] = shared
    return out


def _blocks(seed: int, hash_ids: Sequence[int], block_tokens: int, m: int) -> dict[int, np.ndarray]:
    """Each distinct hash id's block: `block_tokens` positions into the safe subset, from the
    generator of (seed, "blocks", hash id); the first from the even positions."""
    return {
        h: draw_positions(keyed_substream(seed, "blocks", h), 1, block_tokens, m, TRACE_PARITY)[0]
        for h in sorted(set(hash_ids))
    }


def _verify(tokenizer: str, texts: list[str], ids: list[np.ndarray], names: list[str]) -> None:
    tok = load_tokenizer(tokenizer)
    start = 0
    while start < len(texts):
        stop, size = start, 0
        while stop < len(texts) and (stop == start or size + ids[stop].size <= _BATCH_TOKENS):
            size += ids[stop].size
            stop += 1
        for k, got in enumerate(encode_batch(tok, texts[start:stop])):
            r = start + k
            if not np.array_equal(np.asarray(got, dtype=np.int64), ids[r]):
                raise PromptError(
                    f"tokenizer {tokenizer!r}: the prompt of {names[r]} does not encode back to "
                    "exactly its ids"
                )
        start = stop


def import_trace(
    records: Sequence[TraceRecord],
    *,
    fmt: str,
    source: Mapping[str, Any],
    window: TraceWindow,
    condition: str,
    rep: str,
    seed: int,
    tokenizer: str = DEFAULT_TOKENIZER,
) -> tuple[pa.Table, dict[str, Any]]:
    """The servelab trace of `records` (module docstring): (TRACE_SCHEMA table, manifest without
    `checks` and `trace_sha256`). `source` is recorded in the manifest (its file and SHA-256)."""
    if fmt not in IMPORT_FORMATS:
        raise TraceImportError(
            f"unknown trace format {fmt!r}; servelab imports {', '.join(IMPORT_FORMATS)}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    spec = IMPORT_FORMATS[fmt]
    where = str(source.get("path", "trace"))
    selected, arrivals, how = _select(records, window, where)
    n = len(selected)
    gw = max(5, len(str(max(n - 1, 0))))
    ids = [request_id(g, "planner", graph_width=gw) for g in range(n)]
    lines = {rid: rec.line for rid, rec in zip(ids, selected, strict=True)}

    vocab = safe_vocabulary(tokenizer)
    b = spec.block_tokens
    blocks = _blocks(seed, [h for rec in selected for h in rec.hash_ids], b, len(vocab))
    positions = [
        np.concatenate([blocks[h] for h in rec.hash_ids])[: rec.input_length] for rec in selected
    ]
    token_ids = [vocab.ids[p].astype(np.int64) for p in positions]
    texts = [vocab.join(p) for p in positions]
    _verify(tokenizer, texts, token_ids, [f"request {rid} (line {lines[rid]})" for rid in ids])

    lengths = np.asarray([rec.input_length for rec in selected], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise TraceImportError(
            f"{where}: {int(offsets[-1])} prompt tokens exceed one Parquet list column (2^31 ids)"
        )
    flat = np.concatenate(token_ids).astype(np.int32)
    prompt_column = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(flat, type=pa.int32())
    )
    tokens = TokenColumn(pa.table({"prompt_token_ids": prompt_column}))
    shared = shared_with_earlier(tokens)
    common = measure_sharing(tokens, np.zeros(n, dtype=np.int64))[0] if n > 1 else 0
    prefix_ids = token_ids[0][:common]
    prefix_text = vocab.join(positions[0][:common])
    table = pa.table(
        {
            "request_id": pa.array(ids, type=pa.string()),
            "graph_id": pa.array(np.arange(n, dtype=np.int32), type=pa.int32()),
            "role": pa.array(["planner"] * n, type=pa.string()),
            "arrival_s": pa.array(arrivals, type=pa.float64()),
            "depends_on": pa.array([[] for _ in range(n)], type=pa.list_(pa.string())),
            "tool_delay_s": pa.array(np.zeros(n), type=pa.float64()),
            "prompt_token_ids": prompt_column,
            "prompt_text": pa.array(texts, type=pa.string()),
            "prefix_tokens": pa.array(shared.astype(np.int32), type=pa.int32()),
            "max_tokens": pa.array(
                np.asarray([rec.output_length for rec in selected], dtype=np.int32),
                type=pa.int32(),
            ),
        },
        schema=TRACE_SCHEMA,
    )
    achieved = float(np.mean(shared / lengths))
    recorded = recorded_shared_tokens(selected, b)
    rate = how.pop("rate")
    duration_s = how.pop("duration_s")
    manifest: dict[str, Any] = {
        "condition": condition,
        "rep": rep,
        "seed": seed,
        "rate": rate,
        "sharing": achieved,
        "prompt_tokens": round(float(lengths.mean())),
        "duration_s": duration_s,
        "tokenizer": tokenizer,
        "prefix_text": prefix_text,
        "prefix_sha256": hashlib.sha256(prefix_text.encode("utf-8")).hexdigest(),
        "prefix_ids_sha256": prefix_ids_sha256(prefix_ids),
        "prefix_tokens": int(common),
        "achieved_sharing": achieved,
        "n_graphs": n,
        "n_requests": n,
        "requests_per_graph": 1,
        "offered_load_rps": rate,
        "imported": {
            "format": fmt,
            **dict(source),
            "reference": spec.reference,
            "block_tokens": b,
            **how,
            "distinct_blocks": len(blocks),
            "recorded_sharing": float(np.mean(recorded / lengths)),
            "prompt_tokens": {
                "min": int(lengths.min()),
                "mean": float(lengths.mean()),
                "max": int(lengths.max()),
            },
            "graphs": _GRAPHS_NOTE,
        },
        "vocabulary": {
            "rule": "non-special ids decoding to ' ' + ASCII letters that encode back to exactly [id]",
            "subset_size": len(vocab),
            "vocab_size": vocab.vocab_size,
            "subset_sha256": vocab.sha256,
        },
        "verification": {
            "method": "every full prompt encoded by the tokenizer (add_special_tokens=False) and compared",
            "prompts_encoded": n,
            "segments_redrawn": 0,
        },
        "engine_prompt_tokens": "length + 1: the engines prepend BOS to each prompt's tokens",
        "servelab_version": __version__,
    }
    return table, manifest


def _source(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise TraceImportError(f"{path}: no such trace file")
    return {"path": str(path), "sha256": file_sha256(path)}


def read_records(fmt: str, path: str | Path) -> tuple[list[TraceRecord], dict[str, Any]]:
    """The records of a trace file of format `fmt`, and its `source` record (path, SHA-256)."""
    if fmt not in IMPORT_FORMATS:
        raise TraceImportError(
            f"unknown trace format {fmt!r}; servelab imports {', '.join(IMPORT_FORMATS)}"
        )
    file = Path(path)
    source = _source(file)
    return IMPORT_FORMATS[fmt].read(file), source


def import_condition(
    *, condition: Condition, rep: str, seed: int, tokenizer: str
) -> tuple[pa.Table, dict[str, Any]]:
    """The trace of a condition that replays an imported trace (config `conditions[].trace`): its
    rate and duration_s set the window, its `trace` the file, start and length limit."""
    trace: TraceSource | None = condition.trace
    if trace is None:
        raise ValueError(f"condition {condition.id} has no imported trace")
    records, source = read_records(trace.format, trace.path)
    window = TraceWindow(
        rate=float(condition.rate),
        duration_s=float(condition.duration_s),
        start_s=float(trace.start_s),
        max_request_tokens=trace.max_request_tokens,
    )
    return import_trace(
        records,
        fmt=trace.format,
        source=source,
        window=window,
        condition=condition.id,
        rep=rep,
        seed=seed,
        tokenizer=tokenizer,
    )
