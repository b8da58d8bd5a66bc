"""The HTTP side of the live sim server (`servelab.sim.server`): requests in, answers out, faults.

HTTP is HTTP/1.1 over asyncio streams with h11 doing the protocol (keep-alive, chunked transfer
encoding); no web framework. This module reads one request off a connection (`read_request`),
writes plain and JSON responses (`respond`, `respond_json`), parses a `/v1/completions` request
(`parse_completion`) and words its answers in the engine's OpenAI dialect
(`servelab.engines.spec.OpenAIDialect`, one per engine in the registry): the streamed SSE chunks,
the usage chunk, the whole JSON answer and the /v1/models card (`OpenAIAnswers`).

Fault injection: crash at a time, HTTP 500 with a probability, a stalled engine from a time on, a
malformed SSE chunk or a connection reset with a probability (`FaultConfig`). Each probabilistic
decision is a pure function of (seed, request index, kind) (`fault_decision`), so the number of
faulted requests among N is exact whatever their order. The server schedules the timed ones; the
malformed chunk and the reset happen here, in `OpenAIAnswers.deliver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import h11

from servelab.engines.spec import OpenAIDialect

__all__ = [
    "MAX_BODY",
    "CompletionRequest",
    "FaultConfig",
    "HttpError",
    "OpenAIAnswers",
    "Stream",
    "fault_decision",
    "parse_completion",
    "read_request",
    "reset_connection",
    "respond",
    "respond_json",
]

MAX_BODY = 64 * 1024 * 1024
_SERVER_HEADER = b"uvicorn"  # both engines' OpenAI servers run on uvicorn


# --------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class FaultConfig:
    """Injected faults. Times are seconds from server start; rates are per completion request."""

    crash_at_s: float | None = None
    http500_rate: float = 0.0
    stall_at_s: float | None = None
    malformed_rate: float = 0.0
    reset_rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("http500_rate", "malformed_rate", "reset_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"fault {name} must be within [0, 1], got {value}")
        for name in ("crash_at_s", "stall_at_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"fault {name} must be >= 0, got {value}")


def fault_decision(seed: int, index: int, kind: str, rate: float) -> bool:
    """Whether the `index`-th completion request (from 0) suffers fault `kind` at `rate`.

    A pure function of its arguments (a SHA-256 draw), so tests can count faults exactly.
    """
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    digest = hashlib.sha256(f"{seed}:{index}:{kind}".encode()).digest()
    draw = int.from_bytes(digest[:8], "big") / 2.0**64
    return draw < rate


def reset_connection(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a TCP RST (SO_LINGER 0), like a crashed process's sockets."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# --------------------------------------------------------------------------- requests in


class HttpError(Exception):
    """A request answered with an OpenAI-style error (`error_body`) and HTTP `status`."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def error_body(self) -> dict[str, Any]:
        return {"object": "error", "message": self.message, "type": self.kind, "code": self.status}


async def read_request(
    conn: h11.Connection, reader: asyncio.StreamReader
) -> tuple[h11.Request | None, bytes]:
    """The next request on a connection and its whole body; (None, b"") when the client left."""
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            conn.receive_data(data)
            if not data and request is None:
                return None, b""
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise h11.RemoteProtocolError("request body too large")
        elif isinstance(event, h11.EndOfMessage):
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            return None, b""


@dataclass(frozen=True)
class CompletionRequest:
    """A parsed `/v1/completions` request, its usage options resolved by the engine's dialect."""

    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool


def _prompt_ids(payload: dict[str, Any], tokenize: Callable[[str], list[int]] | None) -> list[int]:
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if tokenize is None:
            raise HttpError(400, "this server accepts prompts as token ids only (no tokenizer)")
        return tokenize(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return [int(t) for t in prompt]
    raise HttpError(400, "'prompt' must be a string or a non-empty list of token ids")


def parse_completion(
    body: bytes,
    *,
    dialect: OpenAIDialect,
    tokenize: Callable[[str], list[int]] | None,
    max_model_len: int | None,
) -> CompletionRequest:
    """Parse a `/v1/completions` body; HttpError(400) names what is wrong with it."""
    try:
        payload = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise HttpError(400, "request body must be a JSON object")
    ids = _prompt_ids(payload, tokenize)
    max_tokens = payload.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise HttpError(400, f"'max_tokens' must be a positive integer, got {max_tokens!r}")
    if max_model_len is not None and len(ids) + max_tokens > max_model_len:
        raise HttpError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
        )
    stream = bool(payload.get("stream", False))
    options = payload.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise HttpError(400, "'stream_options' must be an object")
        if not stream and dialect.stream_options_need_stream:
            raise HttpError(400, "Stream options can only be defined when `stream=True`.")
    options = options or {}
    include_usage = (
        bool(options.get("include_usage", dialect.usage_by_default)) if options else False
    )
    continuous = (
        dialect.continuous_usage
        and include_usage
        and bool(options.get("continuous_usage_stats", True))
    )
    return CompletionRequest(ids, max_tokens, stream, include_usage, continuous)


# --------------------------------------------------------------------------- answers out


def _headers(
    instance_id: str, content_type: bytes, extra: Sequence[tuple[bytes, bytes]] = ()
) -> list[tuple[bytes, bytes]]:
    return [
        (b"server", _SERVER_HEADER),
        (b"content-type", content_type),
        (b"x-servelab-instance", instance_id.encode()),
        *extra,
    ]


def start_stream(conn: h11.Connection, writer: asyncio.StreamWriter, instance_id: str) -> None:
    """Send the head of a 200 SSE response (its chunks follow as they are produced)."""
    headers = _headers(instance_id, b"text/event-stream; charset=utf-8")
    writer.write(conn.send(h11.Response(status_code=200, headers=headers)))


def respond(
    conn: h11.Connection,
    writer: asyncio.StreamWriter,
    instance_id: str,
    status: int,
    body: bytes,
    content_type: bytes,
) -> None:
    """Send a whole response with a content length."""
    headers = _headers(instance_id, content_type, [(b"content-length", str(len(body)).encode())])
    data = conn.send(h11.Response(status_code=status, headers=headers))
    data += conn.send(h11.Data(data=body)) if body else b""
    data += conn.send(h11.EndOfMessage())
    writer.write(data)


def respond_json(
    conn: h11.Connection, writer: asyncio.StreamWriter, instance_id: str, status: int, obj: Any
) -> None:
    respond(conn, writer, instance_id, status, json.dumps(obj).encode(), b"application/json")


@dataclass
class Stream:
    """One in-flight completion: its connection, options and progress."""

    req_id: str
    conn: h11.Connection
    writer: asyncio.StreamWriter
    stream: bool
    include_usage: bool
    continuous_usage: bool
    prompt_tokens: int
    max_tokens: int
    created: int
    malformed: bool = False
    reset: bool = False
    generated: int = 0
    pending: int = 0
    chunks_sent: int = 0
    done: asyncio.Future[None] | None = None
    error: str | None = None
    text_parts: list[str] = field(default_factory=list)


def new_request_id(dialect: OpenAIDialect) -> str:
    """A completion's id as the engine names it."""
    return f"{dialect.request_id_prefix}{uuid.uuid4().hex}"


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class OpenAIAnswers:
    """A server's answers in its engine's OpenAI dialect: streamed chunks of `stream_interval`
    tokens of `token_text` each, the usage chunk, the whole JSON answer, the /v1/models list."""

    def __init__(
        self,
        dialect: OpenAIDialect,
        *,
        served_model_name: str,
        token_text: str,
        stream_interval: int,
    ) -> None:
        self.dialect = dialect
        self.served_model_name = served_model_name
        self.token_text = token_text
        self.stream_interval = stream_interval

    def models(self, *, created: int, owned_by: str, max_model_len: int | None) -> dict[str, Any]:
        card: dict[str, Any] = {
            "id": self.served_model_name,
            "object": "model",
            "created": created,
            "owned_by": owned_by,
            "root": self.served_model_name,
        }
        if self.dialect.models_max_model_len:
            card["max_model_len"] = max_model_len
        return {"object": "list", "data": [card]}

    def deliver(self, st: Stream, n_tokens: int, finished: bool) -> bool:
        """Deliver `n_tokens` new tokens (and the end, if `finished`) to one stream, with its
        injected faults. True when the stream's connection was reset (the request is over)."""
        st.generated += n_tokens
        if not st.stream:
            if finished and st.done is not None and not st.done.done():
                st.done.set_result(None)
            return False
        st.pending += n_tokens
        if st.pending < self.stream_interval and not finished:
            return False
        if st.writer.is_closing():
            return False
        data = self.chunk(st, st.pending, finished)
        st.pending = 0
        st.chunks_sent += 1
        if st.malformed and st.chunks_sent == min(2, st.max_tokens):
            data = b'data: {"id": "' + st.req_id.encode() + b'", "choices": [{"text": \n\n'
        if finished:
            if st.include_usage:
                data += self.usage_chunk(st)
            data += b"data: [DONE]\n\n"
        out = st.conn.send(h11.Data(data=data))
        if finished:
            out += st.conn.send(h11.EndOfMessage())
        st.writer.write(out)
        if st.reset and st.chunks_sent >= min(2, st.max_tokens):
            reset_connection(st.writer)
            st.error = "reset"
            if st.done is not None and not st.done.done():
                st.done.set_result(None)
            return True
        if finished and st.done is not None and not st.done.done():
            st.done.set_result(None)
        return False

    @staticmethod
    def usage(st: Stream) -> dict[str, int]:
        return {
            "prompt_tokens": st.prompt_tokens,
            "total_tokens": st.prompt_tokens + st.generated,
            "completion_tokens": st.generated,
        }

    def chunk(self, st: Stream, n_tokens: int, finished: bool) -> bytes:
        """One SSE chunk of `n_tokens` tokens."""
        choice = {
            "index": 0,
            "text": self.token_text * n_tokens,
            "logprobs": None,
            "finish_reason": "length" if finished else self.dialect.unfinished_finish_reason,
            self.dialect.stop_field: None,
        }
        obj: dict[str, Any] = {
            "id": st.req_id,
            "object": "text_completion",
            "created": st.created,
            "model": self.served_model_name,
            "choices": [choice],
            "usage": self.usage(st) if st.continuous_usage else None,
        }
        return _sse(obj)

    def usage_chunk(self, st: Stream) -> bytes:
        """The usage-only chunk that ends a stream asked for usage."""
        ident = uuid.uuid4().hex if self.dialect.usage_chunk_own_id else st.req_id
        obj = {
            "id": ident,
            "object": "text_completion",
            "created": st.created,
            "model": self.served_model_name,
            "choices": [],
            "usage": self.usage(st),
        }
        return _sse(obj)

    def full_response(self, st: Stream) -> dict[str, Any]:
        """The whole answer of a request that did not stream."""
        return {
            "id": st.req_id,
            "object": "text_completion",
            "created": st.created,
            "model": self.served_model_name,
            "choices": [
                {
                    "index": 0,
                    "text": self.token_text * st.generated,
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": self.usage(st),
        }
