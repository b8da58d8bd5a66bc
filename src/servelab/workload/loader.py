"""Loading a trace for dispatch (simulator or live dispatcher): validate first, always.

`load_trace` refuses a trace unless
1. its manifest records all its checks as passed (the six; an imported trace's five: `checks_for`),
2. the trace file's SHA-256 equals the manifest's `trace_sha256` (the bytes the compiler validated), and
3. the checks pass again on the bytes just read (they are vectorised: well under a second for the largest
   trace of the grid; docs/benchmarks/trace_compile.md has the figures).
Only then does it return the rows, as `TraceRequest`s for the shared release logic, and their prompts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servelab.artifacts import (
    TRACE_SCHEMA,
    ArtifactError,
    file_sha256,
    read_parquet,
    read_trace_manifest,
)
from servelab.workload.release import ReleaseTracker, TraceRequest
from servelab.workload.validate import TokenColumn, TraceValidationError, checks_for, run_checks

__all__ = ["LoadedTrace", "Prompt", "load_trace"]


@dataclass(frozen=True)
class Prompt:
    """What is sent for one request: `text`, which tokenizes (without special tokens) to exactly `token_ids`."""

    text: str
    token_ids: np.ndarray  # int32, read-only view into the loaded column


@dataclass(frozen=True)
class LoadedTrace:
    """A validated trace: its manifest, its requests in trace order, and each request's prompt."""

    manifest: dict[str, Any]
    requests: tuple[TraceRequest, ...]
    prompts: dict[str, Prompt]
    trace_sha256: str

    @property
    def seed(self) -> int:
        return int(self.manifest["seed"])

    @property
    def prefix_tokens(self) -> int:
        """F: the shared prefix length in tokens."""
        return int(self.manifest["prefix_tokens"])

    @property
    def prompt_tokens(self) -> int:
        """L: tokens per prompt (the engines report L + 1 with their BOS)."""
        return int(self.manifest["prompt_tokens"])

    def tracker(self) -> ReleaseTracker:
        """A fresh release tracker over this trace's requests."""
        return ReleaseTracker(self.requests)


def load_trace(
    trace_path: str | os.PathLike[str], manifest_path: str | os.PathLike[str]
) -> LoadedTrace:
    """Validate and load a compiled trace. Raises TraceValidationError or ArtifactError naming the file."""
    manifest = read_trace_manifest(manifest_path)
    where = str(trace_path)
    recorded = manifest["checks"]
    names = checks_for(manifest)
    if not isinstance(recorded, dict) or any(recorded.get(name) is not True for name in names):
        failed = [n for n in names if not isinstance(recorded, dict) or recorded.get(n) is not True]
        raise TraceValidationError(
            where, {name: f"not recorded as passed in {manifest_path}" for name in failed}
        )
    expected = manifest.get("trace_sha256")
    if not isinstance(expected, str):
        raise ArtifactError(f"{manifest_path}: manifest field 'trace_sha256' is missing")
    if not Path(trace_path).is_file():
        raise ArtifactError(f"{trace_path}: no such file")
    actual = file_sha256(trace_path)
    if actual != expected:
        raise TraceValidationError(
            where,
            {
                "trace_sha256": f"file SHA-256 {actual} differs from the validated {expected} in {manifest_path}"
            },
        )
    table = read_parquet(trace_path, TRACE_SCHEMA)
    results = run_checks(table, manifest, where=f"{trace_path} with {manifest_path}")
    failures = {name: res.detail for name, res in results.items() if not res.ok}
    if failures:
        raise TraceValidationError(where, failures)

    ids = table.column("request_id").to_pylist()
    graph = table.column("graph_id").to_pylist()
    role = table.column("role").to_pylist()
    arrival = table.column("arrival_s").to_pylist()
    deps = table.column("depends_on").to_pylist()
    delay = table.column("tool_delay_s").to_pylist()
    caps = table.column("max_tokens").to_pylist()
    texts = table.column("prompt_text").to_pylist()
    tokens = TokenColumn(table)
    values = tokens.values.view()
    values.flags.writeable = False
    requests = tuple(
        TraceRequest(
            request_id=ids[r],
            graph_id=graph[r],
            role=role[r],
            arrival_s=arrival[r],
            depends_on=tuple(deps[r]),
            tool_delay_s=delay[r],
            max_tokens=caps[r],
        )
        for r in range(len(ids))
    )
    prompts = {
        ids[r]: Prompt(texts[r], values[tokens.offsets[r] : tokens.offsets[r + 1]])
        for r in range(len(ids))
    }
    return LoadedTrace(manifest=manifest, requests=requests, prompts=prompts, trace_sha256=actual)
