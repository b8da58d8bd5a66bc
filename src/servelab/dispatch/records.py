"""What one request is and what happened to it: the records both clients fill in.

`RequestSpec` is a request to send, `RequestRecord` what happened to it (a row of
requests.parquet), `ChunkRecorder` reads a completion stream's bytes into its record, and
`describe_error` is the error text a failed request's record carries. The httpx client
(servelab.dispatch.client) and the paced client (servelab.dispatch.paced) both use them, so they
live here and neither client imports the other's module for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from servelab.dispatch.sse import SSEDecoder

__all__ = ["ERROR_TEXT_MAX", "ChunkRecorder", "RequestRecord", "RequestSpec", "describe_error"]

# Longest error text kept in a record (an HTTP error body can be a whole page).
ERROR_TEXT_MAX = 300


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: identity, prompt (text or token ids) and its output cap."""

    request_id: str
    graph_id: int
    role: str
    warmup: bool
    max_tokens: int
    prompt: str | Sequence[int]


@dataclass
class RequestRecord:
    """What happened to one request (a row of requests.parquet, plus working state)."""

    request_id: str
    graph_id: int
    role: str
    warmup: bool
    max_tokens: int
    scheduled_s: float | None = None
    sent_s: float | None = None  # the dispatcher took it (the logical dispatch time)
    written_s: float | None = None  # its last byte was written to the socket (on the wire)
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int | None] = field(default_factory=list)
    chunk_texts: list[str] | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    status: str = "error"
    error: str | None = None
    finished_s: float | None = None

    def row(self, run_id: str) -> dict[str, Any]:
        return {
            "run_id": run_id,
            "request_id": self.request_id,
            "graph_id": self.graph_id,
            "role": self.role,
            "warmup": self.warmup,
            "scheduled_s": self.scheduled_s,
            "sent_s": self.sent_s,
            "written_s": self.written_s,
            "chunk_times_s": self.chunk_times_s,
            "chunk_tokens": self.chunk_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "max_tokens": self.max_tokens,
            "status": self.status,
            "error": self.error,
        }


def describe_error(exc: BaseException) -> str:
    """`Type: message`, taking the message from the exception's causes when it has none itself
    (httpx.ReadError after a reset says nothing; its cause says "Connection reset by peer")."""
    message = str(exc)
    cause = exc.__cause__ or exc.__context__
    for _ in range(5):  # bounded walk down the cause chain
        if message or cause is None:
            break
        message = str(cause) or (type(cause).__name__ if not isinstance(cause, Exception) else "")
        cause = cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {message or 'connection closed'}"[:ERROR_TEXT_MAX]


class ChunkRecorder:
    """Reads one completion stream's bytes into its record: chunk times, tokens per chunk, usage.

    `feed(raw, now)` takes the bytes as they arrive (any split) and the arrival time; it returns
    False when the stream is unusable (the record's error says why). `end()` when the response
    ended: the request is ok only if the stream ended with `data: [DONE]`. Used by both clients.
    """

    __slots__ = ("_decoder", "_done", "_last_completion", "rec")

    def __init__(self, rec: RequestRecord) -> None:
        self.rec = rec
        self._decoder = SSEDecoder()
        self._last_completion = 0
        self._done = False

    def feed(self, raw: bytes, now: float) -> bool:
        rec = self.rec
        for data in self._decoder.feed(raw):
            if data == b"[DONE]":
                self._done = True
                continue
            if self._done:
                rec.error = "data after [DONE]"
                return False
            try:
                event = orjson.loads(data)  # 0.6 us against json's 2.9 for vLLM's chunk
                choices = event.get("choices") or []
                usage = event.get("usage")
                text = (choices[0].get("text") or "") if choices else ""
                if not isinstance(text, str):
                    raise ValueError("choices[0].text is not a string")
            except (orjson.JSONDecodeError, ValueError, AttributeError, TypeError) as exc:
                rec.error = f"malformed SSE event ({exc}): {data[:120]!r}"
                return False
            tokens: int | None = None
            if usage:
                completion = usage.get("completion_tokens")
                if isinstance(completion, int):
                    # Once a chunk came without usage (counted by its text), a later total also
                    # covers those chunks: it is not this chunk's count. llama-server puts its
                    # only usage on a last chunk with an empty text: llama.cpp 0c1e570 (vendored
                    # in llama-cpp-python 0.3.36), tools/server/server-context.cpp,
                    # send_final_response, and tools/server/server-task.cpp,
                    # server_task_result_cmpl_final::to_json_oaicompat.
                    if rec.chunk_texts is None:
                        tokens = completion - self._last_completion
                    self._last_completion = completion
                    rec.output_tokens = completion
                if isinstance(usage.get("prompt_tokens"), int):
                    rec.prompt_tokens = usage["prompt_tokens"]
            if not choices:
                continue  # a usage-only chunk carries no output
            if tokens is None:
                if not text:
                    continue
                if rec.chunk_texts is None:
                    rec.chunk_texts = [""] * len(rec.chunk_tokens)
                rec.chunk_texts.append(text)
            elif tokens <= 0 and not text:
                continue
            elif rec.chunk_texts is not None:
                rec.chunk_texts.append(text)
            rec.chunk_times_s.append(now)
            rec.chunk_tokens.append(tokens)
        return True

    def end(self) -> None:
        rec = self.rec
        if not self._done:
            rec.error = "stream ended before data: [DONE]" + (
                " (cut mid-event)" if self._decoder.pending else ""
            )
            return
        rec.status = "ok"
        rec.error = None
