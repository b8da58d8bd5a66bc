"""The incremental SSE decoder: events survive any split of the byte stream."""

from __future__ import annotations

import pytest

from servelab.dispatch.sse import SSEDecoder

STREAM = b'data: {"a": 1}\n\n: a comment\nevent: message\ndata: {"b":\ndata: 2}\n\ndata: [DONE]\n\n'
EXPECTED = [b'{"a": 1}', b'{"b":\n2}', b"[DONE]"]


def feed_all(decoder: SSEDecoder, parts: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for part in parts:
        out.extend(decoder.feed(part))
    return out


def test_whole_stream() -> None:
    assert feed_all(SSEDecoder(), [STREAM]) == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11])
def test_any_split(size: int) -> None:
    parts = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert feed_all(SSEDecoder(), parts) == EXPECTED


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_crlf_line_ends(size: int) -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    parts = [crlf[i : i + size] for i in range(0, len(crlf), size)]
    assert feed_all(SSEDecoder(), parts) == EXPECTED


def test_data_without_space_and_pending_state() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data:x\n") == []
    assert decoder.pending  # an event is open
    assert decoder.feed(b"\n") == [b"x"]
    assert not decoder.pending
    assert decoder.feed(b'data: {"cut') == []
    assert decoder.pending  # a stream that ends here was cut mid-event
