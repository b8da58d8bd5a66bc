"""Campaign blocks (study §5.4): run with retries, discard on reclamation, seal and publish.

The Snakemake rules call these functions once per deployment and once per block: every repetition
of one (arm, engine, condition), the unit of work (docs/campaigns.md). What differs between
backends is behind `servelab.deploy.Backend`; everything here is shared.

A run passes when its record is complete and at least `success_threshold` of its requests
succeeded. A failing run is retried up to `retries` times; each failed attempt's artifacts are kept
under `<run>/attempts/attempt-N/`. A run that still fails is recorded (status `failed`) and the
campaign goes on. When the node under a run is reclaimed, every repetition of the block is moved
under `results/discarded/` with a reason file and measured again, by the same job.

Each run's measurement is sealed in `<run>/measured/` under its key (servelab.grid.identity: the
identity settings alone); a job finding a sealed measurement of the same key publishes it instead
of measuring again. One of another key is moved aside to `results/superseded/` (real engines) or
dropped (the simulator) before the run is measured again.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.artifacts import (
    ATTEMPTS_DIR,
    MEASURED_DIR,
    MEASUREMENT_KEY_FILE,
    REQUESTS_SCHEMA,
    RUN_FILES,
    SCRAPE_SCHEMA,
    file_sha256,
    next_generation_dir,
    read_json,
    read_parquet,
    read_run_json,
    write_json,
    write_parquet,
    write_text,
)
from servelab.artifacts.runrecord import build_run_record
from servelab.campaign.deploy import backend_deployment, gate
from servelab.deploy import Backend, NodeSlot, RunRequest, get_backend
from servelab.grid.identity import (
    deployment_identity,
    measurement_key,
    operational_settings,
    run_identity,
)
from servelab.grid.settings import Settings

__all__ = ["BlockPaths", "RunPaths", "execute_block", "execute_run"]

log = logging.getLogger(__name__)

# Resolved-configuration fields copied from resolved.json into each run record.
RESOLVED_EXTRAS = ("prefix_caching", "context_len", "schedule_policy", "version")
MAX_RECLAMATIONS = 3


@dataclass(frozen=True)
class RunPaths:
    results_dir: Path
    arm: str
    engine: str
    condition: str
    rep: str

    @property
    def run_dir(self) -> Path:
        return self.results_dir / "runs" / self.arm / self.engine / self.condition / self.rep

    @property
    def measured_dir(self) -> Path:
        """Where attempts write; published to the run's declared outputs once complete."""
        return self.run_dir / MEASURED_DIR

    @property
    def discard_root(self) -> Path:
        return self.results_dir / "discarded" / self.arm / self.engine / self.condition

    @property
    def run_id(self) -> str:
        return f"{self.arm}/{self.engine}/{self.condition}/{self.rep}"


@dataclass(frozen=True)
class BlockPaths:
    """One (arm, engine, condition): the unit of work. Its job owns everything under its
    condition folder in results/runs/ and results/discarded/."""

    results_dir: Path
    arm: str
    engine: str
    condition: str

    @property
    def block_id(self) -> str:
        return f"{self.arm}/{self.engine}/{self.condition}"

    @property
    def block_json(self) -> Path:
        return self.results_dir / "runs" / self.arm / self.engine / self.condition / "block.json"

    @property
    def discard_root(self) -> Path:
        return self.results_dir / "discarded" / self.arm / self.engine / self.condition

    def run(self, rep: str) -> RunPaths:
        return RunPaths(self.results_dir, self.arm, self.engine, self.condition, rep)


def execute_block(
    *,
    identity: Mapping[str, Any],
    operational: Mapping[str, Any],
    faults: Sequence[Mapping[str, Any]],
    results_dir: str,
    traces: Sequence[str],
    manifests: Sequence[str],
    resolved_path: str,
    block_json_path: str,
    node: NodeSlot | None = None,
) -> dict[str, Any]:
    """Measure every repetition of one (arm, engine, condition) block on GPU node slot `node`
    (servelab.campaign.deploy.node_for; default: the one node); returns the block record
    (written to `block_json_path`, beside the repetitions).

    `identity` is what the run rule's params carry: `deployment` (servelab.grid.identity's
    deployment_identity), `run` (run_identity without the rep) and `reps`; `operational` the
    operational settings (servelab.grid.identity.operational_settings), read at run time; `faults` the
    injected faults of the config (each names its run). `traces[i]`/`manifests[i]` belong to
    `reps[i]`. A reclamation discards the block's repetitions (kept, with the reason) and measures
    them all again on the new node, within this job.
    """
    run = dict(identity["run"])
    deployment_id = dict(identity["deployment"])
    reps = list(identity["reps"])
    if not (len(reps) == len(traces) == len(manifests)):
        raise ValueError(
            f"block {run['arm']}/{run['engine']}/{run['condition']}: {len(reps)} reps, "
            f"{len(traces)} traces, {len(manifests)} manifests"
        )
    block = BlockPaths(Path(results_dir), run["arm"], run["engine"], run["condition"])
    if Path(block_json_path).resolve() != block.block_json.resolve():
        raise ValueError(f"block {block.block_id}: {block_json_path} is not {block.block_json}")
    settings = _settings(identity, operational)
    typed = Settings.from_config(settings)
    impl = get_backend(
        settings["backend"],
        gpu=settings["gpu"],
        model=settings["model"],
        kubernetes=settings["kubernetes"],
        sim=settings["sim"],
        node=node,
    )
    resolved = read_json(resolved_path, ("chunked_prefill", "chunk_size", "deployment_id"))
    deployment = backend_deployment(deployment_id)
    campaign = _Campaign(impl, settings, typed, deployment, resolved, Path(resolved_path).parent)
    items = [
        _BlockItem(block.run(rep), trace, manifest, _key(run, rep, deployment_id, trace, resolved))
        for rep, trace, manifest in zip(reps, traces, manifests, strict=True)
    ]
    block_faults = [
        dict(f) for f in faults if str(f.get("run", "")).startswith(block.block_id + "/")
    ]
    discards: list[str] = []
    while True:
        interrupted = campaign.measure_block(items, block_faults)
        if interrupted is None:
            break
        paths, reason, active = interrupted
        discards.append(_discard_block(block, [i.paths for i in items], paths, reason, active))
        if len(discards) >= MAX_RECLAMATIONS:
            raise RuntimeError(
                f"block {block.block_id}: node reclaimed {MAX_RECLAMATIONS} times; giving up"
            )
        log.warning("block %s: %s; every repetition is measured again", block.block_id, reason)
    record = {
        "block": block.block_id,
        "backend": settings["backend"],
        "deployment_id": resolved["deployment_id"],
        "reps": {
            item.paths.rep: {
                "status": read_run_json(item.paths.run_dir / "run.json")["status"],
                "measurement_key": item.key,
            }
            for item in items
        },
        "discarded": discards,
    }
    write_json(block.block_json, record)
    return record


def execute_run(
    *,
    settings: Mapping[str, Any],
    deployment: Mapping[str, Any],
    results_dir: str,
    trace_path: str,
    manifest_path: str,
    resolved_path: str,
    node: NodeSlot | None = None,
) -> dict[str, Any]:
    """One repetition as a block of its own (tests and scripts outside Snakemake): `settings` is
    the whole config-like mapping (backend, gpu, model, arm, engine, condition, rep,
    offered_load_rps and the dispatch, campaign, telemetry, kubernetes sections)."""
    config = {
        k: settings.get(k) for k in ("backend", "gpu", "model", "dispatch", "campaign", "sim")
    }
    config.update(telemetry=settings.get("telemetry"), kubernetes=settings.get("kubernetes"))
    run = {k: settings[k] for k in ("arm", "engine", "condition", "offered_load_rps")}
    block = BlockPaths(Path(results_dir), run["arm"], run["engine"], run["condition"])
    record = execute_block(
        identity={
            "deployment": deployment_identity(config, deployment),
            "run": run_identity(config, run),
            "reps": [settings["rep"]],
        },
        operational=operational_settings(config),
        faults=list(settings.get("faults", [])),
        results_dir=results_dir,
        traces=[trace_path],
        manifests=[manifest_path],
        resolved_path=resolved_path,
        block_json_path=str(block.block_json),
        node=node,
    )
    return read_run_json(block.run(settings["rep"]).run_dir / "run.json") | {"block": record}


def _settings(identity: Mapping[str, Any], operational: Mapping[str, Any]) -> dict[str, Any]:
    """The config-like mapping the backends and servelab.grid.settings read: identity and operational
    keys of each section merged back together."""
    run = identity["run"]
    out: dict[str, Any] = {k: run[k] for k in ("backend", "gpu", "model")}
    out["sim"] = run.get("sim")  # the simulated platform: identity, and on the sim backend only
    for section in ("dispatch", "campaign", "telemetry", "kubernetes"):
        out[section] = {**dict(operational.get(section, {})), **dict(run.get(section, {}))}
    out["offered_load_rps"] = run["offered_load_rps"]
    return out


def _key(
    run: Mapping[str, Any],
    rep: str,
    deployment: Mapping[str, Any],
    trace_path: str,
    resolved: Mapping[str, Any],
) -> str:
    return measurement_key(
        trace_sha256=file_sha256(trace_path),
        deployment=deployment,
        run={**dict(run), "rep": rep},
        resolved=resolved,
    )


def _sealed_key(paths: RunPaths) -> str | None:
    seal = paths.measured_dir / MEASUREMENT_KEY_FILE
    if not seal.is_file():
        return None
    if not all((paths.measured_dir / name).is_file() for name in RUN_FILES):
        return None
    return seal.read_text(encoding="utf-8").strip()


def _seal(paths: RunPaths, key: str) -> None:
    """Mark the measurement complete, then publish it under the run's final names."""
    write_text(paths.measured_dir / MEASUREMENT_KEY_FILE, key + "\n")
    _publish(paths)


def _publish(paths: RunPaths) -> None:
    """Hard-link the measured files to the declared outputs, run.json last.

    Links keep the measured files' identity, so a resumed campaign publishes a run it had already
    measured without touching it; each link is created under a temporary name and renamed.
    """
    for name in RUN_FILES:
        source = paths.measured_dir / name
        target = paths.run_dir / name
        tmp = paths.run_dir / f".{name}.publish"
        tmp.unlink(missing_ok=True)
        os.link(source, tmp)
        tmp.replace(target)


def _supersede(paths: RunPaths, old_key: str, new_key: str, backend: str) -> None:
    """A sealed measurement whose identity no longer matches. From a real engine it is moved
    aside with its reason (never deleted); a simulated one is reproducible and is dropped."""
    if backend == "sim":
        shutil.rmtree(paths.measured_dir)
        return
    root = paths.results_dir / "superseded" / paths.run_id
    target = next_generation_dir(root)
    shutil.move(str(paths.measured_dir), str(target / MEASURED_DIR))
    if (paths.run_dir / ATTEMPTS_DIR).is_dir():
        shutil.move(str(paths.run_dir / ATTEMPTS_DIR), str(target / ATTEMPTS_DIR))
    write_json(
        target / "reason.json",
        {
            "run_id": paths.run_id,
            "reason": "the measurement's identity changed",
            "measurement_key": old_key,
            "new_measurement_key": new_key,
            "superseded_at_unix_s": round(time.time(), 3),
        },
    )
    log.warning("run %s: identity changed; the old measurement is kept in %s", paths.run_id, target)


@dataclass(frozen=True)
class _BlockItem:
    paths: RunPaths
    trace_path: str
    manifest_path: str
    key: str


@dataclass(frozen=True)
class _Campaign:
    """What every attempt of every run of one block shares: the backend, settings and deployment.

    `settings` is the config-like mapping of the block's identity and operational settings;
    `typed` holds its sections as servelab.grid.settings reads them.
    """

    impl: Backend
    settings: Mapping[str, Any]
    typed: Settings
    deployment: Mapping[str, Any]
    resolved: Mapping[str, Any]
    deployment_dir: Path

    def measure_block(
        self, items: Sequence[_BlockItem], faults: Sequence[Mapping[str, Any]]
    ) -> tuple[RunPaths, str, list[dict[str, Any]]] | None:
        """Measure each repetition not yet sealed under its key, in order. Returns None when all
        are measured, or (the run, the reason, its active faults) when its node was reclaimed."""
        for item in items:
            paths = item.paths
            sealed = _sealed_key(paths)
            if sealed == item.key:
                # Measured by an invocation that was killed or forced again: keep it.
                log.info("run %s: already measured; publishing it", paths.run_id)
                _publish(paths)
                continue
            if sealed is not None:
                _supersede(paths, sealed, item.key, self.impl.name)
            pause = self.typed.campaign.pause_between_runs_s
            if pause > 0:
                log.info("pausing %.0f s between runs", pause)
                time.sleep(pause)
            run_faults = [dict(f) for f in faults if f.get("run") == paths.run_id]
            record, active = self.run_with_retries(
                paths, item.trace_path, item.manifest_path, run_faults
            )
            if record["status"] == "interrupted" and _was_reclaimed(record):
                return paths, _reclamation_reason(record), active
            _seal(paths, item.key)
            log.info(
                "run %s: status %s after %d attempt(s), %d/%d requests ok",
                paths.run_id,
                record["status"],
                record["attempt"],
                record["n_ok"],
                record["n_sent"],
            )
        return None

    def run_with_retries(
        self,
        paths: RunPaths,
        trace_path: str,
        manifest_path: str,
        faults: Sequence[Mapping[str, Any]],
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Attempts until one passes or the retries are spent; stops at a reclamation (the
        block then discards and repeats). Returns the last record and its active faults."""
        retries = self.typed.campaign.retries
        attempt = _previous_attempts(paths) + 1
        last_attempt = max(1 + retries, attempt)
        record: dict[str, Any] = {}
        active: list[dict[str, Any]] = []
        while attempt <= last_attempt:
            active = _active_faults(list(faults), paths, attempt)
            record = self.attempt(paths, trace_path, manifest_path, attempt, active)
            if record["status"] == "ok":
                break
            if record["status"] == "interrupted" and _was_reclaimed(record):
                break
            if attempt < last_attempt:
                _keep_failed_attempt(paths, attempt)
            attempt += 1
        return record, active

    def attempt(
        self,
        paths: RunPaths,
        trace_path: str,
        manifest_path: str,
        attempt: int,
        faults: list[dict[str, Any]],
    ) -> dict[str, Any]:
        out = paths.measured_dir
        resolved = self.resolved
        request = RunRequest(
            arm=paths.arm,
            engine=paths.engine,
            condition=paths.condition,
            rep=paths.rep,
            deployment=dict(self.deployment),
            resolved_config={
                k: resolved[k]
                for k in ("chunked_prefill", "chunk_size", *RESOLVED_EXTRAS)
                if k in resolved
            },
            trace_path=trace_path,
            manifest_path=manifest_path,
            offered_load_rps=float(self.settings["offered_load_rps"]),
            dispatch=self.typed.dispatch,
            telemetry=self.typed.telemetry,
            success_threshold=self.typed.campaign.success_threshold,
            attempt=attempt,
            faults=faults,
            requests_path=str(out / "requests.parquet"),
            scrape_path=str(out / "scrape.parquet"),
            run_json_path=str(out / "run.json"),
            deployment_dir=str(self.deployment_dir),
            # an engine the backend brings up again itself is confirmed by the one gate
            gate=gate,
        )
        log.info("run %s: attempt %d on backend %s", paths.run_id, attempt, self.impl.name)
        try:
            return self.impl.run(request)
        except Exception as exc:  # the engine or the backend broke: recorded, and retried
            log.exception("run %s: attempt %d raised", paths.run_id, attempt)
            return self.crash_record(request, out, exc)

    def crash_record(self, request: RunRequest, out: Path, exc: Exception) -> dict[str, Any]:
        """A backend that raised still leaves a complete (failed) record, so nothing is lost."""
        if not (out / "requests.parquet").is_file():
            write_parquet(out / "requests.parquet", REQUESTS_SCHEMA.empty_table())
        if not (out / "scrape.parquet").is_file():
            write_parquet(out / "scrape.parquet", SCRAPE_SCHEMA.empty_table())
        now = time.time()
        record = build_run_record(
            arm=request.arm,
            engine=request.engine,
            condition=request.condition,
            rep=request.rep,
            seed=int(read_json(request.manifest_path).get("seed", 0)),
            trace_sha256=file_sha256(request.trace_path),
            backend=self.impl.name,
            deployment_id=request.deployment["deployment_id"],
            resolved_config=request.resolved_config,
            start_unix_s=now,
            end_unix_s=now,
            offered_load_rps=request.offered_load_rps,
            requests=read_parquet(out / "requests.parquet", REQUESTS_SCHEMA),
            success_threshold=request.success_threshold,
            attempt=request.attempt,
            node={},
            extra={"error": f"{type(exc).__name__}: {exc}"},
        )
        record["status"] = "failed"
        write_json(out / "run.json", record)
        return record


def _previous_attempts(paths: RunPaths) -> int:
    """Attempts already kept from an earlier, interrupted invocation: numbering continues."""
    attempts = paths.run_dir / ATTEMPTS_DIR
    if not attempts.is_dir():
        return 0
    numbers = [
        int(p.name.split("-")[1])
        for p in attempts.glob("attempt-*")
        if p.name.split("-")[1].isdigit()
    ]
    return max(numbers, default=0)


def _keep_failed_attempt(paths: RunPaths, attempt: int) -> None:
    target = paths.run_dir / ATTEMPTS_DIR / f"attempt-{attempt}"
    target.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        source = paths.measured_dir / name
        if source.exists():
            source.replace(target / name)
    log.info("run %s: attempt %d failed; kept under %s", paths.run_id, attempt, target)


def _active_faults(
    faults: list[Mapping[str, Any]], paths: RunPaths, attempt: int
) -> list[dict[str, Any]]:
    """Injected faults for this attempt. A reclamation fires once: not again after its discard."""
    active = []
    for fault in faults:
        if fault["kind"] == "fail" and attempt > int(fault.get("attempts", 1)):
            continue
        if fault["kind"] == "reclaim" and _fault_already_fired(paths, fault):
            continue
        active.append(dict(fault))
    return active


def _fault_already_fired(paths: RunPaths, fault: Mapping[str, Any]) -> bool:
    for reason in paths.discard_root.glob("*/reason.json"):
        if dict(fault) in read_json(reason).get("faults", []):
            return True
    return False


def _was_reclaimed(record: Mapping[str, Any]) -> bool:
    node = record.get("node", {})
    return bool(record.get("reclaimed_reason")) or (
        isinstance(node, Mapping) and node.get("start") != node.get("end")
    )


def _reclamation_reason(record: Mapping[str, Any]) -> str:
    if record.get("reclaimed_reason"):
        return str(record["reclaimed_reason"])
    node = record["node"]
    return f"node changed during the run: {node.get('start')} -> {node.get('end')}"


def _discard_block(
    block: BlockPaths,
    reps: Sequence[RunPaths],
    interrupted: RunPaths,
    reason: str,
    faults: Sequence[Mapping[str, Any]],
) -> str:
    """Move every repetition of the block (its run folders, measured or not) into the next
    generation under results/discarded/{arm}/{engine}/{condition}/, with the reason. Returns the
    generation's folder name."""
    target = next_generation_dir(block.discard_root)
    moved: list[str] = []
    for paths in reps:
        owned = [paths.run_dir / name for name in (*RUN_FILES, MEASURED_DIR, ATTEMPTS_DIR)]
        if not any(p.exists() for p in owned):
            continue
        keep = target / paths.rep
        keep.mkdir()
        for source in owned:
            if source.exists():
                shutil.move(str(source), str(keep / source.name))
        # telemetry.parquet is the telemetry job's output: copied for the record, left in place
        # (that job derives it again from the repeated measurement).
        telemetry = paths.run_dir / "telemetry.parquet"
        if telemetry.is_file():
            shutil.copy2(telemetry, keep / telemetry.name)
        moved.append(paths.rep)
    write_json(
        target / "reason.json",
        {
            "reason": reason,
            "interrupted_run": interrupted.run_id,
            "discarded_reps": moved,
            "repeated_reps": [p.rep for p in reps],
            "faults": [dict(f) for f in faults],
            "discarded_at_unix_s": round(time.time(), 3),
        },
    )
    write_text(target / "REASON.txt", f"{reason}\ninterrupted run: {interrupted.run_id}\n")
    return target.name
