"""Reading run artifacts into a `RunSet`: found, parsed, skipped; and the pooling guards.

A run directory `results/runs/{arm}/{engine}/{condition}/{rep}/` holds `run.json`,
`requests.parquet` and `telemetry.parquet` (docs/architecture.md). Loading:

- every directory given is *found*; a run whose `run.json` status is `failed` or `interrupted` is
  *skipped* and listed with its status (its Parquet files are not read); every other run is *parsed*;
- any unreadable or malformed artifact raises `ArtifactError` naming the file: the analysis never
  silently drops a run it was asked to read;
- all runs of one analysis must come from one backend (`run.json` `backend`), otherwise
  `PoolingError` names the runs of each backend;
- two directories holding the same run id are refused.

Further guards apply where runs are pooled or compared (`RunSet.group`, `RunSet.pairs`): the
repetitions pooled for one (arm, engine, condition) must share one resolved configuration, and the
two engines paired in one repetition must have received the same trace (seed and trace SHA-256).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servelab.analysis.reduce import RunMetrics, reduce_requests, reduce_telemetry, run_metrics
from servelab.artifacts import (
    REQUESTS_SCHEMA,
    TELEMETRY_SCHEMA,
    ArtifactError,
    read_parquet,
    read_run_json,
    read_trace_manifest,
)
from servelab.engines.registry import engine_names

__all__ = [
    "CONFIG_IGNORED_KEYS",
    "PoolingError",
    "Run",
    "RunSet",
    "SkippedRun",
    "condition_value",
    "discover_run_dirs",
    "engine_order",
    "load_runs",
    "read_manifests",
]

log = logging.getLogger("servelab.analysis")

ARMS = ("defaults", "matched")
# resolved_config keys that describe where a value was read from, not the configuration itself.
CONFIG_IGNORED_KEYS = frozenset({"evidence"})
_CONDITION_RE = re.compile(r"^(rate|sharing|length)-(\d+(?:\.\d+)?)$")
_REP_RE = re.compile(r"^rep(\d+)$")

PathLike = str | os.PathLike[str]


def engine_order() -> tuple[str, ...]:
    """The engines the analysis knows, in table and legend order: the engine registry's."""
    return engine_names()


class PoolingError(ValueError):
    """Runs that must not be pooled or compared together (different backends or configurations)."""


def condition_value(condition: str) -> tuple[str, float]:
    """(sweep, value) of a condition id: `rate-0.12` -> ("rate", 0.12), `length-8192` -> ("length", 8192)."""
    m = _CONDITION_RE.match(condition)
    if not m:
        raise ValueError(
            f"condition {condition!r} is not of the form rate-X, sharing-X or length-N"
        )
    return m.group(1), float(m.group(2))


def rep_index(rep: str) -> int:
    m = _REP_RE.match(rep)
    if not m:
        raise ValueError(f"repetition {rep!r} is not of the form repN")
    return int(m.group(1))


@dataclass(frozen=True)
class SkippedRun:
    run_id: str
    path: str
    status: str
    reason: str


@dataclass(frozen=True)
class Run:
    """One parsed run: identity, its record, its metrics."""

    run_id: str
    arm: str
    engine: str
    condition: str
    rep: str
    seed: int
    trace_sha256: str
    backend: str
    resolved_config: Mapping[str, Any]
    offered_load: float
    path: str
    metrics: RunMetrics = field(repr=False)
    kv_peak: float = float("nan")
    preemptions: float = float("nan")

    @property
    def config_key(self) -> str:
        """Canonical JSON of the resolved configuration (keys in CONFIG_IGNORED_KEYS dropped)."""
        cfg = {k: v for k, v in self.resolved_config.items() if k not in CONFIG_IGNORED_KEYS}
        return json.dumps(cfg, sort_keys=True, default=str)


@dataclass
class RunSet:
    """The runs of one analysis, with the found / parsed / skipped account."""

    runs: dict[str, Run]
    found: int
    skipped: list[SkippedRun]
    backend: str | None
    exclude_first_graph: bool

    @property
    def parsed(self) -> int:
        return len(self.runs)

    def summary_line(self) -> str:
        return (
            f"run logs: {self.found} found, {self.parsed} parsed, {len(self.skipped)} skipped"
            + (f" ({self.backend} backend)" if self.backend else "")
        )

    def conditions(self, arm: str | None = None) -> list[str]:
        """Condition ids present (parsed runs), ordered by sweep then value."""
        conds = {r.condition for r in self.runs.values() if arm is None or r.arm == arm}
        return sorted(conds, key=_condition_sort_key)

    def group(self, arm: str, engine: str, condition: str) -> list[Run]:
        """The repetitions of one (arm, engine, condition), ordered by rep; one configuration only."""
        members = [
            r
            for r in self.runs.values()
            if r.arm == arm and r.engine == engine and r.condition == condition
        ]
        members.sort(key=lambda r: rep_index(r.rep))
        configs: dict[str, list[str]] = {}
        for r in members:
            configs.setdefault(r.config_key, []).append(r.run_id)
        if len(configs) > 1:
            detail = "; ".join(f"{', '.join(ids)} resolved {cfg}" for cfg, ids in configs.items())
            raise PoolingError(
                f"refusing to pool runs of {arm}/{engine}/{condition} resolved with different "
                f"configurations: {detail}"
            )
        return members

    def engines(self) -> tuple[str, ...]:
        """The engines among the runs found (parsed or skipped), in registry order."""
        seen = {r.engine for r in self.runs.values()}
        seen |= {s.run_id.split("/")[1] for s in self.skipped if s.run_id.count("/") == 3}
        return tuple(e for e in engine_order() if e in seen)

    def pairs(
        self, arm: str, condition: str, engines: tuple[str, str] = ("vllm", "sglang")
    ) -> list[tuple[Run, Run]]:
        """Runs of the two `engines` (the study's: vLLM, SGLang) of the same repetition, ordered by
        rep; the same trace is required."""
        first_engine, second_engine = engines
        first = {r.rep: r for r in self.group(arm, first_engine, condition)}
        second = {r.rep: r for r in self.group(arm, second_engine, condition)}
        return _paired(first, second)

    def arm_pairs(self, engine: str, condition: str) -> list[tuple[Run, Run]]:
        """(defaults, matched) runs of one engine of the same repetition, ordered by rep."""
        first = {r.rep: r for r in self.group("defaults", engine, condition)}
        second = {r.rep: r for r in self.group("matched", engine, condition)}
        return _paired(first, second)

    def expected_reps(
        self, arm: str, condition: str, engines: Iterable[str] | None = None
    ) -> list[str]:
        """Reps of (arm, condition) among the runs found (parsed or skipped), for any of `engines`
        (default: every engine)."""
        engines = set(engine_order() if engines is None else engines)
        reps: set[str] = set()
        for s in self.skipped:
            parts = s.run_id.split("/")
            if (
                len(parts) == 4
                and parts[0] == arm
                and parts[2] == condition
                and parts[1] in engines
            ):
                reps.add(parts[3])
        reps |= {
            r.rep
            for r in self.runs.values()
            if r.arm == arm and r.condition == condition and r.engine in engines
        }
        return sorted(reps, key=rep_index)


def _paired(first: Mapping[str, Run], second: Mapping[str, Run]) -> list[tuple[Run, Run]]:
    out = []
    for rep in sorted(set(first) & set(second), key=rep_index):
        a, b = first[rep], second[rep]
        if a.seed != b.seed or a.trace_sha256 != b.trace_sha256:
            raise PoolingError(
                f"runs {a.run_id} and {b.run_id} are paired by repetition but received "
                f"different traces (seed {a.seed} vs {b.seed}, trace sha256 "
                f"{a.trace_sha256[:12]} vs {b.trace_sha256[:12]})"
            )
        out.append((a, b))
    return out


def _condition_sort_key(condition: str) -> tuple[int, float, str]:
    try:
        sweep, value = condition_value(condition)
    except ValueError:
        return (9, 0.0, condition)
    return ({"rate": 0, "sharing": 1, "length": 2}[sweep], value, condition)


def discover_run_dirs(runs_root: PathLike) -> list[Path]:
    """Every `{arm}/{engine}/{condition}/{rep}` directory under `runs_root` holding a run.json.

    Ordered by path. Directories at that depth without run.json are reported (logged) and ignored:
    atomic writes mean a run without its record never completed.
    """
    root = Path(runs_root)
    if not root.is_dir():
        raise ArtifactError(f"{root}: no such directory")
    out = []
    for path in sorted(root.glob("*/*/*/*")):
        if not path.is_dir():
            continue
        if (path / "run.json").is_file():
            out.append(path)
        else:
            log.warning("%s: no run.json (incomplete run), not analysed", path)
    return out


def load_runs(
    run_dirs: Sequence[PathLike],
    *,
    exclude_first_graph: bool = True,
    telemetry: bool = True,
) -> RunSet:
    """Read the given run directories (see the module docstring for the rules).

    `telemetry=False` skips telemetry.parquet (analyses that need no KV-cache or preemption data).
    """
    runs: dict[str, Run] = {}
    skipped: list[SkippedRun] = []
    backends: dict[str, list[str]] = {}
    for raw in run_dirs:
        run_dir = Path(raw)
        record_path = run_dir / "run.json"
        record = read_run_json(record_path)
        run_id = str(record["run_id"])
        expected = f"{record['arm']}/{record['engine']}/{record['condition']}/{record['rep']}"
        if run_id != expected:
            raise ArtifactError(
                f"{record_path}: run_id {run_id!r} does not match its parts {expected!r}"
            )
        if record["engine"] not in engine_order():
            raise ArtifactError(
                f"{record_path}: engine {record['engine']!r} is not one of {engine_order()}"
            )
        try:
            condition_value(str(record["condition"]))
            rep_index(str(record["rep"]))
        except ValueError as exc:
            raise ArtifactError(f"{record_path}: {exc}") from exc
        if run_id in runs or any(s.run_id == run_id for s in skipped):
            raise ArtifactError(f"{record_path}: run {run_id} is given twice")
        backends.setdefault(str(record["backend"]), []).append(run_id)
        if record["status"] != "ok":
            reason = f"run.json status {record['status']!r}"
            skipped.append(SkippedRun(run_id, str(run_dir), str(record["status"]), reason))
            log.info("skipping %s: %s", run_id, reason)
            continue
        req_path = run_dir / "requests.parquet"
        table = read_parquet(req_path, REQUESTS_SCHEMA)
        ids = table.column("run_id").unique().to_pylist()
        if ids and ids != [run_id]:
            raise ArtifactError(f"{req_path}: rows belong to run(s) {ids}, expected {run_id!r}")
        metrics = run_metrics(
            reduce_requests(table, str(req_path)), exclude_first_graph=exclude_first_graph
        )
        kv_peak = preemptions = float("nan")
        if telemetry:
            kv_peak, preemptions = reduce_telemetry(
                read_parquet(run_dir / "telemetry.parquet", TELEMETRY_SCHEMA)
            )
        try:
            offered = float(record["offered_load_rps"])
            seed = int(record["seed"])
        except (TypeError, ValueError) as exc:
            raise ArtifactError(
                f"{record_path}: offered_load_rps/seed not numeric ({exc})"
            ) from exc
        runs[run_id] = Run(
            run_id=run_id,
            arm=str(record["arm"]),
            engine=str(record["engine"]),
            condition=str(record["condition"]),
            rep=str(record["rep"]),
            seed=seed,
            trace_sha256=str(record["trace_sha256"]),
            backend=str(record["backend"]),
            resolved_config=dict(record["resolved_config"]),
            offered_load=offered,
            path=str(run_dir),
            metrics=metrics,
            kv_peak=kv_peak,
            preemptions=preemptions,
        )
    if len(backends) > 1:
        detail = "; ".join(
            f"{b}: {', '.join(ids[:5])}{' …' if len(ids) > 5 else ''} ({len(ids)} run(s))"
            for b, ids in sorted(backends.items())
        )
        raise PoolingError(
            f"refusing to pool runs from different backends in one analysis: {detail}"
        )
    runset = RunSet(
        runs=dict(sorted(runs.items())),
        found=len(run_dirs),
        skipped=sorted(skipped, key=lambda s: s.run_id),
        backend=next(iter(backends), None),
        exclude_first_graph=exclude_first_graph,
    )
    log.info("%s", runset.summary_line())
    for s in runset.skipped:
        log.info("  skipped %s: %s", s.run_id, s.reason)
    return runset


@dataclass(frozen=True)
class TraceInfo:
    condition: str
    rep: str
    seed: int
    duration_s: float
    n_graphs: int
    n_requests: int
    path: str


def read_manifests(paths: Sequence[PathLike]) -> dict[tuple[str, str], TraceInfo]:
    """Trace manifests keyed by (condition, rep); errors name the file."""
    out: dict[tuple[str, str], TraceInfo] = {}
    for raw in paths:
        m = read_trace_manifest(raw)
        try:
            info = TraceInfo(
                condition=str(m["condition"]),
                rep=str(m["rep"]),
                seed=int(m["seed"]),
                duration_s=float(m["duration_s"]),
                n_graphs=int(m["n_graphs"]),
                n_requests=int(m["n_requests"]),
                path=str(raw),
            )
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{raw}: malformed manifest field ({exc})") from exc
        if not (np.isfinite(info.duration_s) and info.duration_s > 0):
            raise ArtifactError(f"{raw}: duration_s must be positive")
        key = (info.condition, info.rep)
        if key in out:
            raise ArtifactError(
                f"{raw}: second manifest for {key[0]}/{key[1]} (first: {out[key].path})"
            )
        out[key] = info
    return out
