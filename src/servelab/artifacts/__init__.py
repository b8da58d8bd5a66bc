"""Artifact schemas, atomic writers and validating readers (docs/architecture.md, "Artifacts").

Everything that writes or reads a run goes through this package, so the schemas live in one place.
Beside the schemas, writers and readers (here): `runrecord` builds a run's `run.json` record from
its requests table, for every backend; `provenance` is the version and git commit it records.
Every writer puts its bytes under a temporary name in the destination folder and renames it into
place: a killed process never leaves a half-written file under a final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ATTEMPTS_DIR",
    "GPU_TELEMETRY_METRICS",
    "MEASURED_DIR",
    "MEASUREMENT_KEY_FILE",
    "REQUESTS_SCHEMA",
    "REQUEST_STATUSES",
    "RESTART_EVENTS",
    "RESTART_PHASES",
    "RUN_FILES",
    "RUN_JSON_REQUIRED",
    "RUN_STATUSES",
    "SCRAPE_SCHEMA",
    "TELEMETRY_METRICS",
    "TELEMETRY_SCHEMA",
    "TRACE_MANIFEST_REQUIRED",
    "TRACE_SCHEMA",
    "ArtifactError",
    "atomic_path",
    "file_sha256",
    "next_generation_dir",
    "read_json",
    "read_parquet",
    "read_run_json",
    "read_trace_manifest",
    "restart_events_out_of_order",
    "restart_phases",
    "write_json",
    "write_parquet",
    "write_text",
]


class ArtifactError(ValueError):
    """An artifact is missing, unreadable or does not match its schema. The message names the file."""


# The Parquet schemas are built on first use (PEP 562): pyarrow costs a tenth of a second to import,
# which the Snakefile's parse and every job that writes no Parquet would otherwise pay.
if TYPE_CHECKING:
    TRACE_SCHEMA: pa.Schema
    REQUESTS_SCHEMA: pa.Schema
    TELEMETRY_SCHEMA: pa.Schema
    SCRAPE_SCHEMA: pa.Schema


def _schemas() -> dict[str, pa.Schema]:
    import pyarrow as pa

    trace = pa.schema(
        [
            pa.field("request_id", pa.string(), nullable=False),
            pa.field("graph_id", pa.int32(), nullable=False),
            pa.field("role", pa.string(), nullable=False),
            pa.field("arrival_s", pa.float64(), nullable=False),
            pa.field("depends_on", pa.list_(pa.string()), nullable=False),
            pa.field("tool_delay_s", pa.float64(), nullable=False),
            pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
            pa.field("prompt_text", pa.string(), nullable=False),
            pa.field("prefix_tokens", pa.int32(), nullable=False),
            pa.field("max_tokens", pa.int32(), nullable=False),
        ]
    )

    requests = pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("request_id", pa.string(), nullable=False),
            pa.field("graph_id", pa.int32(), nullable=False),
            pa.field("role", pa.string(), nullable=False),
            pa.field("warmup", pa.bool_(), nullable=False),
            pa.field("scheduled_s", pa.float64(), nullable=False),
            pa.field("sent_s", pa.float64()),
            pa.field("written_s", pa.float64()),
            pa.field("chunk_times_s", pa.list_(pa.float64()), nullable=False),
            pa.field("chunk_tokens", pa.list_(pa.int32()), nullable=False),
            pa.field("prompt_tokens", pa.int32()),
            pa.field("output_tokens", pa.int32()),
            pa.field("max_tokens", pa.int32(), nullable=False),
            pa.field("status", pa.string(), nullable=False),
            pa.field("error", pa.string()),
        ]
    )

    telemetry = pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("t_s", pa.float64(), nullable=False),
            pa.field("metric", pa.string(), nullable=False),
            pa.field("value", pa.float64(), nullable=False),
            pa.field("source_metric", pa.string(), nullable=False),
        ]
    )

    # Raw engine-metric samples for one run's window, under the engine's own metric names: what the
    # backend's metrics store holds (the simulator's sampler, or Prometheus for the live backends).
    scrape = pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("t_s", pa.float64(), nullable=False),
            pa.field("source_metric", pa.string(), nullable=False),
            pa.field("value", pa.float64(), nullable=False),
        ]
    )
    return {
        "TRACE_SCHEMA": trace,
        "REQUESTS_SCHEMA": requests,
        "TELEMETRY_SCHEMA": telemetry,
        "SCRAPE_SCHEMA": scrape,
    }


def __getattr__(name: str) -> pa.Schema:
    # only a schema's name builds them (an unknown attribute, e.g. from hasattr, imports nothing)
    if name.endswith("_SCHEMA"):
        schemas = _schemas()
        globals().update(schemas)
        if name in schemas:
            return schemas[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TELEMETRY_METRICS = (
    "kv_cache_usage",
    "requests_running",
    "requests_waiting",
    "preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_hit_rate",
    # Prompt tokens served from the prefix cache (a counter; llama.cpp's only, so far).
    "prompt_tokens_cached_total",
)
# The engine GPU's series in telemetry.parquet, beside the engine's own: its energy counter (mJ,
# since the driver was loaded) and its power (W), from DCGM; only the kubernetes backend has them
# (servelab.telemetry.canonical.GPU_METRIC_MAP), and only when they cover the run's window.
GPU_TELEMETRY_METRICS = ("gpu_energy_mj", "gpu_power_w")
REQUEST_STATUSES = ("ok", "error", "timeout")
RUN_STATUSES = ("ok", "failed", "interrupted")

# restart.json (Fig. 14): the events of an engine restart, in the order they happen; the record
# holds each one's time (written by servelab.deploy.restart, read by servelab.analysis.restarts).
RESTART_EVENTS = (
    "deleted",
    "terminated",
    "scheduled",
    "pull_started",
    "pulled",
    "container_started",
    "ready",
)
# Figure 14's phases of a restart, each the time between two events (`unmeasured` is what the
# four measured phases leave of the total, ready - deleted).
RESTART_PHASES = ("terminate", "schedule", "image_pull", "unmeasured", "initialise")


def restart_phases(events: Mapping[str, float]) -> dict[str, float]:
    """The RESTART_PHASES and `total` (seconds) from the RESTART_EVENTS times (unix seconds)."""
    measured = {
        "terminate": events["terminated"] - events["deleted"],
        "schedule": events["scheduled"] - events["terminated"],
        "image_pull": events["pulled"] - events["pull_started"],
        "initialise": events["ready"] - events["container_started"],
    }
    total = events["ready"] - events["deleted"]
    return {**measured, "unmeasured": total - sum(measured.values()), "total": total}


def restart_events_out_of_order(events: Mapping[str, float]) -> tuple[str, str] | None:
    """The first pair of consecutive RESTART_EVENTS (earlier, later) whose times are reversed."""
    for earlier, later in itertools.pairwise(RESTART_EVENTS):
        if events[later] < events[earlier]:
            return earlier, later
    return None


ROLES = ("planner", "worker", "aggregator")

TRACE_MANIFEST_REQUIRED = (
    "condition",
    "rep",
    "seed",
    "rate",
    "sharing",
    "prompt_tokens",
    "duration_s",
    "tokenizer",
    "prefix_text",
    "prefix_sha256",
    "achieved_sharing",
    "n_graphs",
    "n_requests",
    "checks",
)

RUN_JSON_REQUIRED = (
    "run_id",
    "arm",
    "engine",
    "condition",
    "rep",
    "seed",
    "trace_sha256",
    "backend",
    "deployment_id",
    "resolved_config",
    "start_unix_s",
    "end_unix_s",
    "offered_load_rps",
    "n_sent",
    "n_ok",
    "n_failed",
    "success_fraction",
    "status",
    "attempt",
    "node",
    "dispatcher_lag_s",
    "servelab_version",
    "git_commit",
)


# --------------------------------------------------------------------------- atomic writes


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `final`; on success fsync and rename it into place.

    On any exception the temporary file is removed and `final` is left untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.chmod(0o644)  # mkstemp creates 0600; artifacts are meant to be shared
    try:
        yield tmp
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        tmp.replace(final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# A run folder's layout (docs/architecture.md, "Measured, attempts and discarded runs"): the
# files its block job publishes, the sealed measurement's folder and key, the failed attempts.
RUN_FILES = ("requests.parquet", "scrape.parquet", "run.json")
MEASURED_DIR = "measured"
MEASUREMENT_KEY_FILE = "measurement.key"
ATTEMPTS_DIR = "attempts"


def next_generation_dir(root: str | os.PathLike[str]) -> Path:
    """The next free NNN folder under `root` (001, 002, ...), created: where a moved-aside
    measurement (discarded, superseded, redone) or a kept start-up log goes. Creating it claims it,
    so two writers never share one."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    number = 1 + max((int(p.name) for p in root.iterdir() if p.name.isdigit()), default=0)
    while True:
        folder = root / f"{number:03d}"
        try:
            folder.mkdir()
        except FileExistsError:
            number += 1
            continue
        return folder


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON deterministically (sorted keys, fixed indent, trailing newline)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_parquet(
    path: str | os.PathLike[str], table: pa.Table, schema: pa.Schema | None = None
) -> None:
    """Write a table atomically, cast to `schema` first when given.

    Written without pandas metadata and with fixed options, so equal tables give equal bytes.
    """
    import pyarrow.parquet as pq

    if schema is not None:
        table = conform(table, schema, what=str(path))
    table = table.replace_schema_metadata(None)
    with atomic_path(path) as tmp:
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            use_dictionary=True,
            write_statistics=False,
            store_schema=False,
        )


# Nullable columns added to a schema after artifacts had been written without them: such an
# artifact reads with the column all null (requests.parquet's on-wire time came with issue 23).
ADDED_COLUMNS = frozenset({"written_s"})


def conform(table: pa.Table, schema: pa.Schema, what: str) -> pa.Table:
    """Select and cast `table`'s columns to `schema`, naming `what` in any error."""
    import pyarrow as pa

    for field in schema:
        if field.name in ADDED_COLUMNS and field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ArtifactError(f"{what}: missing column(s) {', '.join(missing)}")
    try:
        table = table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise ArtifactError(f"{what}: does not match its schema: {exc}") from exc
    for field in schema:
        if not field.nullable and table.column(field.name).null_count:
            raise ArtifactError(f"{what}: column {field.name!r} has null values")
    return table


# --------------------------------------------------------------------------- reads


def read_parquet(path: str | os.PathLike[str], schema: pa.Schema) -> pa.Table:
    """Read a Parquet artifact and check it against `schema`; errors name the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ArtifactError(f"{path}: not a readable Parquet file ({exc})") from exc
    return conform(table, schema, what=str(path))


def read_json(path: str | os.PathLike[str], required: Sequence[str] = ()) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(obj, Mapping):
        raise ArtifactError(f"{path}: expected a JSON object")
    missing = [k for k in required if k not in obj]
    if missing:
        raise ArtifactError(f"{path}: missing field(s) {', '.join(missing)}")
    return dict(obj)


def read_run_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    run = read_json(path, RUN_JSON_REQUIRED)
    if run["status"] not in RUN_STATUSES:
        raise ArtifactError(f"{path}: status {run['status']!r} is not one of {RUN_STATUSES}")
    resolved = run["resolved_config"]
    if not isinstance(resolved, Mapping) or not {"chunked_prefill", "chunk_size"} <= set(resolved):
        raise ArtifactError(f"{path}: resolved_config needs chunked_prefill and chunk_size")
    return run


def read_trace_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    return read_json(path, TRACE_MANIFEST_REQUIRED)


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
