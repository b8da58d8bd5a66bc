"""Campaign semantics (study §5.4): deploy and gate, run with retries, discard on reclamation.

The Snakemake rules call these functions once per deployment and once per run. What differs
between backends is behind `servelab.deploy.Backend`; everything here is shared.

A run passes when its record is complete and at least `success_threshold` of its requests
succeeded. A failing run is retried up to `retries` times; each failed attempt's artifacts are kept
under `<run>/attempts/attempt-N/`. A run that still fails is recorded (status `failed`) and the
campaign goes on. When the node under a run is reclaimed, every repetition of that
(arm, engine, condition) is moved under `results/discarded/` with a reason file and repeated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servelab.artifacts import (
    REQUESTS_SCHEMA,
    SCRAPE_SCHEMA,
    file_sha256,
    read_json,
    read_parquet,
    read_run_json,
    write_json,
    write_parquet,
    write_text,
)
from servelab.deploy import Backend, RunRequest, get_backend
from servelab.deploy.kubernetes import KubernetesBackend
from servelab.deploy.manifests import render_deployment
from servelab.engines import check_resolved, parse_startup_log
from servelab.runrecord import build_run_record
from servelab.settings import Settings
from servelab.telemetry import canonicalize_files

__all__ = ["deploy", "execute_run", "render_manifests"]

log = logging.getLogger(__name__)

RUN_FILES = ("requests.parquet", "scrape.parquet", "run.json")
# Resolved-configuration fields copied from resolved.json into each run record.
RESOLVED_EXTRAS = ("prefix_caching", "context_len", "schedule_policy", "version")
MAX_RECLAMATIONS = 3


def render_manifests(
    *,
    deployment: Mapping[str, Any],
    namespace: str,
    kubernetes: Mapping[str, Any],
    manifest_path: str,
) -> None:
    """Render the deployment's Kubernetes objects (for every backend: shows what would be deployed)."""
    rendered = render_deployment(
        deployment_id=deployment["deployment_id"],
        engine=deployment["engine"],
        image=deployment["image"],
        port=deployment["port"],
        flags=list(deployment["flags"]),
        namespace=namespace,
        k8s_settings=kubernetes,
    )
    documents = [rendered[name].strip() + "\n" for name in sorted(rendered)]
    write_text(manifest_path, "---\n".join(documents))


def deploy(
    *,
    deployment: Mapping[str, Any],
    backend: str,
    gpu: Mapping[str, Any],
    model: Mapping[str, Any],
    kubernetes: Mapping[str, Any],
    manifest_path: str,
    startup_log_path: str,
    resolved_path: str,
) -> dict[str, Any]:
    """Bring the engine up, parse its start-up log and refuse a configuration the arm does not expect.

    The start-up log is kept whatever the outcome; `resolved.json` is written only when the gate
    passes, so no run of a refused deployment is measured.
    """
    impl = get_backend(backend, gpu=gpu, model=model, kubernetes=kubernetes)
    impl.deploy(deployment, manifest_path=manifest_path, startup_log_path=startup_log_path)
    text = Path(startup_log_path).read_text(encoding="utf-8", errors="replace")
    parsed = parse_startup_log(text, engine=deployment["engine"])
    check_resolved(
        parsed,
        expect_chunked_prefill=deployment["expect_chunked_prefill"],
        expect_chunk_size=deployment["expect_chunk_size"],
    )
    resolved = json.loads(parsed.to_json())
    resolved.update(deployment_id=deployment["deployment_id"], backend=backend)
    write_json(resolved_path, resolved)
    log.info(
        "deployment %s confirmed: chunked_prefill=%s chunk_size=%s",
        deployment["deployment_id"],
        parsed.chunked_prefill,
        parsed.chunk_size,
    )
    return resolved


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
        return self.run_dir / "measured"

    def sibling(self, rep: str) -> RunPaths:
        return RunPaths(self.results_dir, self.arm, self.engine, self.condition, rep)

    @property
    def discard_root(self) -> Path:
        return self.results_dir / "discarded" / self.arm / self.engine / self.condition

    @property
    def run_id(self) -> str:
        return f"{self.arm}/{self.engine}/{self.condition}/{self.rep}"


def execute_run(
    *,
    settings: Mapping[str, Any],
    deployment: Mapping[str, Any],
    results_dir: str,
    trace_path: str,
    manifest_path: str,
    resolved_path: str,
    requests_path: str,
    scrape_path: str,
    run_json_path: str,
) -> dict[str, Any]:
    """Measure one run; returns its final run record (written to `run_json_path`)."""
    paths = RunPaths(
        Path(results_dir),
        settings["arm"],
        settings["engine"],
        settings["condition"],
        settings["rep"],
    )
    expected_dir = Path(run_json_path).parent
    if expected_dir.resolve() != paths.run_dir.resolve():
        raise ValueError(
            f"run {paths.run_id}: outputs {expected_dir} are not under {paths.run_dir}"
        )
    resolved = read_json(resolved_path, ("chunked_prefill", "chunk_size", "deployment_id"))
    impl = get_backend(
        settings["backend"],
        gpu=settings["gpu"],
        model=settings["model"],
        kubernetes=settings.get("kubernetes"),
    )
    key = _measurement_key(settings, deployment, trace_path)
    record = _completed_measurement(paths, key)
    if record is not None:
        # Measured by an invocation that was killed before Snakemake recorded the job: keep it.
        log.info(
            "run %s: already measured (attempt %d); publishing it", paths.run_id, record["attempt"]
        )
        _publish(paths)
        return record
    typed = Settings.from_config(settings)
    pause = typed.campaign.pause_between_runs_s
    if pause > 0:
        log.info("pausing %.0f s between runs", pause)
        time.sleep(pause)

    campaign = _Campaign(impl, settings, typed, deployment, resolved)
    record = campaign.run_with_retries(paths, trace_path, manifest_path)
    if record.get("reclaimed"):
        raise RuntimeError(
            f"run {paths.run_id}: node reclaimed {MAX_RECLAMATIONS} times; giving up"
        )
    _seal(paths, key)
    log.info(
        "run %s: status %s after %d attempt(s), %d/%d requests ok",
        paths.run_id,
        record["status"],
        record["attempt"],
        record["n_ok"],
        record["n_sent"],
    )
    del requests_path, scrape_path  # published with run.json, under the run directory
    return record


def _measurement_key(
    settings: Mapping[str, Any], deployment: Mapping[str, Any], trace_path: str
) -> str:
    """What determines a measurement: the trace's bytes, the deployment and the run settings."""
    identity = {
        "trace_sha256": file_sha256(trace_path),
        "deployment": dict(deployment),
        "settings": {k: v for k, v in settings.items() if k != "faults"},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def _completed_measurement(paths: RunPaths, key: str) -> dict[str, Any] | None:
    """The sealed measurement of an earlier invocation with the same key, if any."""
    seal = paths.measured_dir / "measurement.key"
    if not seal.is_file() or seal.read_text(encoding="utf-8").strip() != key:
        return None
    if not all((paths.measured_dir / name).is_file() for name in RUN_FILES):
        return None
    return read_run_json(paths.measured_dir / "run.json")


def _seal(paths: RunPaths, key: str) -> None:
    """Mark the measurement complete, then publish it under the run's final names."""
    write_text(paths.measured_dir / "measurement.key", key + "\n")
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


@dataclass(frozen=True)
class _Campaign:
    """What every attempt of every run of one job shares: the backend, settings and deployment.

    `settings` is the run's settings as the workflow passes them (they key the sealed
    measurement); `typed` holds their sections as servelab.settings reads them.
    """

    impl: Backend
    settings: Mapping[str, Any]
    typed: Settings
    deployment: Mapping[str, Any]
    resolved: Mapping[str, Any]

    def run_with_retries(
        self, paths: RunPaths, trace_path: str, manifest_path: str
    ) -> dict[str, Any]:
        retries = self.typed.campaign.retries
        reclamations = 0
        attempt = _previous_attempts(paths) + 1
        last_attempt = max(1 + retries, attempt)
        record: dict[str, Any] = {}
        while attempt <= last_attempt:
            faults = _active_faults(self.settings.get("faults", []), paths, attempt)
            record = self.attempt(paths, trace_path, manifest_path, attempt, faults)
            if record["status"] == "ok":
                return record
            if record["status"] == "interrupted" and _was_reclaimed(record):
                reclamations += 1
                reason = _reclamation_reason(record)
                log.warning(
                    "run %s: %s; discarding every repetition of the condition", paths.run_id, reason
                )
                repeated = _discard_condition(paths, reason, faults)
                if reclamations >= MAX_RECLAMATIONS:
                    return {**record, "reclaimed": True}
                # Repeat the repetitions that had completed, on the new node, before this one.
                for sibling in repeated:
                    self.rerun_sibling(sibling, trace_path)
                attempt, last_attempt = 1, 1 + retries
                continue
            if attempt < last_attempt:
                _keep_failed_attempt(paths, attempt)
            attempt += 1
        return record

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

    def rerun_sibling(self, sibling: RunPaths, trace_path: str) -> None:
        """Repeat a completed sibling repetition on the new node, including its telemetry table."""
        trace_dir = Path(trace_path).parent.parent / sibling.rep
        sibling_trace = str(trace_dir / "trace.parquet")
        campaign = replace(self, settings={**self.settings, "rep": sibling.rep, "faults": []})
        record = campaign.run_with_retries(sibling, sibling_trace, str(trace_dir / "manifest.json"))
        _seal(sibling, _measurement_key(campaign.settings, self.deployment, sibling_trace))
        canonicalize_files(
            engine=sibling.engine,
            step_s=self.typed.telemetry.step_s,
            scrape_path=str(sibling.run_dir / "scrape.parquet"),
            run_json_path=str(sibling.run_dir / "run.json"),
            telemetry_path=str(sibling.run_dir / "telemetry.parquet"),
        )
        log.info("repeated %s after reclamation: status %s", sibling.run_id, record["status"])


def _previous_attempts(paths: RunPaths) -> int:
    """Attempts already kept from an earlier, interrupted invocation: numbering continues."""
    attempts = paths.run_dir / "attempts"
    if not attempts.is_dir():
        return 0
    numbers = [
        int(p.name.split("-")[1])
        for p in attempts.glob("attempt-*")
        if p.name.split("-")[1].isdigit()
    ]
    return max(numbers, default=0)


def _keep_failed_attempt(paths: RunPaths, attempt: int) -> None:
    target = paths.run_dir / "attempts" / f"attempt-{attempt}"
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


def _discard_condition(
    paths: RunPaths, reason: str, faults: list[dict[str, Any]]
) -> list[RunPaths]:
    """Move every repetition of (arm, engine, condition) under results/discarded/; return the
    sibling runs that had completed (they must be repeated)."""
    root = paths.discard_root
    root.mkdir(parents=True, exist_ok=True)
    generation = 1 + max((int(p.name) for p in root.iterdir() if p.name.isdigit()), default=0)
    target = root / f"{generation:03d}"
    target.mkdir()
    moved: list[str] = []
    completed: list[RunPaths] = []
    run_parent = paths.run_dir.parent
    for rep_dir in sorted(p for p in run_parent.iterdir() if p.is_dir()):
        sibling = paths.sibling(rep_dir.name)
        finished = (rep_dir / "run.json").is_file() and rep_dir.name != paths.rep
        shutil.move(str(rep_dir), str(target / rep_dir.name))
        moved.append(rep_dir.name)
        if finished:
            completed.append(sibling)
    write_json(
        target / "reason.json",
        {
            "reason": reason,
            "interrupted_run": paths.run_id,
            "discarded_reps": moved,
            "repeated_reps": [s.rep for s in completed],
            "faults": faults,
            "discarded_at_unix_s": round(time.time(), 3),
        },
    )
    write_text(target / "REASON.txt", f"{reason}\ninterrupted run: {paths.run_id}\n")
    return completed


def restart_experiment(
    *,
    deployment: Mapping[str, Any],
    backend: str,
    kubernetes: Mapping[str, Any],
    rep: str,
    manifest_path: str,
    record_path: str,
) -> dict[str, Any]:
    """Restart the engine's pod once and record the event timeline (study §7.5, Fig. 14)."""
    if backend != "kubernetes":
        raise ValueError(
            f"the restart experiment restarts real pods: backend {backend!r} has none "
            "(run it with --config backend=kubernetes)"
        )
    impl = KubernetesBackend.from_settings(kubernetes)
    return impl.restart_timeline(deployment["deployment_id"], manifest_path, record_path, rep=rep)
