"""Named latency metrics, per-request SLOs and goodput (servelab.analysis.slo), on requests built
here: what a one-token response does to a TPOT limit, and why ITL per chunk is not ITL per token
while TPOT is the same (seed 002, Forks 1 and 2)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from servelab.analysis.reduce import reduce_requests
from servelab.analysis.slo import (
    METRIC_DEFINITIONS,
    goodput,
    meets_slo,
    run_metrics_row,
    write_run_metrics,
)
from servelab.analysis.synthetic import RunSpec, write_simple_run
from servelab.artifacts import REQUESTS_SCHEMA
from servelab.grid.settings import RequestSlo


def _table(rows: list[dict]) -> pa.Table:
    cols: dict[str, list] = {f.name: [] for f in REQUESTS_SCHEMA}
    for i, r in enumerate(rows):
        times = r["times"]
        cols["run_id"].append("defaults/vllm/rate-0.12/rep1")
        cols["request_id"].append(f"r{i}")
        cols["graph_id"].append(r.get("graph", i + 1))
        cols["role"].append("worker")
        cols["warmup"].append(False)
        cols["scheduled_s"].append(r.get("sent", 0.0))
        cols["sent_s"].append(r.get("sent", 0.0))
        cols["written_s"].append(r.get("sent", 0.0))
        cols["chunk_times_s"].append(times)
        cols["chunk_tokens"].append(r["tokens"])
        cols["prompt_tokens"].append(100)
        cols["output_tokens"].append(r.get("usage", sum(r["tokens"])))
        cols["max_tokens"].append(128)
        cols["status"].append("ok")
        cols["error"].append(None)
    return pa.Table.from_pydict(cols, schema=REQUESTS_SCHEMA)


def _stream(ttft: float, itl: float, n: int, per_chunk: int) -> dict:
    """n tokens produced every `itl` s after the first, streamed `per_chunk` at a time (the
    first token alone, as engines send it)."""
    token_times = [ttft + i * itl for i in range(n)]
    times, tokens = [token_times[0]], [1]
    for start in range(1, n, per_chunk):
        group = token_times[start : start + per_chunk]
        times.append(group[-1])
        tokens.append(len(group))
    return {"times": times, "tokens": tokens}


def test_stream_interval_changes_itl_per_chunk_but_not_itl_per_token_or_tpot() -> None:
    one = reduce_requests(_table([_stream(0.5, 0.02, 33, 1)]), "one")
    four = reduce_requests(_table([_stream(0.5, 0.02, 33, 4)]), "four")
    assert np.allclose(one.tpot, four.tpot) and np.allclose(one.tpot, 0.02)
    assert np.allclose(one.itl_chunk, 0.02) and one.itl_chunk.size == 32
    assert np.allclose(four.itl_chunk, 0.08) and four.itl_chunk.size == 8  # a chunk is not a token
    assert np.allclose(four.itl_token, 0.02) and np.allclose(one.itl_token, 0.02)
    slo = RequestSlo()
    r1, r4 = run_metrics_row(one, slo), run_metrics_row(four, slo)
    assert r1["itl_chunk_p50_s"] == pytest.approx(0.02) and r4["itl_chunk_p50_s"] == pytest.approx(
        0.08
    )
    assert r1["itl_token_p99_s"] == pytest.approx(r4["itl_token_p99_s"])
    assert r1["tpot_p50_s"] == pytest.approx(r4["tpot_p50_s"])


def test_a_one_token_response_has_no_tpot_and_the_tpot_limit_does_not_apply() -> None:
    req = reduce_requests(
        _table(
            [
                {"times": [1.0], "tokens": [1]},  # one token: TPOT undefined
                _stream(1.0, 0.5, 10, 1),  # TPOT 0.5 s: fails a 0.1 s limit
                _stream(1.0, 0.05, 10, 1),  # TPOT 0.05 s: meets it
            ]
        ),
        "t",
    )
    assert np.isnan(req.tpot[0])
    slo = RequestSlo(ttft_s=2.0, tpot_s=0.1)
    assert meets_slo(req, slo).tolist() == [True, False, True]
    # an E2E limit is what bounds short responses (seed 002): 1.0 s here fails all but none
    assert meets_slo(req, RequestSlo(ttft_s=None, tpot_s=None, e2e_s=0.5)).tolist() == [
        False,
        False,
        False,
    ]
    # a TTFT past its limit fails a one-token response like any other
    late = reduce_requests(_table([{"times": [3.0], "tokens": [1]}]), "late")
    assert meets_slo(late, slo).tolist() == [False]


def test_goodput_is_x_restricted_to_the_requests_meeting_the_slo() -> None:
    # request i sent at i s, its first token 0.2 + 0.5 i s later
    rows = [dict(_stream(i + 0.2 + 0.5 * i, 0.02, 10, 1), sent=float(i)) for i in range(6)]
    req = reduce_requests(_table(rows), "g")
    row = run_metrics_row(req, RequestSlo(ttft_s=1.0, tpot_s=None), exclude_first_graph=False)
    window = (5 + 0.2 + 2.5 + 9 * 0.02) - 0.0  # the last request's last chunk - the first send
    assert row["throughput_rps"] == pytest.approx(6 / window)
    # TTFTs 0.2, 0.7, 1.2, 1.7, 2.2, 2.7: two within 1 s
    assert goodput(req, RequestSlo(ttft_s=1.0, tpot_s=None)) == pytest.approx(2 / window)
    assert row["slo_attainment"] == pytest.approx(2 / 6)
    no_limits = RequestSlo(ttft_s=None, tpot_s=None, e2e_s=None)
    assert goodput(req, no_limits) == pytest.approx(row["throughput_rps"])


def test_the_slo_from_config_keeps_defaults_and_refuses_unknown_keys() -> None:
    assert RequestSlo.from_config(None) == RequestSlo(2.0, 0.1, None)
    assert RequestSlo.from_config({"tpot_s": None, "e2e_s": 20}) == RequestSlo(2.0, None, 20.0)
    with pytest.raises(ValueError, match="ttft_ms"):
        RequestSlo.from_config({"ttft_ms": 500})


def test_run_metrics_csv_names_every_metric_and_writes_its_definitions(tmp_path: Path) -> None:
    dirs = []
    for engine, ttft in (("vllm", 1.5), ("sglang", 0.4)):
        run_dir = tmp_path / "runs" / engine
        write_simple_run(run_dir, RunSpec("defaults", engine, "rate-0.12", "rep1"), [ttft] * 20)
        dirs.append(run_dir)
    out = write_run_metrics(dirs, tmp_path / "run_metrics.csv", slo=RequestSlo())
    rows = list(csv.DictReader(out.open()))
    assert [r["engine"] for r in rows] == ["sglang", "vllm"]  # sorted by run id
    for metric in ("ttft", "tpot", "itl_token", "itl_chunk", "e2e", "normalised"):
        assert f"{metric}_p99_s" in rows[0]
    assert float(rows[0]["goodput_rps"]) <= float(rows[0]["throughput_rps"])
    sidecar = json.loads((tmp_path / "run_metrics.csv.json").read_text())
    assert sidecar["definitions"] == METRIC_DEFINITIONS
    assert sidecar["slo"] == {"ttft_s": 2.0, "tpot_s": 0.1, "e2e_s": None}
    again = write_run_metrics(dirs, tmp_path / "again.csv", slo=RequestSlo())
    assert again.read_bytes() == out.read_bytes()  # re-analysis gives the same bytes
