"""Dispatcher benchmark: schedule lag, client CPU and measured vs true ITL against the live sim server.

Starts `servelab serve-sim --cost-model constant` (fixed TTFT and ITL, unlimited batching, so the
server's true inter-token latency is known) in a separate process, then replays an open-loop trace
of independent requests (uniform spacing at R requests/s, 128-token streams, short token-id prompts)
through servelab's dispatcher, and prints per rate: schedule lag (median, p99, max), the client's
CPU time per wall second, the server's achieved decode-iteration length ("true ITL") and the
measured ITL (per-request mean inter-chunk gap; median and p99 over requests, and the median of
individual gaps). Then searches upward for the highest rate whose measured median ITL stays within
10% of the true ITL: both the median over requests of each request's mean inter-chunk gap and
the median of all individual gaps (which exposes a client that reads its streams in bursts).

Schedule lag at three places, per request, against the time the trace says it is due:
- `lag`: when the dispatcher's pacer took it (run.json's `dispatcher_lag_s`);
- `wire_lag`: when its last byte was written to the socket (run.json's `wire_lag_s`);
- `server_lag`: when the server had read its last byte (the sim server records each request's
  X-Request-Id with time.perf_counter(), the machine's CLOCK_MONOTONIC, which the dispatcher's
  run clock also counts on);
- with `--capture`, `capture_lag`: the kernel's time of the request's packet on the loopback
  interface (dumpcap, read back by tshark; Debian's tshark package), joined by its X-Request-Id.

Beside each rate it measures the machine's own share of the lag, at the same time: the pacer alone
in a process of its own (servelab.dispatch.paced.Pacer at the same rate, doing nothing else) and,
if rt-tests is installed, cyclictest at the same period (the kernel's timer wake-up latency).

Usage: .venv/bin/python benchmarks/dispatcher/bench.py [--rates 20 50] [--duration 20] [--search]
       [--client paced|httpx] [--workers N] [--capture]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from servelab.dispatch.client import CLIENTS, Dispatcher
from servelab.dispatch.pacer import Pacer
from servelab.dispatch.parallel import run_parallel
from servelab.workload.release import TraceRequest

SEARCH_RATES = (20.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0, 500.0, 600.0)


def within(measured: float, true: float, tolerance: float = 0.10) -> bool:
    return abs(measured / true - 1.0) <= tolerance


def start_server(engine: str, itl_ms: float, port: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "servelab.cli",
        "serve-sim",
        "--engine",
        engine,
        "--flags=--model=bench",
        "--port",
        str(port),
        "--cost-model",
        "constant",
        "--constant-itl-ms",
        str(itl_ms),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def count_the(texts: list[str]) -> list[int]:
    """Tokens per chunk: the constant server's text is " the" per token."""
    return [t.count(" the") for t in texts]


def _pacer_alone(rate: float, duration: float, conn) -> None:
    """The pacer by itself in its own process, at the same rate: how late is it with nothing else
    to do? (The machine's own share of the dispatcher's lag.)"""
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    n = max(1, int(rate * duration))
    lates: list[float] = []
    done = threading.Event()

    def send(due: float, key: str) -> None:
        lates.append(clock() - due)
        if len(lates) == n:
            done.set()

    pacer = Pacer(clock, send, on_crash=lambda exc: done.set())
    for i in range(n):
        pacer.push(0.5 + i / rate, str(i))
    pacer.start()
    done.wait(duration + 30.0)
    pacer.stop()
    conn.send(lates)


def _cyclictest(rate: float, duration: float) -> subprocess.Popen | None:
    """rt-tests' cyclictest at the same period, if installed: the kernel's wake-up latency."""
    if shutil.which("cyclictest") is None:
        return None
    return subprocess.Popen(
        [
            "cyclictest",
            "-q",
            "-m",
            "-t",
            "1",
            "-h",
            "20000",
            "-i",
            str(int(1e6 / rate)),
            "-D",
            str(int(duration)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _histogram_quantiles(text: str) -> dict:
    hist = [tuple(map(int, line.split()[:2])) for line in text.splitlines() if line[:1].isdigit()]
    total = sum(c for _, c in hist)
    out: dict = {"samples": total}
    for name, q in (("median", 0.5), ("p99", 0.99)):
        acc = 0
        for us, c in hist:
            acc += c
            if acc >= q * total:
                out[f"{name}_ms"] = us / 1e3
                break
    maxima = [line for line in text.splitlines() if line.startswith("# Max Latencies")]
    if maxima:
        out["max_ms"] = int(maxima[0].split()[-1]) / 1e3
    return out


def _percentiles(name: str, values: list[float]) -> dict:
    if not values:
        return {}
    arr = np.asarray(values) * 1e3
    return {
        f"{name}_median_ms": float(np.median(arr)),
        f"{name}_p99_ms": float(np.percentile(arr, 99)),
        f"{name}_max_ms": float(arr.max()),
    }


def _start_capture(port: int, path: str) -> subprocess.Popen | None:
    """dumpcap on the loopback interface, the server's port only (None if not installed)."""
    if shutil.which("dumpcap") is None:
        return None
    proc = subprocess.Popen(
        ["dumpcap", "-q", "-i", "lo", "-f", f"tcp dst port {port}", "-w", path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # dumpcap opens the interface
    return proc


def _captured_requests(path: str) -> dict[str, float]:
    """X-Request-Id -> the epoch time of the packet that carried the request's headers."""
    out = subprocess.run(
        [
            "tshark",
            "-r",
            path,
            "-Y",
            "http.request",
            "-T",
            "fields",
            "-e",
            "frame.time_epoch",
            "-e",
            "http.request.line",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=|",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        stamp, _, headers = line.partition("\t")
        for header in headers.split("|"):
            name, _, value = header.partition(":")
            if name.strip().lower() == "x-request-id":  # tshark shows the line end as \\r\\n
                found[value.strip().removesuffix("\\r\\n")] = float(stamp)
    return found


def run_rate(
    url: str,
    rate: float,
    duration: float,
    max_tokens: int,
    workers: int = 1,
    client: str = "paced",
    capture: bool = False,
    probes: bool = True,
) -> dict:
    """One run at `rate`. With `probes` (one dispatcher alone), the pacer alone and cyclictest run
    beside it; N dispatchers side by side (`--dispatchers`) run without them."""
    n = int(rate * duration)
    trace = [
        TraceRequest(f"r{i:06d}", i, "planner", i / rate, (), 0.0, max_tokens) for i in range(n)
    ]
    prompts = {r.request_id: list(range(1000, 1032)) for r in trace}
    stats0 = httpx.get(f"{url}/servelab/stats").json()
    options = dict(
        base_url=url,
        model="bench",
        trace=trace,
        prompts=prompts,
        warmup=(),
        request_timeout_s=60,
        pool=max(64, int(rate * 10)),
        progress_interval_s=1e9,
        count_tokens=count_the,
        client=client,
    )
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    probe = ctx.Process(target=_pacer_alone, args=(rate, duration, child), daemon=True)
    if probes:
        probe.start()
    cyclic = _cyclictest(rate, duration) if probes else None
    pcap = f"/tmp/servelab-bench-{os.getpid()}.pcapng"
    dumpcap = _start_capture(int(url.rsplit(":", 1)[1]), pcap) if capture else None
    wall0 = time.perf_counter()
    res = run_parallel(**options, workers=workers) if workers > 1 else Dispatcher(**options).run()
    wall = time.perf_counter() - wall0
    # the run clock on CLOCK_REALTIME (packet times), read back to back once
    real_origin = res.clock_origin_s + (time.time() - time.perf_counter())
    arrivals = httpx.get(f"{url}/servelab/arrivals", timeout=30).json()
    sent = [r for r in res.records if r.sent_s is not None]
    server_lags = [
        arrivals[r.request_id] - res.clock_origin_s - r.scheduled_s
        for r in sent
        if r.request_id in arrivals
    ]
    captured_lags: list[float] = []
    if dumpcap is not None:
        time.sleep(1.0)
        dumpcap.terminate()
        dumpcap.wait(10)
        packets = _captured_requests(pcap)
        Path(pcap).unlink()
        captured_lags = [
            packets[r.request_id] - real_origin - r.scheduled_s
            for r in sent
            if r.request_id in packets
        ]
    alone = np.array(parent.recv() if probes and parent.poll(60) else [np.nan])
    if probes:
        probe.join(10)
    floor_kernel = _histogram_quantiles(cyclic.communicate(timeout=60)[0]) if cyclic else {}
    stats1 = httpx.get(f"{url}/servelab/stats").json()
    true_itl = (stats1["busy_interval_s"] - stats0["busy_interval_s"]) / (
        stats1["busy_intervals"] - stats0["busy_intervals"]
    )
    recs = [r for r in res.records if r.status == "ok"]
    lags = np.array([r.sent_s - r.scheduled_s for r in res.records if r.sent_s is not None])
    per_req = np.array(
        [
            (r.chunk_times_s[-1] - r.chunk_times_s[1]) / (len(r.chunk_times_s) - 2)
            for r in recs
            if len(r.chunk_times_s) > 2
        ]
    )
    gaps = np.concatenate([np.diff(r.chunk_times_s[1:]) for r in recs if len(r.chunk_times_s) > 2])
    return {
        "rate_rps": rate,
        "workers": workers,
        "requests": n,
        "ok": len(recs),
        "lag_median_ms": float(np.median(lags) * 1e3),
        "lag_p99_ms": float(np.percentile(lags, 99) * 1e3),
        "lag_max_ms": float(lags.max() * 1e3),
        **_percentiles("wire_lag", [r.written_s - r.scheduled_s for r in sent if r.written_s]),
        **_percentiles("server_lag", server_lags),
        "server_lag_requests": len(server_lags),
        **_percentiles("capture_lag", captured_lags),
        "capture_lag_requests": len(captured_lags),
        "send_overhead_median_ms": round(res.send_overhead_s["median"] * 1e3, 3),
        "send_overhead_p99_ms": round(res.send_overhead_s["p99"] * 1e3, 3),
        "client_cpu_s": round(res.client_cpu_s, 2),
        "client_cpu_per_wall_s": round(res.client_cpu_s / res.duration_s, 3),
        "client_cpu_us_per_token": round(
            res.client_cpu_s / max(1, sum(len(r.chunk_times_s) for r in recs)) * 1e6, 2
        ),
        "wall_s": round(wall, 1),
        "true_itl_ms": round(true_itl * 1e3, 3),
        "measured_itl_median_ms": round(float(np.median(per_req)) * 1e3, 3),
        "measured_itl_p99_ms": round(float(np.percentile(per_req, 99)) * 1e3, 3),
        "gap_median_ms": round(float(np.median(gaps)) * 1e3, 3),
        "gap_p99_ms": round(float(np.percentile(gaps, 99)) * 1e3, 3),
        "pacer_alone_median_ms": round(float(np.median(alone)) * 1e3, 3),
        "pacer_alone_p99_ms": round(float(np.percentile(alone, 99)) * 1e3, 3),
        "pacer_alone_max_ms": round(float(alone.max()) * 1e3, 3),
        "cyclictest": floor_kernel,
    }


def _one_of_many(
    url: str, rate: float, duration: float, max_tokens: int, client: str, conn
) -> None:
    conn.send(run_rate(url, rate, duration, max_tokens, client=client, probes=False))


def run_side_by_side(urls: list[str], rate: float, duration: float, max_tokens: int, client: str):
    """N dispatchers, each in a process of its own against a server of its own, at `rate` each,
    started together: the campaign's N node slots on one machine (issue 27). One row each."""
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for url in urls:
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_one_of_many, args=(url, rate, duration, max_tokens, client, child)
        )
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    rows = []
    for parent, proc in zip(pipes, procs, strict=True):
        rows.append(parent.recv() if parent.poll(duration + 120) else {"error": "no result"})
        proc.join(10)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--engine", default="vllm", choices=("vllm", "sglang"))
    ap.add_argument("--rates", type=float, nargs="*", default=[20.0, 50.0])
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=1, help="dispatch processes")
    ap.add_argument("--client", default="paced", choices=CLIENTS, help="dispatch.client")
    ap.add_argument("--search", action="store_true", help="find the highest rate within 10%% ITL")
    ap.add_argument("--port", type=int, default=18931)
    ap.add_argument(
        "--dispatchers",
        type=int,
        default=1,
        help="N dispatchers side by side, each against its own server on port, port+1, ...",
    )
    ap.add_argument(
        "--capture", action="store_true", help="also time each request on the wire (dumpcap)"
    )
    args = ap.parse_args()
    print(
        json.dumps(
            {"nproc": os.cpu_count(), "python": sys.version.split()[0], "loadavg": os.getloadavg()}
        )
    )
    if args.dispatchers > 1:
        ports = [args.port + k for k in range(args.dispatchers)]
        servers = [start_server(args.engine, args.itl_ms, port) for port in ports]
        try:
            for rate in args.rates:
                rows = run_side_by_side(
                    [f"http://127.0.0.1:{p}" for p in ports],
                    rate,
                    args.duration,
                    args.max_tokens,
                    args.client,
                )
                for k, row in enumerate(rows):
                    out = {"dispatcher": k, "dispatchers": args.dispatchers, **row}
                    print(json.dumps({**out, "loadavg_1m": os.getloadavg()[0]}), flush=True)
        finally:
            for server in servers:
                server.terminate()
                server.wait(10)
        return
    proc = start_server(args.engine, args.itl_ms, args.port)
    url = f"http://127.0.0.1:{args.port}"
    try:
        for rate in args.rates:
            print(
                json.dumps(
                    {
                        **run_rate(
                            url,
                            rate,
                            args.duration,
                            args.max_tokens,
                            args.workers,
                            args.client,
                            args.capture,
                        ),
                        "loadavg_1m": os.getloadavg()[0],
                    }
                ),
                flush=True,
            )
        if args.search:
            best = None
            for rate in SEARCH_RATES:  # bounded: stops at the first rate that misses
                r = run_rate(
                    url,
                    rate,
                    args.duration,
                    args.max_tokens,
                    args.workers,
                    args.client,
                    args.capture,
                )
                ok = within(r["measured_itl_median_ms"], r["true_itl_ms"]) and within(
                    r["gap_median_ms"], r["true_itl_ms"]
                )
                print(
                    json.dumps({**r, "within_10pct": ok, "loadavg_1m": os.getloadavg()[0]}),
                    flush=True,
                )
                if not ok:
                    break
                best = rate
            print(json.dumps({"highest_rate_within_10pct": best}))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
