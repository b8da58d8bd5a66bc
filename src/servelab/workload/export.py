"""Export a compiled trace for a peer load generator (docs/workload.md, "Export for peers").

A servelab trace is a set of agent graphs: a request is sent when its predecessors have finished,
plus its tool delay (`servelab.workload.release`). A peer replaying a flat, timestamped trace
cannot wait for a predecessor, so the export **flattens** each dependency into a fixed offset:

    send(r) = arrival_s(r)                                        r has no predecessors
    send(r) = max(send(p) for p in depends_on(r)) + tool_delay_s(r) otherwise

That is the schedule the shared release logic gives when every predecessor finishes the instant it
is sent (zero service time): a worker goes at its graph's arrival plus its tool delay, the
aggregator at the latest of its workers' send times. Under load the real dispatcher sends
dependents later than this (after the predecessor's actual end), so a flattened replay offers
the same requests earlier and more bunched than a servelab dispatch of the same trace.

Formats (`EXPORT_FORMATS`), both read by aiperf (its `--custom-dataset-type`):

- `aiperf-mooncake`: aiperf's `mooncake_trace` JSONL, one object per request:
  `session_id` (the servelab request id), `timestamp` (send time in milliseconds from the trace
  start), `text_input` (the prompt text exactly as compiled, sent verbatim), `output_length` (the
  trace's `max_tokens`) and `extra` (body fields the dispatcher also sends).
- `aiperf-single-turn`: aiperf's `single_turn` JSONL with `session_id`, `timestamp`, `text`,
  `output_length`, `extra`.

`extra` holds `ignore_eos` and `temperature` as the dispatcher's request body has them
(`servelab.dispatch.client.Dispatcher._body`), so the peer asks for exactly `max_tokens` tokens
(with `ignore_eos`) under the same greedy sampling. Rows are in send order (ties in trace order),
timestamps rounded to the microsecond. JSONL has no room for a header, so `export_trace_files`
writes a sidecar `<out>.meta.json` recording the source trace, the format and the flattening
rule. The same trace and options always give the same bytes.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servelab.artifacts import write_json, write_text
from servelab.workload.loader import LoadedTrace, load_trace
from servelab.workload.release import ReleaseTracker, TraceRequest

__all__ = [
    "EXPORT_FORMATS",
    "FLATTENING_RULE",
    "ExportError",
    "export_lines",
    "export_rows",
    "export_trace_files",
    "flattened_send_times",
    "meta_path",
]

EXPORT_FORMATS = ("aiperf-mooncake", "aiperf-single-turn")

FLATTENING_RULE = (
    "send(r) = arrival_s(r) if r has no predecessors, else max(send(p) for p in depends_on(r)) + "
    "tool_delay_s(r): each dependency is replaced by a fixed offset, as if every predecessor "
    "finished the instant it was sent"
)

# Microseconds: aiperf schedules at millisecond accuracy; finer digits only keep ties apart.
_TIMESTAMP_DECIMALS = 3
# The text field of each format (the prompt is sent verbatim, never re-synthesised).
_TEXT_FIELD = {"aiperf-mooncake": "text_input", "aiperf-single-turn": "text"}
# aiperf's --custom-dataset-type value for each format.
_PEER_TYPE = {"aiperf-mooncake": "mooncake_trace", "aiperf-single-turn": "single_turn"}


class ExportError(ValueError):
    """A trace cannot be exported as asked. The message names the format or the request."""


def _check_format(fmt: str) -> None:
    if fmt not in EXPORT_FORMATS:
        raise ExportError(
            f"unknown export format {fmt!r}; choose one of: {', '.join(EXPORT_FORMATS)}"
        )


def flattened_send_times(requests: Sequence[TraceRequest]) -> dict[str, float]:
    """Each request's send time (seconds from the trace start) under `FLATTENING_RULE`.

    Driven through `ReleaseTracker`, the release logic the dispatcher and the simulator use, with
    every request finishing at its own send time, so the export cannot drift from those semantics.
    """
    tracker = ReleaseTracker(requests)
    order = {r.request_id: i for i, r in enumerate(requests)}
    due = [(t, order[rid], rid) for t, rid in tracker.initial()]
    heapq.heapify(due)
    send: dict[str, float] = {}
    while due:
        t, _, rid = heapq.heappop(due)
        send[rid] = t
        for t_dep, dep in tracker.finish(rid, t):
            heapq.heappush(due, (t_dep, order[dep], dep))
    if len(send) != len(requests):
        unsent = sorted(set(order) - set(send))
        raise ExportError(f"requests never released (a dependency cycle?): {', '.join(unsent[:5])}")
    return send


def export_rows(trace: LoadedTrace, fmt: str, *, ignore_eos: bool = True) -> list[dict[str, Any]]:
    """The exported records of `trace` in send order (ties in trace order)."""
    _check_format(fmt)
    send = flattened_send_times(trace.requests)
    order = sorted(
        range(len(trace.requests)), key=lambda i: (send[trace.requests[i].request_id], i)
    )
    text_field = _TEXT_FIELD[fmt]
    rows: list[dict[str, Any]] = []
    for i in order:
        r = trace.requests[i]
        rows.append(
            {
                "session_id": r.request_id,
                "timestamp": round(send[r.request_id] * 1000.0, _TIMESTAMP_DECIMALS),
                text_field: trace.prompts[r.request_id].text,
                "output_length": int(r.max_tokens),
                "extra": {"ignore_eos": bool(ignore_eos), "temperature": 0.0},
            }
        )
    return rows


def export_lines(trace: LoadedTrace, fmt: str, *, ignore_eos: bool = True) -> str:
    """The export file's text: one JSON object per line, keys in a fixed order."""
    rows = export_rows(trace, fmt, ignore_eos=ignore_eos)
    return "".join(
        json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows
    )


def meta_path(out_path: str | os.PathLike[str]) -> Path:
    """The sidecar next to an export: `<out>.meta.json`."""
    out = Path(out_path)
    return out.with_name(out.name + ".meta.json")


def export_meta(trace: LoadedTrace, fmt: str, *, ignore_eos: bool) -> dict[str, Any]:
    """What the sidecar records: the source trace, the format, the flattening rule."""
    manifest: Mapping[str, Any] = trace.manifest
    return {
        "format": fmt,
        "peer_dataset_type": _PEER_TYPE[fmt],
        "source": {
            "condition": manifest["condition"],
            "rep": manifest["rep"],
            "seed": trace.seed,
            "trace_sha256": trace.trace_sha256,
            "tokenizer": manifest["tokenizer"],
            "prompt_tokens": trace.prompt_tokens,
        },
        "n_requests": len(trace.requests),
        "flattening": FLATTENING_RULE,
        "timestamp_unit": "ms from the trace start (servelab's scheduled_s x 1000)",
        "fields": {
            "session_id": "servelab request id",
            _TEXT_FIELD[
                fmt
            ]: "prompt text as compiled (tokenizes to prompt_tokens ids; engines add BOS)",
            "output_length": "max_tokens",
            "extra": {"ignore_eos": bool(ignore_eos), "temperature": 0.0},
        },
        "request_body": (
            "POST /v1/completions with stream true; servelab's dispatcher also asks for "
            "stream_options.include_usage and continuous_usage_stats"
        ),
    }


def export_trace_files(
    *,
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    fmt: str,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """Load (and so validate) a trace, write the export and its sidecar; return the sidecar."""
    _check_format(fmt)
    trace = load_trace(trace_path, manifest_path)
    text = export_lines(trace, fmt, ignore_eos=ignore_eos)
    meta = export_meta(trace, fmt, ignore_eos=ignore_eos)
    write_text(out_path, text)
    write_json(meta_path(out_path), meta)
    return meta
