"""Prometheus pull (telemetry.prometheus): PromQL goldens, the window check, retries.

A small fake Prometheus (stdlib http.server on 127.0.0.1) answers /api/v1/query_range the way the
real HTTP API does (a `matrix` of [unix seconds, "value"] pairs at start + k*step).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from servelab.artifacts import SCRAPE_SCHEMA, read_parquet
from servelab.engines.metrics import METRIC_MAP
from servelab.telemetry import TelemetryWindowError
from servelab.telemetry.canonical import GPU_METRIC_MAP
from servelab.telemetry.prometheus import (
    PrometheusError,
    closing_unix_s,
    gpu_promql_queries,
    promql_queries,
    pull_scrape_files,
    pull_window,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "promql"
START = 1_700_000_000.0


@pytest.mark.parametrize("engine", sorted(METRIC_MAP))
def test_promql_matches_golden(engine: str) -> None:
    queries = promql_queries(engine, {"deployment": "defaults-x", "job": 'a"b'})
    text = "".join(f"{source}\t{query}\n" for source, query in queries.items())
    path = GOLDEN / f"{engine}.txt"
    if os.environ.get("UPDATE_GOLDENS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.fail(f"rewrote {path}; rerun without UPDATE_GOLDENS")
    assert text == path.read_text()
    assert set(queries) == {s for s in METRIC_MAP[engine].values() if s}


def test_gpu_promql_matches_golden() -> None:
    """The engine GPU's DCGM series: one per GPU UUID, restricted by the selector."""
    queries = gpu_promql_queries({"node": "gke-servelab-gpu-pool-1", "job": 'a"b'})
    text = "".join(f"{source}\t{query}\n" for source, query in queries.items())
    path = GOLDEN / "dcgm.txt"
    if os.environ.get("UPDATE_GOLDENS") == "1":
        path.write_text(text)
        pytest.fail(f"rewrote {path}; rerun without UPDATE_GOLDENS")
    assert text == path.read_text()
    assert set(queries) == set(GPU_METRIC_MAP.values())
    with pytest.raises(ValueError, match="selector"):
        gpu_promql_queries({})


def test_promql_refuses_unknown_engine_and_empty_selector() -> None:
    with pytest.raises(ValueError, match="unknown engine"):
        promql_queries("tgi", {"deployment": "x"})
    with pytest.raises(ValueError, match="selector"):
        promql_queries("vllm", {})


Answer = Callable[[str, float, float, float], tuple[int, dict]]


class FakePrometheus:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.calls: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                fake.calls.append(q.get("query", ""))
                status, body = fake.answer(
                    q["query"], float(q["start"]), float(q["end"]), float(q["step"])
                )
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakePrometheus:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def matrix(points: list[tuple[float, float]]) -> tuple[int, dict]:
    values = [[ts, repr(v)] for ts, v in points]
    return 200, {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": {}, "values": values}]},
    }


def full(query: str, start: float, end: float, step: float) -> tuple[int, dict]:
    n = int((end - start) // step) + 1
    value = float(len(query))  # a value that identifies the query
    return matrix([(start + k * step, value) for k in range(n)])


@pytest.fixture
def prom_full() -> Iterator[FakePrometheus]:
    with FakePrometheus(full) as prom:
        yield prom


def pull(url: str, **kwargs) -> object:
    args = dict(
        prometheus_url=url,
        engine="sglang",
        selector={"deployment": "d"},
        run_id="a/sglang/c/rep1",
        start_unix_s=START,
        end_unix_s=START + 60.0,
        step_s=5.0,
    )
    args.update(kwargs)
    return pull_window(**args)


def test_full_window_gives_raw_samples_relative_to_run_start(prom_full: FakePrometheus) -> None:
    table = pull(prom_full.url)
    sources = set(table.column("source_metric").to_pylist())
    assert sources == {s for s in METRIC_MAP["sglang"].values() if s}
    t = sorted(set(table.column("t_s").to_pylist()))
    assert t == [5.0 * k for k in range(13)]  # 0, 5, ..., 60 s from the run start
    queries = promql_queries("sglang", {"deployment": "d"})
    for row in table.to_pylist():
        assert row["value"] == float(len(queries[row["source_metric"]]))
        assert row["run_id"] == "a/sglang/c/rep1"


def test_partial_window_is_an_error() -> None:
    def late_start(query: str, start: float, end: float, step: float) -> tuple[int, dict]:
        return matrix([(start + k * step, 1.0) for k in range(4, 13)])  # first 20 s missing

    with FakePrometheus(late_start) as prom, pytest.raises(TelemetryWindowError, match="covers"):
        pull(prom.url)
    with FakePrometheus(late_start) as prom:  # a run that did not complete keeps what there is
        assert pull(prom.url, require_full_window=False).num_rows > 0


def test_gap_and_missing_series_are_errors() -> None:
    def gap(query: str, start: float, end: float, step: float) -> tuple[int, dict]:
        return matrix([(start + k * step, 1.0) for k in range(13) if not 4 <= k <= 7])

    with FakePrometheus(gap) as prom, pytest.raises(TelemetryWindowError, match="gap"):
        pull(prom.url)

    def one_missing(query: str, start: float, end: float, step: float) -> tuple[int, dict]:
        if "token_usage" in query:
            return 200, {"status": "success", "data": {"resultType": "matrix", "result": []}}
        return full(query, start, end, step)

    with (
        FakePrometheus(one_missing) as prom,
        pytest.raises(TelemetryWindowError, match="sglang:token_usage"),
    ):
        pull(prom.url)


def test_empty_window_is_never_an_empty_table() -> None:
    def empty(query: str, start: float, end: float, step: float) -> tuple[int, dict]:
        return 200, {"status": "success", "data": {"resultType": "matrix", "result": []}}

    with FakePrometheus(empty) as prom, pytest.raises(TelemetryWindowError, match="no samples"):
        pull(prom.url, require_full_window=False)


def test_transient_errors_are_retried_a_bounded_number_of_times() -> None:
    state = {"n": 0}

    def flaky(query: str, start: float, end: float, step: float) -> tuple[int, dict]:
        state["n"] += 1
        if state["n"] % 3 != 0:  # two failures before every success
            return 503, {"status": "error", "error": "busy"}
        return full(query, start, end, step)

    with FakePrometheus(flaky) as prom:
        table = pull(prom.url, retries=2, backoff_s=0.01)
    assert table.num_rows > 0
    assert state["n"] == 3 * 6  # six series, three calls each

    with FakePrometheus(lambda *a: (503, {"status": "error"})) as prom:
        with pytest.raises(PrometheusError, match="no answer after 3 attempts"):
            pull(prom.url, retries=2, backoff_s=0.01)
        assert len(prom.calls) == 3


def test_bad_query_fails_at_once_naming_it() -> None:
    def bad(query: str, start: float, end: float, step: float) -> tuple[int, dict]:
        return 400, {"status": "error", "errorType": "bad_data", "error": "parse error"}

    with FakePrometheus(bad) as prom:
        with pytest.raises(PrometheusError, match="bad_data: parse error"):
            pull(prom.url)
        assert len(prom.calls) == 1


def test_pull_scrape_files_writes_the_raw_schema(prom_full: FakePrometheus, tmp_path: Path) -> None:
    """The window runs on to its closing time: a run ending at 30 s, scraped every 2 s, is pulled
    to 35 s, the first step whose latest scrape came after the end."""
    path = tmp_path / "scrape.parquet"
    pull_scrape_files(
        prometheus_url=prom_full.url,
        engine="vllm",
        selector={"deployment": "d"},
        run_id="r",
        start_unix_s=START,
        end_unix_s=START + 30,
        step_s=5.0,
        scrape_interval_s=2.0,
        scrape_path=path,
    )
    table = read_parquet(path, SCRAPE_SCHEMA)
    assert table.num_rows == 7 * 8  # seven vLLM series, eight steps each: 0 to 35 s
    assert max(table.column("t_s").to_pylist()) == 35.0


@pytest.mark.parametrize(
    ("end", "interval", "closing"),
    [(10.32, 1.0, 12.0), (10.0, 1.0, 11.0), (9.0, 0.0, 9.0), (9.5, 0.0, 10.0), (30.0, 15.0, 45.0)],
)
def test_the_window_closes_a_scrape_interval_after_the_end(
    end: float, interval: float, closing: float
) -> None:
    """The closing time is a point of the step grid (1 s here, from the start) at least one scrape
    interval after the end, so the scrape it sees was taken after the run's last token."""
    got = closing_unix_s(START, START + end, step_s=1.0, scrape_interval_s=interval)
    assert got == pytest.approx(START + closing)
    assert got - START == pytest.approx(round(got - START))  # on the grid


def test_a_window_that_closes_before_its_end_is_refused(prom_full: FakePrometheus) -> None:
    with pytest.raises(ValueError, match="closes at"):
        pull(prom_full.url, until_unix_s=START + 55.0)  # the window ends at 60 s


def _gpu_answer(gpus: int) -> Answer:
    """The engine's series full; each DCGM series for `gpus` GPUs (0: Prometheus has none)."""

    def answer(query: str, start: float, end: float, step: float) -> tuple[int, dict]:
        if "DCGM_" not in query:
            return full(query, start, end, step)
        n = int((end - start) // step) + 1
        result = [
            {
                "metric": {"UUID": f"GPU-{g}"},
                "values": [[start + k * step, repr(1e9 + 1e5 * k)] for k in range(n)],
            }
            for g in range(gpus)
        ]
        return 200, {"status": "success", "data": {"resultType": "matrix", "result": result}}

    return answer


@pytest.mark.parametrize(("gpus", "rows"), [(1, 13), (0, 0), (2, 0)])
def test_the_gpu_series_join_the_scrape_or_are_left_out(
    tmp_path: Path, gpus: int, rows: int
) -> None:
    """One GPU: its DCGM series beside the engine's. None, or a selector matching two GPUs: the
    run's scrape is written without them (logged), never an error and never a sum."""
    path = tmp_path / "scrape.parquet"
    with FakePrometheus(_gpu_answer(gpus)) as prom:
        pull_scrape_files(
            prometheus_url=prom.url,
            engine="sglang",
            selector={"deployment": "d"},
            run_id="a/sglang/c/rep1",
            start_unix_s=START,
            end_unix_s=START + 60.0,
            step_s=5.0,
            scrape_interval_s=0.0,
            scrape_path=path,
            gpu_selector={"node": "gke-n1"},
        )
        gpu_queries = [q for q in prom.calls if "DCGM_" in q]
    assert sorted(gpu_queries) == sorted(gpu_promql_queries({"node": "gke-n1"}).values())
    sources = read_parquet(path, SCRAPE_SCHEMA).column("source_metric").to_pylist()
    for source in GPU_METRIC_MAP.values():
        assert sources.count(source) == rows
    assert {s for s in METRIC_MAP["sglang"].values() if s} <= set(sources)


def test_no_gpu_selector_pulls_no_gpu_series(prom_full: FakePrometheus, tmp_path: Path) -> None:
    """The local backend (and a kubernetes config with gpu_metrics_selector {}): engine only."""
    pull_scrape_files(
        prometheus_url=prom_full.url,
        engine="vllm",
        selector={"deployment": "d"},
        run_id="r",
        start_unix_s=START,
        end_unix_s=START + 30,
        step_s=5.0,
        scrape_interval_s=1.0,
        scrape_path=tmp_path / "scrape.parquet",
        gpu_selector={},
    )
    assert not [q for q in prom_full.calls if "DCGM_" in q]
