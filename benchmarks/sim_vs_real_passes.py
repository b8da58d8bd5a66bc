"""Engine passes, real against predicted (issue 26; docs/simulator.md, "Against the real engines").

The client sees an engine iteration only as a burst of tokens. The engines count their own passes,
and the local backend's Prometheus keeps every series they export, beyond the canonical ones a run
pulls. This reads each real run's window from that Prometheus:
- llama-server: `llamacpp:n_decode_total` (llama_decode calls), `prompt_tokens_total` (computed
  prompt tokens) and `tokens_predicted_total`;
- vLLM V1: `vllm:iteration_tokens_total` (count and sum: the engine steps that produced output, and
  their computed tokens) and `prompt_tokens_total`, `prompt_tokens_cached_total`. A step of
  partial prefill chunks alone emits nothing and is not counted, so the predicted side counts the
  simulated steps that emitted a token (`sim.steps_with_output` of its run.json), and every
  simulated step beside it (`predicted_steps_all`).

It sets them beside the predicted run's passes (`sim.iterations` of its run.json; for vLLM
`sim.steps_with_output`) and tokens, one row a run, in the order each deployment's runs were made
(`started_utc`), so that a slow period of the engine or the machine shows as a run of rows with a
high `real_over_predicted_ms`. Same
pass count and tokens per pass mean the simulated scheduler batches as the engine does, and a
time-per-pass gap is the step cost. Different counts mean a scheduling rule differs.

    python benchmarks/sim_vs_real_passes.py [--results results] [--json OUT]
        [--prometheus URL | --tsdb results/deployments/_prometheus/data]
        [--repredict [--configfile config/cpu-pair.yaml config/sim-vs-real.yaml]]

With `--repredict` the predicted side is made again by this checkout's simulator, on the
results' own fitted platform, instead of read from the workflow's `sim_vs_real/predicted`: for a
results folder predicted by an older simulator (one that did not record `steps_with_output`).

With `--tsdb` (the default) a private Prometheus is started on a copy of the data directory, on
127.0.0.1 and a free port, and stopped by its PID at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_slowdown import add_config_arguments, config_of, predict_into

from servelab.deploy.processes import free_port

PROMETHEUS = "/usr/bin/prometheus"


@contextmanager
def private_prometheus(tsdb: Path) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "data"
        shutil.copytree(tsdb, data, ignore=shutil.ignore_patterns("queries.active", "lock"))
        config = Path(scratch) / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        port = free_port()
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=3650d",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(120):  # bounded: 60 s
                try:
                    if httpx.get(f"{url}/-/ready", timeout=1.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            else:
                raise RuntimeError(f"Prometheus on {data} did not become ready in 60 s")
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def increase(url: str, series: str, start: float, end: float) -> float:
    """A counter's increase over [start, end]: last raw sample minus the one at or before start."""
    span = int(end - start) + 3
    reply = httpx.get(
        f"{url}/api/v1/query", params={"query": f"{series}[{span}s]", "time": end + 1}, timeout=30
    ).json()
    values = [float(v) for _t, v in reply["data"]["result"][0]["values"]]
    steps = [b - a if b >= a else b for a, b in itertools.pairwise(values)]
    return sum(steps)


def real_passes(url: str, run: dict[str, Any]) -> dict[str, float]:
    dep = f'{{deployment="{run["deployment_id"]}"}}'
    s, e = float(run["start_unix_s"]), float(run["end_unix_s"])
    if run["engine"] == "llamacpp":
        passes = increase(url, f"llamacpp:n_decode_total{dep}", s, e)
        prompt = increase(url, f"llamacpp:prompt_tokens_total{dep}", s, e)
        cached = increase(url, f"llamacpp:prompt_tokens_cached_total{dep}", s, e)
        tokens = prompt + increase(url, f"llamacpp:tokens_predicted_total{dep}", s, e)
        prompt += cached  # llama-server's prompt_tokens_total leaves the cached ones out
    else:
        passes = increase(url, f"vllm:iteration_tokens_total_count{dep}", s, e)
        tokens = increase(url, f"vllm:iteration_tokens_total_sum{dep}", s, e)
        prompt = increase(url, f"vllm:prompt_tokens_total{dep}", s, e)
        cached = increase(url, f"vllm:prompt_tokens_cached_total{dep}", s, e)
    return {"passes": passes, "tokens": tokens, "prompt": prompt, "cached": cached}


def predicted_passes(run: dict[str, Any]) -> dict[str, float]:
    m = run["sim"]["final_metrics"]
    if run["engine"] == "llamacpp":
        prompt = m["llamacpp:prompt_tokens_total"] + m["llamacpp:prompt_tokens_cached_total"]
        cached = m["llamacpp:prompt_tokens_cached_total"]
        generated = m["llamacpp:tokens_predicted_total"]
    else:
        prompt = m["vllm:prompt_tokens_total"]
        cached = m["vllm:prompt_tokens_cached_total"]
        generated = m["vllm:generation_tokens_total"]
    # V1 counts only the steps that emitted a token (servelab.sim.vllm, `steps_with_output`); a
    # prediction made before the simulator recorded them counts every step
    steps = run["sim"].get("steps_with_output") if run["engine"] != "llamacpp" else None
    return {
        "passes": float(run["sim"]["iterations"] if steps is None else steps),
        "every_step": float(run["sim"]["iterations"]),
        "tokens": prompt - cached + generated,
        "prompt": prompt,
        "cached": cached,
    }


def compare(results: Path, url: str, predicted: Path | None = None) -> list[dict[str, Any]]:
    """One row a real run; the predicted side from `predicted` (default: the workflow's,
    RESULTS/sim_vs_real/predicted), laid out as RESULTS/runs."""
    predicted = predicted or results / "sim_vs_real" / "predicted"
    rows = []
    for path in sorted((results / "runs").glob("*/*/*/rep*/run.json")):
        real = json.loads(path.read_text())
        guess = json.loads((predicted / path.relative_to(results / "runs")).read_text())
        r, p = real_passes(url, real), predicted_passes(guess)
        window = float(real["end_unix_s"]) - float(real["start_unix_s"])
        started = datetime.fromtimestamp(float(real["start_unix_s"]), tz=UTC)
        real_ms = 1e3 * window / r["passes"] if r["passes"] else None
        predicted_ms = 1e3 * float(guess["sim"]["virtual_duration_s"]) / p["passes"]
        rows.append(
            {
                "run_id": real["run_id"],
                "attempt": real["attempt"],
                "started_utc": started.strftime("%Y-%m-%dT%H:%M:%S"),
                "real_passes": round(r["passes"]),
                "predicted_passes": round(p["passes"]),
                "predicted_steps_all": round(p["every_step"]),
                "passes_ratio": round(p["passes"] / r["passes"], 3) if r["passes"] else None,
                "real_tokens_per_pass": round(r["tokens"] / r["passes"], 1)
                if r["passes"]
                else None,
                "predicted_tokens_per_pass": round(p["tokens"] / p["passes"], 1),
                "real_ms_per_pass": round(real_ms, 2) if real_ms else None,
                "predicted_ms_per_pass": round(predicted_ms, 2),
                "real_over_predicted_ms": round(real_ms / predicted_ms, 3) if real_ms else None,
                "real_cached_share": round(r["cached"] / r["prompt"], 4) if r["prompt"] else None,
                "predicted_cached_share": round(p["cached"] / p["prompt"], 4),
            }
        )
    # in the order the runs were made, deployment by deployment (the engine's age shows)
    return sorted(rows, key=lambda row: (row["run_id"].split("/")[:2], row["started_utc"]))


def repredict(results: Path, config: dict[str, Any], out: Path) -> None:
    """Every loaded run of `results` predicted again by this checkout's simulator on the
    results' own platform (RESULTS/sim_vs_real/platform.json), as the `predict_run` rule does,
    into `out` laid out as RESULTS/runs."""
    platform = results / "sim_vs_real" / "platform.json"
    for path in sorted((results / "runs").glob("*/*/*/rep*/run.json")):
        run = path.parent.relative_to(results / "runs")
        (out / run).mkdir(parents=True)
        predict_into(results, config, run.as_posix(), platform, out / run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--repredict",
        action="store_true",
        help="predict every run again with this checkout's simulator (into a temporary folder)",
    )
    add_config_arguments(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prometheus", help="a running Prometheus holding the real runs' series")
    source.add_argument("--tsdb", type=Path, help="its data directory (default: the results')")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        predicted = None
        if args.repredict:
            predicted = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            repredict(args.results, config_of(args), predicted)
        if args.prometheus:
            rows = compare(args.results, args.prometheus, predicted)
        else:
            tsdb = args.tsdb or args.results / "deployments" / "_prometheus" / "data"
            url = stack.enter_context(private_prometheus(tsdb))
            rows = compare(args.results, url, predicted)
    columns = list(rows[0])
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join("" if row[c] is None else str(row[c]) for c in columns))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
