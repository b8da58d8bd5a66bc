"""vLLM V1's own split of each run's time to first token, real and predicted: the engine's queue
and prefill times beside the simulated engine's (docs/simulator.md, "The front end on the
engine's own clock").

    .venv/bin/python benchmarks/vllm_request_phases.py --results results \\
        [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml] [--json OUT]

vLLM V1 records three times of every request in histograms on /metrics, which the local
backend's Prometheus keeps (results/deployments/_prometheus/data; the run's scrape.parquet keeps
other series only):
- `vllm:request_queue_time_seconds`: from the engine core putting the request in the scheduler
  to its first schedule (`Scheduler.add_request` records QUEUED, `schedule` SCHEDULED);
- `vllm:request_prefill_time_seconds`: from that schedule to the end of the step that gave its
  first token;
- `vllm:time_to_first_token_seconds`: from the API server's `arrival_time` to the API server
  processing that first token
(vllm/v1/metrics/stats.py, `IterationStats.update_from_output` and
`update_from_finished_request`; vllm/v1/core/sched/scheduler.py; both at 0.32.0). Each run's
increase of every `_sum` and `_count` over its window (run.json's start and end, the window's
last scrape up to 3 s after) gives the run's means. What is left of the client's TTFT, `rest`,
is the API server's work before the engine core holds the request, the wait for the step then
running to end, and the path of the first token back to the client.

The predicted side replays each run on the results folder's `sim_vs_real/platform.json` (or
`--platform`) as the
`predict_run` rule does (benchmarks/sim_vs_real_slowdown.py, `predict_into`), recording when the
simulated engine admits each request (its first `_allocate`) and the end of the step that gives
its first token. A request is held by the scheduler at the first step start at or after it is
ready (`Req.ready_s`: the front end done), or when admitted if earlier (an idle engine takes it
at once). The replay changes nothing the simulator does. Serves the retained TSDB with a
Prometheus of its own on 127.0.0.1 (stopped by its PID), or `--prometheus URL`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_slowdown import add_config_arguments, config_of, platform_file, predict_into

from servelab.analysis.reduce import reduce_requests
from servelab.deploy.processes import free_port
from servelab.sim import vllm as sim_vllm

HISTOGRAMS = {
    "ttft_engine": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
}
AFTER_END_S = 3.0  # the window's closing scrape (1 s interval) is in by then


def client_ttfts(requests_path: Path) -> dict[str, float]:
    """request id -> the client's TTFT (the analysis's: `servelab.analysis.reduce`) of every ok
    trace request with an output chunk."""
    table = pq.read_table(requests_path)
    metrics = reduce_requests(table, str(requests_path))
    ids = table.column("request_id").to_pylist()
    keep = ~metrics.warmup & metrics.ok & (metrics.n_chunks > 0)
    return {ids[i]: float(metrics.ttft[i]) for i in np.flatnonzero(keep)}


def histogram_means(query: Any, start_unix_s: float, end_unix_s: float) -> dict[str, float | None]:
    """Per HISTOGRAMS key, the mean over the window: the increase of `_sum` over that of `_count`
    (None where no request completed the phase). `query(expr, unix_s)` -> a value."""
    out: dict[str, float | None] = {}
    t0, t1 = start_unix_s - 0.5, end_unix_s + AFTER_END_S
    for key, name in HISTOGRAMS.items():
        count = query(f"{name}_count", t1) - query(f"{name}_count", t0)
        total = query(f"{name}_sum", t1) - query(f"{name}_sum", t0)
        out[key] = total / count if count > 0 else None
        out[f"{key}_requests"] = count
    return out


def prometheus_query(url: str) -> Any:
    def query(expr: str, unix_s: float) -> float:
        r = httpx.get(f"{url}/api/v1/query", params={"query": expr, "time": unix_s}, timeout=10)
        r.raise_for_status()
        result = r.json()["data"]["result"]
        return sum(float(x["value"][1]) for x in result)

    return query


@contextlib.contextmanager
def served_tsdb(tsdb: Path) -> Iterator[str]:
    """A Prometheus of its own on a copy of `tsdb` (nothing scraped), stopped by its PID."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("no `prometheus` on PATH (the Debian package); or pass --prometheus URL")
    with tempfile.TemporaryDirectory(prefix="servelab-phases-") as tmp:
        data = Path(tmp) / "data"
        shutil.copytree(tsdb, data)
        config = Path(tmp) / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n", "utf-8")
        port = free_port()
        with (Path(tmp) / "prometheus.log").open("wb") as log:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):  # 20 s at most
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                        break
                if proc.poll() is not None:
                    raise SystemExit(f"prometheus on {tsdb} exited ({proc.returncode})")
                time.sleep(0.2)
            else:
                raise SystemExit(f"prometheus on {tsdb} not ready in 20 s")
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def recording_admissions() -> Iterator[tuple[dict[str, dict[str, float]], list[float]]]:
    """While open, the simulated vLLM records per request its arrival, ready and admission times
    (first `_allocate`, at the start of the step that admits it) and every step's start; the
    originals are restored on exit."""
    marks: dict[str, dict[str, float]] = {}
    starts: list[float] = []
    now = [0.0]
    step, allocate, init = (
        sim_vllm.VllmModel.step,
        sim_vllm.VllmModel._allocate,
        sim_vllm.VllmModel.__init__,
    )

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.track_emitted = True  # the prediction's emitted ids (first-token step ends)

    def recording_step(self: Any, t: float) -> Any:
        now[0] = t
        it = step(self, t)
        starts.append(it.start_s)
        for rid in it.emitted:
            marks.setdefault(rid, {}).setdefault("first_ts", it.end_s)
        return it

    def recording_allocate(self: Any, r: Any) -> None:
        m = marks.setdefault(r.rid, {})
        m.setdefault("admit", now[0])
        m.setdefault("ready", float(r.ready_s))
        allocate(self, r)

    sim_vllm.VllmModel.__init__ = recording_init  # type: ignore[method-assign]
    sim_vllm.VllmModel.step = recording_step  # type: ignore[method-assign]
    sim_vllm.VllmModel._allocate = recording_allocate  # type: ignore[method-assign]
    try:
        yield marks, starts
    finally:
        sim_vllm.VllmModel.__init__ = init  # type: ignore[method-assign]
        sim_vllm.VllmModel.step = step  # type: ignore[method-assign]
        sim_vllm.VllmModel._allocate = allocate  # type: ignore[method-assign]


def predicted_means(
    marks: dict[str, dict[str, float]], starts: list[float], requests_path: Path
) -> dict[str, float | None]:
    """The simulated engine's queue and prefill means (s) over the run's ok trace requests, with
    the engine's definitions, and its client TTFT mean."""
    step_starts = np.array(sorted(starts))
    queue, prefill, ttft = [], [], []
    for rid, first in client_ttfts(requests_path).items():
        m = marks.get(rid, {})
        if not {"admit", "ready", "first_ts"} <= m.keys():
            continue
        i = int(np.searchsorted(step_starts, m["ready"] - 1e-12))
        held = min(float(step_starts[i]) if i < len(step_starts) else m["admit"], m["admit"])
        queue.append(m["admit"] - held)
        prefill.append(m["first_ts"] - m["admit"])
        ttft.append(first)
    if not ttft:
        return {"queue": None, "prefill": None, "ttft_client": None, "requests": 0}
    return {
        "queue": float(np.mean(queue)),
        "prefill": float(np.mean(prefill)),
        "ttft_client": float(np.mean(ttft)),
        "requests": len(ttft),
    }


def with_rest(d: dict[str, Any]) -> dict[str, Any]:
    """`rest`: the client's TTFT mean less the queue and prefill means (ms, rounded)."""
    phases = ("queue", "prefill", "ttft_engine", "ttft_client")
    out = {k: (round(1e3 * v, 3) if k in phases and v is not None else v) for k, v in d.items()}
    if all(d.get(k) is not None for k in ("ttft_client", "queue", "prefill")):
        out["rest"] = round(1e3 * (d["ttft_client"] - d["queue"] - d["prefill"]), 3)
    return out


def ratio_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm and load (rates up to 1 graph/s: "light"; from 2: "loaded"), the median over its
    runs of predicted / real for the prefill time, the rest and the client's TTFT."""
    out: dict[str, Any] = {}
    for row in rows:
        arm, _, condition, _ = row["run"].split("/")
        rate = float(condition.removeprefix("rate-"))
        key = f"{arm}/{'light' if rate <= 1.0 else 'loaded'}"
        for phase in ("prefill", "rest", "ttft_client"):
            a, b = row["real"].get(phase), row["predicted"].get(phase)
            if a and b is not None:
                out.setdefault(key, {}).setdefault(phase, []).append(b / a)
    return {
        key: {phase: round(float(np.median(v)), 3) for phase, v in phases.items()}
        | {"runs": len(next(iter(phases.values())))}
        for key, phases in sorted(out.items())
    }


def vllm_runs(results: Path) -> list[Path]:
    """Every real vLLM V1 run under `results` (one folder a repetition)."""
    return sorted(p.parent for p in (results / "runs").glob("*/vllm_v1/*/rep*/run.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument(
        "--prometheus", help="a Prometheus holding the runs' series (default: serve the TSDB)"
    )
    parser.add_argument("--tsdb", type=Path, help="default RESULTS/deployments/_prometheus/data")
    parser.add_argument(
        "--platform",
        type=Path,
        help="the predictions' platform (default RESULTS/sim_vs_real/platform.json)",
    )
    add_config_arguments(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = config_of(args)
    platform = platform_file(args.results, args.platform)
    runs = vllm_runs(args.results)
    if not runs:
        raise SystemExit(f"no vLLM V1 run under {args.results / 'runs'}")
    with contextlib.ExitStack() as stack:
        url = args.prometheus or stack.enter_context(
            served_tsdb(args.tsdb or args.results / "deployments" / "_prometheus" / "data")
        )
        query = prometheus_query(url)
        rows = []
        for run_dir in runs:
            record = json.loads((run_dir / "run.json").read_text("utf-8"))
            real = histogram_means(query, record["start_unix_s"], record["end_unix_s"])
            ttfts = list(client_ttfts(run_dir / "requests.parquet").values())
            real["ttft_client"] = float(np.mean(ttfts)) if ttfts else None
            name = str(run_dir.relative_to(args.results / "runs"))
            with recording_admissions() as (marks, starts), tempfile.TemporaryDirectory() as tmp:
                predict_into(args.results, config, name, platform, Path(tmp))
                predicted = predicted_means(marks, starts, Path(tmp) / "requests.parquet")
            rows.append({"run": name, "real": with_rest(real), "predicted": with_rest(predicted)})
    print(f"{'run (mean ms)':34s} {'queue':>15s} {'prefill':>15s} {'rest':>15s} {'TTFT':>15s}")
    print(
        f"{'':34s} {'real / pred':>15s} {'real / pred':>15s} {'real / pred':>15s} {'real / pred':>15s}"
    )
    for row in rows:
        cells = []
        for key in ("queue", "prefill", "rest", "ttft_client"):
            a, b = row["real"].get(key), row["predicted"].get(key)
            cells.append(
                f"{a if a is not None else float('nan'):7.1f} {b if b is not None else float('nan'):7.1f}"
            )
        print(f"{row['run']:34s} " + " ".join(f"{c:>15s}" for c in cells))
    summary = ratio_summary(rows)
    print("predicted / real, median over the runs:")
    for key, ratios in summary.items():
        print(f"  {key:18s} " + ", ".join(f"{k} {v:g}" for k, v in ratios.items()))
    if args.json:
        out = {
            "results": str(args.results),
            "platform": str(platform),
            "runs": rows,
            "predicted_over_real": summary,
        }
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", "utf-8")


if __name__ == "__main__":
    main()
