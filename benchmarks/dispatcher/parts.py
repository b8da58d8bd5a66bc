"""The paced client's parts, one at a time: pacer process start-up, and the event loop's CPU per chunk.

Prints one JSON line per measurement:
- `pacer_startup`: PacerProcess start (spawn the standard-library-only script, load the requests,
  "ready"), median and max of 5, with 10 and with 1,000 requests of 2 KB;
- `httptools_per_chunk_us`: httptools (llhttp) parsing one chunked-encoding HTTP chunk that holds
  one SSE event of vLLM's shape (usage on every chunk) into the paced client's callbacks, as its
  loop does for every read (the recorder's own work left out);
- `h11_per_chunk_us`: h11 parsing the same chunk (the parser the paced client used before, for
  comparison);
- `recorder_per_chunk_us`: servelab's ChunkRecorder (SSE parse, orjson, usage and token
  bookkeeping) on the same event.

Usage: .venv/bin/python benchmarks/dispatcher/parts.py
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time

import h11
import httptools

from servelab.dispatch.pacer import PacerProcess
from servelab.dispatch.records import ChunkRecorder, RequestRecord

EVENT = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":'
    b'[{"index":0,"text":" hello","logprobs":null,"finish_reason":null,"stop_reason":null}],'
    b'"usage":{"prompt_tokens":33,"total_tokens":40,"completion_tokens":7}}\n\n'
)
CHUNKS = 20_000


def pacer_startup(n_requests: int) -> dict:
    address = socket.getaddrinfo("127.0.0.1", 1, type=socket.SOCK_STREAM)[0]
    requests = {f"r{i}": b"x" * 2000 for i in range(n_requests)}
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        pacer = PacerProcess(
            address=address, requests=requests, connect_timeout_s=1.0, keepalive_idle_s=2.0
        )
        times.append(time.perf_counter() - t0)
        pacer.close()
    return {
        "measure": "pacer_startup",
        "requests": n_requests,
        "median_ms": round(statistics.median(times) * 1e3, 1),
        "max_ms": round(max(times) * 1e3, 1),
    }


def h11_per_chunk() -> dict:
    conn = h11.Connection(h11.CLIENT)
    conn.send(
        h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")])
    )
    conn.send(h11.EndOfMessage())
    conn.receive_data(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    assert isinstance(conn.next_event(), h11.Response)
    chunk = b"%x\r\n" % len(EVENT) + EVENT + b"\r\n"
    t0 = time.perf_counter()
    for _ in range(CHUNKS):
        conn.receive_data(chunk)
        while conn.next_event() is not h11.NEED_DATA:
            pass
    return {
        "measure": "h11_per_chunk_us",
        "value": round((time.perf_counter() - t0) / CHUNKS * 1e6, 2),
    }


def httptools_per_chunk() -> dict:
    class Sink:  # the callbacks the paced client's connection gives the parser
        def on_body(self, data: bytes) -> None:
            self.data = data

    parser = httptools.HttpResponseParser(Sink())
    parser.feed_data(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n" % len(EVENT) + EVENT + b"\r\n"
    t0 = time.perf_counter()
    for _ in range(CHUNKS):
        parser.feed_data(chunk)
    return {
        "measure": "httptools_per_chunk_us",
        "value": round((time.perf_counter() - t0) / CHUNKS * 1e6, 2),
    }


def recorder_per_chunk() -> dict:
    recorder = ChunkRecorder(RequestRecord("r", 0, "planner", False, CHUNKS))
    events = [  # cumulative usage, as vLLM sends it
        EVENT.replace(b'"completion_tokens":7', b'"completion_tokens":%d' % (i + 1))
        for i in range(CHUNKS)
    ]
    t0 = time.perf_counter()
    for event in events:
        recorder.feed(event, 0.0)
    assert recorder.rec.chunk_tokens == [1] * CHUNKS  # every event counted as one token
    per = (time.perf_counter() - t0) / CHUNKS
    return {"measure": "recorder_per_chunk_us", "value": round(per * 1e6, 2)}


def main() -> None:
    print(
        json.dumps(
            {"nproc": os.cpu_count(), "python": sys.version.split()[0], "loadavg": os.getloadavg()}
        )
    )
    for n in (10, 1000):
        print(json.dumps(pacer_startup(n)), flush=True)
    print(json.dumps(httptools_per_chunk()), flush=True)
    print(json.dumps(h11_per_chunk()), flush=True)
    print(json.dumps(recorder_per_chunk()), flush=True)


if __name__ == "__main__":
    main()
