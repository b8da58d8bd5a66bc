"""The resolved-configuration gate: a run is measured only if the engine's start-up log CONFIRMS the
chunked-prefill setting its arm expects (docs/architecture.md; study §3.1 Req. 2).

A value the log does not show is not confirmed: the gate refuses it just as it refuses a mismatch.
Every refusal quotes the start-up log line that shows the actual value.
"""

from __future__ import annotations

from servelab.engines.base import ParsedLog

__all__ = ["ResolvedConfigMismatch", "check_resolved"]


class ResolvedConfigMismatch(ValueError):
    """The engine resolved (or its log does not confirm) a configuration other than expected."""


def _quote(parsed: ParsedLog, name: str) -> str:
    line = parsed.evidence.get(name)
    if line is None:
        return "the start-up log shows no line with this value"
    where = parsed.evidence_lines.get(name)
    note = parsed.notes.get(name)
    quoted = f"start-up log line {where}: {line.strip()!r}"
    return f"{quoted} ({note})" if note else quoted


def check_resolved(
    parsed: ParsedLog, *, expect_chunked_prefill: bool, expect_chunk_size: int | None
) -> None:
    """Raise ResolvedConfigMismatch unless `parsed` confirms the expected chunked-prefill setting.

    `expect_chunk_size` is checked only when chunked prefill is expected on (None: any size). The
    message names the engine, the expected and the actual value, and quotes the evidence line.
    """
    if expect_chunk_size is not None and not expect_chunked_prefill:
        raise ValueError(
            f"expect_chunk_size={expect_chunk_size} with expect_chunked_prefill=False: "
            "a chunk size is only meaningful when chunked prefill is expected on"
        )
    engine = parsed.engine
    actual = parsed.chunked_prefill
    if actual is None:
        raise ResolvedConfigMismatch(
            f"{engine}: chunked prefill not confirmed: expected chunked_prefill="
            f"{expect_chunked_prefill}, but the start-up log does not show whether chunked prefill "
            "is on (not shown = not confirmed; the run must not be measured)"
        )
    if actual != expect_chunked_prefill:
        raise ResolvedConfigMismatch(
            f"{engine}: resolved chunked_prefill={actual}, expected {expect_chunked_prefill}; "
            f"{_quote(parsed, 'chunked_prefill')}"
        )
    if expect_chunked_prefill and expect_chunk_size is not None:
        size = parsed.chunk_size
        if size is None:
            raise ResolvedConfigMismatch(
                f"{engine}: chunk size not confirmed: expected chunk_size={expect_chunk_size}, "
                "but the start-up log does not show the chunk size (chunked prefill is on: "
                f"{_quote(parsed, 'chunked_prefill')})"
            )
        if size != expect_chunk_size:
            raise ResolvedConfigMismatch(
                f"{engine}: resolved chunk_size={size}, expected {expect_chunk_size}; "
                f"{_quote(parsed, 'chunk_size')}"
            )
