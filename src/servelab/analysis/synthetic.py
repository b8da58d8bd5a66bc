"""Synthetic run artifacts, written to the real schemas: fixtures for tests and the grid benchmark.

Nothing here simulates an engine faithfully (that is `servelab.sim`'s job, which the analysis never
imports). A synthetic run is a trace of agent graphs (Gamma arrivals, planner -> 4 workers ->
aggregator, tool delays) served by a toy queue: below capacity TTFT is log-normal around a
load-dependent median, above capacity every request also waits for the backlog that has built up
since the start. That is enough to give every statistic, table and figure realistic shapes and
sizes (e.g. a rate-0.40 run holds about 1,440 requests of 128-256 one-token chunks).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from servelab.artifacts import (
    REQUESTS_SCHEMA,
    TELEMETRY_SCHEMA,
    TRACE_SCHEMA,
    write_json,
    write_parquet,
)
from servelab.artifacts.runrecord import build_run_record
from servelab.grid.config import Condition, conditions, offered_load, runs, trace_seed

__all__ = [
    "RunSpec",
    "graph_trace_table",
    "requests_table",
    "telemetry_table",
    "write_graph_trace",
    "write_manifest",
    "write_run",
    "write_simple_run",
    "write_synthetic_grid",
    "write_synthetic_run",
]

PathLike = str | os.PathLike[str]
# The DCGM series the GPU's canonical names come from (servelab.telemetry.canonical.GPU_METRIC_MAP).
GPU_SOURCE_NAMES = {
    "gpu_energy_mj": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "gpu_power_w": "DCGM_FI_DEV_POWER_USAGE",
}
SOURCE_NAMES = {
    "vllm": {
        "kv_cache_usage": "vllm:gpu_cache_usage_perc",
        "requests_running": "vllm:num_requests_running",
        "requests_waiting": "vllm:num_requests_waiting",
        "preemptions_total": "vllm:num_preemptions_total",
    },
    "sglang": {
        "kv_cache_usage": "sglang:token_usage",
        "requests_running": "sglang:num_running_reqs",
        "requests_waiting": "sglang:num_queue_reqs",
    },
}


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def requests_table(rows: Sequence[Mapping[str, Any]], run_id: str) -> pa.Table:
    """A REQUESTS_SCHEMA table from per-request dicts (tests' hand-built fixtures).

    Keys: request_id, graph_id, role, chunk_times_s, and optionally warmup (False), scheduled_s
    (= sent_s), sent_s (0.0), written_s (= sent_s), chunk_tokens (one token per chunk), prompt_tokens (100),
    output_tokens (sum of chunk_tokens; pass None for "not reported"), max_tokens (128),
    status ("ok"), error (None).
    """
    cols: dict[str, list[Any]] = {f.name: [] for f in REQUESTS_SCHEMA}
    for row in rows:
        times = list(row["chunk_times_s"])
        tokens = list(row.get("chunk_tokens", [1] * len(times)))
        sent = row.get("sent_s", 0.0)
        cols["run_id"].append(run_id)
        cols["request_id"].append(row["request_id"])
        cols["graph_id"].append(row["graph_id"])
        cols["role"].append(row["role"])
        cols["warmup"].append(row.get("warmup", False))
        cols["scheduled_s"].append(row.get("scheduled_s", sent if sent is not None else 0.0))
        cols["sent_s"].append(sent)
        cols["written_s"].append(row.get("written_s", sent))
        cols["chunk_times_s"].append(times)
        cols["chunk_tokens"].append(tokens)
        cols["prompt_tokens"].append(row.get("prompt_tokens", 100))
        cols["output_tokens"].append(row.get("output_tokens", sum(tokens)))
        cols["max_tokens"].append(row.get("max_tokens", 128))
        cols["status"].append(row.get("status", "ok"))
        cols["error"].append(row.get("error"))
    return pa.table(cols, schema=REQUESTS_SCHEMA)


def telemetry_table(
    samples: Sequence[tuple[float, str, float]], run_id: str, engine: str
) -> pa.Table:
    """A TELEMETRY_SCHEMA table from (t_s, canonical metric, value) samples."""
    names = {**GPU_SOURCE_NAMES, **SOURCE_NAMES.get(engine, {})}
    return pa.table(
        {
            "run_id": [run_id] * len(samples),
            "t_s": [float(s[0]) for s in samples],
            "metric": [s[1] for s in samples],
            "value": [float(s[2]) for s in samples],
            "source_metric": [names.get(s[1], s[1]) for s in samples],
        },
        schema=TELEMETRY_SCHEMA,
    )


@dataclass(frozen=True)
class RunSpec:
    """Identity and record fields of one synthetic run."""

    arm: str
    engine: str
    condition: str
    rep: str
    seed: int = 1
    offered_load_rps: float = 1.0
    backend: str = "sim"
    chunked_prefill: bool = True
    chunk_size: int | None = 2048
    status: str | None = None  # None: from the success check
    trace_sha256: str | None = None  # None: derived from the seed

    @property
    def run_id(self) -> str:
        return f"{self.arm}/{self.engine}/{self.condition}/{self.rep}"


def write_run(
    run_dir: PathLike,
    spec: RunSpec,
    requests: pa.Table,
    telemetry: pa.Table | None = None,
    *,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write requests.parquet, telemetry.parquet and run.json (via build_run_record) to `run_dir`."""
    run_dir = Path(run_dir)
    write_parquet(run_dir / "requests.parquet", requests, REQUESTS_SCHEMA)
    if telemetry is None:
        telemetry = telemetry_table([], spec.run_id, spec.engine)
    write_parquet(run_dir / "telemetry.parquet", telemetry, TELEMETRY_SCHEMA)
    record = build_run_record(
        arm=spec.arm,
        engine=spec.engine,
        condition=spec.condition,
        rep=spec.rep,
        seed=spec.seed,
        trace_sha256=spec.trace_sha256 or hashlib.sha256(f"trace-{spec.seed}".encode()).hexdigest(),
        backend=spec.backend,
        deployment_id=f"{spec.arm}-{spec.engine}-synthetic",
        resolved_config={
            "engine": spec.engine,
            "chunked_prefill": spec.chunked_prefill,
            "chunk_size": spec.chunk_size,
        },
        start_unix_s=1_700_000_000.0,
        end_unix_s=1_700_000_000.0 + 600.0,
        offered_load_rps=spec.offered_load_rps,
        requests=requests,
        success_threshold=0.95,
        attempt=1,
        node={"name": "synthetic-node", "uid": "0", "provider_id": "none", "spot": False},
        extra={"trace_start_s": 0.0, **(extra or {})},
    )
    record["git_commit"] = "synthetic"  # keep fixture bytes independent of the checkout
    if spec.status is not None:
        record["status"] = spec.status
    write_json(run_dir / "run.json", record)
    return run_dir


def write_manifest(
    path: PathLike,
    *,
    condition: Condition,
    rep: str,
    seed: int,
    n_graphs: int = 0,
    n_requests: int = 0,
) -> Path:
    """A trace manifest.json of `condition` with the required fields (prefix fields are
    placeholders)."""
    prefix = "synthetic prefix"
    write_json(
        path,
        {
            "condition": condition.id,
            "rep": rep,
            "seed": seed,
            "rate": condition.rate,
            "sharing": condition.sharing,
            "prompt_tokens": condition.prompt_tokens,
            "duration_s": condition.duration_s,
            "tokenizer": "synthetic",
            "prefix_text": prefix,
            "prefix_sha256": hashlib.sha256(prefix.encode()).hexdigest(),
            "achieved_sharing": condition.sharing,
            "n_graphs": n_graphs,
            "n_requests": n_requests,
            "checks": {"synthetic": True},
        },
    )
    return Path(path)


def write_simple_run(
    run_dir: PathLike,
    spec: RunSpec,
    ttft_s: Sequence[float],
    *,
    end_s: float = 1000.0,
    kv_peak: float | None = None,
    gpu_energy_mj: Sequence[tuple[float, float]] = (),
) -> Path:
    """A run with exactly known metrics, for hand-computed tests.

    Graph 0 is one planner sent at 0 s whose last chunk arrives at `end_s` (so W = end_s and
    X = (len(ttft_s) + 1) / end_s when every other chunk is earlier); request k (graph k + 1,
    roles cycling planner/worker/aggregator) is sent at k + 1 s and has TTFT `ttft_s[k]` and two
    one-token chunks 0.1 s apart (TPOT 0.1 s). Two warm-up requests precede the trace: every
    request is ok, 2 × len(ttft_s) + 6 output tokens in all, in run.json's 600 s window.
    `gpu_energy_mj`: (t_s, value) samples of the GPU's energy counter in telemetry.parquet.
    """
    roles = ("planner", "worker", "aggregator")
    rows: list[dict[str, Any]] = [
        {"request_id": f"warm-{i}", "graph_id": -1, "role": "warmup", "warmup": True,
         "sent_s": 0.0, "chunk_times_s": [0.01, 0.02]}
        for i in range(2)
    ]  # fmt: skip
    rows.append(
        {"request_id": "g0", "graph_id": 0, "role": "planner", "sent_s": 0.0,
         "chunk_times_s": [0.5, end_s]}
    )  # fmt: skip
    for k, ttft in enumerate(ttft_s):
        sent = float(k + 1)
        rows.append(
            {
                "request_id": f"g{k + 1}",
                "graph_id": k + 1,
                "role": roles[k % 3],
                "scheduled_s": sent,
                "sent_s": sent,
                "chunk_times_s": [sent + ttft, sent + ttft + 0.1],
            }
        )
    samples: list[tuple[float, str, float]] = []
    if kv_peak is not None:
        samples += [(0.0, "kv_cache_usage", kv_peak / 2), (5.0, "kv_cache_usage", kv_peak)]
    samples += [(t, "gpu_energy_mj", v) for t, v in gpu_energy_mj]
    telemetry = telemetry_table(samples, spec.run_id, spec.engine) if samples else None
    return write_run(run_dir, spec, requests_table(rows, spec.run_id), telemetry)


def graph_trace_table(
    arrivals_s: Sequence[float],
    *,
    workers: int = 4,
    prompt_tokens: int = 16,
    prefix_tokens: int = 8,
    max_tokens: tuple[int, int, int] = (9, 9, 17),
    tool_delay_s: float = 0.0,
) -> pa.Table:
    """A TRACE_SCHEMA table: one planner -> `workers` workers -> aggregator graph per arrival,
    ids as the trace compiler writes them, every prompt `prompt_tokens` long with a shared prefix
    of `prefix_tokens`, outputs of `max_tokens` (planner, worker, aggregator) tokens."""
    cols: dict[str, list[Any]] = {f.name: [] for f in TRACE_SCHEMA}

    def add(rid: str, graph: int, role: str, deps: list[str], delay: float, out: int) -> None:
        cols["request_id"].append(rid)
        cols["graph_id"].append(graph)
        cols["role"].append(role)
        cols["arrival_s"].append(float(arrivals_s[graph]))
        cols["depends_on"].append(deps)
        cols["tool_delay_s"].append(delay)
        cols["prompt_token_ids"].append(list(range(prompt_tokens)))
        cols["prompt_text"].append("synthetic")
        cols["prefix_tokens"].append(prefix_tokens)
        cols["max_tokens"].append(out)

    for g in range(len(arrivals_s)):
        planner = f"g{g:05d}-planner"
        add(planner, g, "planner", [], 0.0, max_tokens[0])
        names = [f"g{g:05d}-w{w + 1}" for w in range(workers)]
        for name in names:
            add(name, g, "worker", [planner], tool_delay_s, max_tokens[1])
        add(f"g{g:05d}-aggregator", g, "aggregator", names, 0.0, max_tokens[2])
    return pa.table(cols, schema=TRACE_SCHEMA)


def write_graph_trace(
    trace_dir: PathLike, *, condition: Condition, rep: str, seed: int, table: pa.Table
) -> tuple[Path, Path]:
    """`table` (graph_trace_table) as `trace_dir`/trace.parquet with its manifest.json."""
    trace_dir = Path(trace_dir)
    write_parquet(trace_dir / "trace.parquet", table, TRACE_SCHEMA)
    manifest = write_manifest(
        trace_dir / "manifest.json",
        condition=condition,
        rep=rep,
        seed=seed,
        n_graphs=len(set(table.column("graph_id").to_pylist())),
        n_requests=table.num_rows,
    )
    return trace_dir / "trace.parquet", manifest


# --------------------------------------------------------------------------- the toy queue


def _capacity(engine: str, arm: str, prompt_tokens: int, sharing: float) -> float:
    """Requests/s an engine sustains: vLLM without chunking loses capacity to prefill stalls."""
    base = {"vllm": 1.40, "sglang": 1.94}[engine]
    if engine == "vllm" and arm == "matched":
        base = 1.55
    uncached = prompt_tokens * (1.0 - sharing)
    work = 1.0 + uncached / 1200.0 + prompt_tokens / 20000.0
    return base * 1.6 / work


# Workers between planner and aggregator in every synthetic agent graph (the study's workload).
_WORKERS_PER_GRAPH = 4


@dataclass(frozen=True)
class _Trace:
    arrivals: np.ndarray  # graph arrival times
    tool_delay: np.ndarray  # (graphs, 4)
    n_graphs: int


def _trace(seed: int, rate: float, duration_s: float) -> _Trace:
    """Graph arrivals over `duration_s`, realised slightly above `rate` (as finite bursty runs often
    are), so that an engine with spare capacity measurably keeps pace despite the run's drain tail."""
    rng = np.random.default_rng(seed)
    cv = 1.5
    realised = rate * 1.08
    n_max = int(realised * duration_s * 3 + 20)
    gaps = rng.gamma(1.0 / cv**2, cv**2 / realised, size=n_max)
    arrivals = np.cumsum(gaps) - gaps[0]
    arrivals = arrivals[arrivals < duration_s]
    tool = np.clip(rng.lognormal(np.log(0.5), 1.0, size=(arrivals.size, 4)), 0.0, 10.0)
    return _Trace(arrivals, tool, int(arrivals.size))


def write_synthetic_run(
    run_dir: PathLike,
    *,
    arm: str,
    engine: str,
    condition: Condition,
    rep: str,
    seed: int,
    status: str | None = None,
    backend: str = "sim",
    warmup_requests: int = 20,
) -> Path:
    """One synthetic run of `condition`, of realistic size (graphs arrive for its `duration_s` at
    its `rate`)."""
    trace = _trace(seed, condition.rate, condition.duration_s)
    rng = np.random.default_rng(_seed(seed, arm, engine))
    sharing, prompt_tokens = condition.sharing, condition.prompt_tokens
    offered = offered_load(condition, {"workers_per_graph": _WORKERS_PER_GRAPH})
    cap = _capacity(engine, arm, prompt_tokens, sharing)
    rho = offered / cap
    t0 = 5.0  # trace start after the warm-ups
    tpot_med = {"vllm": 0.095, "sglang": 0.105}[engine] * (1.0 + 0.15 * min(rho, 1.5))
    base_ttft = 0.25 + prompt_tokens * (1.0 - sharing) / 9000.0
    tail_sigma = 1.3 if (engine == "vllm" and arm == "defaults") else 0.7

    g = trace.n_graphs
    graph_ids = np.arange(g)

    def serve(ready: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sent, first chunk time, tpot) for requests ready at `ready` (trace time)."""
        sent = ready + rng.uniform(0.0003, 0.003, size=ready.size)
        wait = base_ttft * (1.0 + min(rho, 0.97) / (1.0 - min(rho, 0.97)) * 0.15)
        ttft = wait * rng.lognormal(0.0, tail_sigma * 0.6, size=ready.size)
        if rho > 1.0:
            ttft += (rho - 1.0) * ready  # the backlog built since the start, served at capacity
        tpot = tpot_med * rng.lognormal(0.0, 0.05, size=ready.size)
        return sent, sent + ttft, tpot

    def finish(first: np.ndarray, tpot: np.ndarray, n_tokens: int) -> np.ndarray:
        end: np.ndarray = first + tpot * (n_tokens - 1)
        return end

    p_sent, p_first, p_tpot = serve(trace.arrivals)
    p_end = finish(p_first, p_tpot, 128)
    w_ready = p_end[:, None] + trace.tool_delay
    w_sent, w_first, w_tpot = serve(w_ready.ravel())
    w_end = finish(w_first, w_tpot, 128).reshape(g, 4)
    a_ready = w_end.max(axis=1)
    a_sent, a_first, a_tpot = serve(a_ready)

    # Declared as plain arrays: the reordering below assigns all eight from one generator.
    sched: np.ndarray = np.concatenate([trace.arrivals, w_ready.ravel(), a_ready]) + t0
    sent: np.ndarray = np.concatenate([p_sent, w_sent, a_sent]) + t0
    first: np.ndarray = np.concatenate([p_first, w_first, a_first]) + t0
    tpot: np.ndarray = np.concatenate([p_tpot, w_tpot, a_tpot])
    n_tok: np.ndarray = np.concatenate([np.full(g, 128), np.full(4 * g, 128), np.full(g, 256)])
    gid: np.ndarray = np.concatenate([graph_ids, np.repeat(graph_ids, 4), graph_ids]).astype(
        np.int32
    )
    roles = np.array(["planner"] * g + ["worker"] * (4 * g) + ["aggregator"] * g, dtype=object)
    rid = np.array(
        [f"g{i:05d}-p" for i in graph_ids]
        + [f"g{i:05d}-w{j}" for i in graph_ids for j in range(4)]
        + [f"g{i:05d}-a" for i in graph_ids],
        dtype=object,
    )
    order = np.lexsort((sched, gid))
    sched, sent, first, tpot, n_tok, gid, roles, rid = (
        x[order] for x in (sched, sent, first, tpot, n_tok, gid, roles, rid)
    )
    failed = rng.random(sched.size) < 0.001
    n_chunks = np.where(failed, 0, n_tok)

    # Warm-up requests: 16 tokens each, all sent at 0 and done before t0.
    w = warmup_requests
    sched = np.concatenate([np.zeros(w), sched])
    sent = np.concatenate([np.zeros(w), sent])
    first = np.concatenate([np.full(w, 0.5), first])
    tpot = np.concatenate([np.full(w, 0.05), tpot])
    n_tok = np.concatenate([np.full(w, 16), n_tok])
    n_chunks = np.concatenate([np.full(w, 16), n_chunks])
    gid = np.concatenate([np.full(w, -1, dtype=np.int32), gid])
    roles = np.concatenate([np.array(["warmup"] * w, dtype=object), roles])
    rid = np.concatenate([np.array([f"warmup-{i:02d}" for i in range(w)], dtype=object), rid])
    failed = np.concatenate([np.zeros(w, dtype=bool), failed])
    warm = np.arange(sched.size) < w

    offsets = np.concatenate(([0], np.cumsum(n_chunks))).astype(np.int32)
    step = np.repeat(tpot, n_chunks) * rng.lognormal(0.0, 0.2, size=int(offsets[-1]))
    idx = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], n_chunks)
    step[idx == 0] = 0.0
    times = np.repeat(first, n_chunks) + _segmented_cumsum(step, offsets)
    chunk_times = pa.ListArray.from_arrays(pa.array(offsets), pa.array(times, pa.float64()))
    chunk_tokens = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(np.ones(int(offsets[-1]), dtype=np.int32))
    )
    run_id = f"{arm}/{engine}/{condition.id}/{rep}"
    n = sched.size
    table = pa.table(
        {
            "run_id": pa.array([run_id] * n),
            "request_id": pa.array(rid.tolist()),
            "graph_id": pa.array(gid, pa.int32()),
            "role": pa.array(roles.tolist()),
            "warmup": pa.array(warm),
            "scheduled_s": pa.array(sched),
            "sent_s": pa.array(sent),
            "written_s": pa.array(sent),
            "chunk_times_s": chunk_times,
            "chunk_tokens": chunk_tokens,
            "prompt_tokens": pa.array(np.full(n, prompt_tokens + 1, dtype=np.int32)),
            "output_tokens": pa.array(np.where(failed, 0, n_tok).astype(np.int32)),
            "max_tokens": pa.array(n_tok.astype(np.int32)),
            "status": pa.array(np.where(failed, "error", "ok").tolist()),
            "error": pa.array([("synthetic failure" if f else None) for f in failed], pa.string()),
        },
        schema=REQUESTS_SCHEMA,
    )

    end = float(np.nanmax(times)) if times.size else t0
    t = np.arange(0.0, end + 5.0, 5.0)
    kv = np.clip(
        0.2 + 0.7 * (1.0 - sharing) + 0.25 * min(rho, 1.2) + rng.normal(0, 0.02, t.size), 0, 0.995
    )
    if engine == "sglang":
        kv *= 0.85
    samples = [(ti, "kv_cache_usage", ki) for ti, ki in zip(t, kv, strict=True)]
    if engine == "vllm":
        pre = np.cumsum(rng.random(t.size) < (0.01 if rho > 1 else 0.0)) + 7.0
        samples += [(ti, "preemptions_total", float(p)) for ti, p in zip(t, pre, strict=True)]
    samples += [(ti, "requests_waiting", max(0.0, (rho - 1.0) * ti / 10.0)) for ti in t]
    telemetry = telemetry_table(samples, run_id, engine)

    spec = RunSpec(
        arm=arm,
        engine=engine,
        condition=condition.id,
        rep=rep,
        seed=seed,
        offered_load_rps=offered,
        backend=backend,
        chunked_prefill=not (engine == "vllm" and arm == "defaults"),
        chunk_size=None if (engine == "vllm" and arm == "defaults") else 2048,
        status=status,
    )
    return write_run(run_dir, spec, table, telemetry)


def _segmented_cumsum(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Cumulative sum of `values` restarting at every segment start (segments given by `offsets`)."""
    total = np.cumsum(values)
    before = np.concatenate(([0.0], total))[offsets[:-1]]
    restarted: np.ndarray = total - np.repeat(before, np.diff(offsets))
    return restarted


def write_synthetic_grid(
    root: PathLike,
    config: Mapping[str, Any],
    *,
    duration_scale: float = 1.0,
    statuses: Mapping[str, str] | None = None,
    backend: str = "sim",
) -> tuple[list[Path], list[Path]]:
    """Every run of `config`'s grid (servelab.grid.config.runs) under `{root}/runs/...`, and the trace
    manifests under `{root}/traces/...`. Returns (run dirs, manifest paths).

    `duration_scale` shortens every run (tests); `statuses` forces run.json status by run id.
    """
    root = Path(root)
    conds = conditions(config)
    run_dirs: list[Path] = []
    manifests: dict[tuple[str, str], Path] = {}
    for run in runs(config):
        c = conds[run.condition]
        c = replace(c, duration_s=c.duration_s * duration_scale)
        seed = trace_seed(int(config["campaign_seed"]), run.condition, run.rep)
        run_dir = root / "runs" / run.arm / run.engine / run.condition / run.rep
        write_synthetic_run(
            run_dir,
            arm=run.arm,
            engine=run.engine,
            condition=c,
            rep=run.rep,
            seed=seed,
            status=(statuses or {}).get(run.id),
            backend=backend,
        )
        run_dirs.append(run_dir)
        key = (run.condition, run.rep)
        if key not in manifests:
            n_graphs = _trace(seed, c.rate, c.duration_s).n_graphs
            manifests[key] = write_manifest(
                root / "traces" / run.condition / run.rep / "manifest.json",
                condition=c,
                rep=run.rep,
                seed=seed,
                n_graphs=n_graphs,
                n_requests=(_WORKERS_PER_GRAPH + 2) * n_graphs,
            )
    return sorted(run_dirs), [manifests[k] for k in sorted(manifests)]
