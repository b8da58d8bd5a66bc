"""The trace validator: the six checks of docs/workload.md (study §3.5). A trace failing any is not dispatched.

Checks, by name (each passes or fails on the whole trace; a failure names the first offending request or graph):

``prefix_sha256``
    The manifest's `prefix_text` hashes (SHA-256 of its UTF-8 bytes) to its `prefix_sha256`; every row's
    `prefix_tokens` is the manifest's F; every prompt text starts with `prefix_text`; every prompt's first F ids
    are the same ids, and those hash (SHA-256 of little-endian int32) to the manifest's `prefix_ids_sha256`.
``achieved_sharing``
    Measured on the realised ids: F_shared is the length of the longest common prefix of all prompts (for a
    one-prompt trace, its `prefix_tokens`); each prompt's σ_r = F_shared / len_r must satisfy
    |σ_r − sharing| ≤ 0.01 (an absolute tolerance: "within 1%" read as one percentage point), and the manifest's
    `achieved_sharing` must equal the mean σ_r.
``suffixes_distinct``
    Every prompt has a non-empty suffix after the F prefix ids, and no two suffixes are equal.
``graphs_acyclic_resolvable``
    Request ids are unique, roles known, every `depends_on` id exists in the same graph, the dependency graph has
    no cycle (every request is reachable from a request without predecessors), and the manifest's `n_requests`
    and `n_graphs` match the table.
``arrivals_ordered``
    Arrival times are finite and in [0, duration_s); graph ids run 0..G−1 in row order (rows of a graph are
    contiguous, planner first, aggregator last); all requests of a graph share its arrival; graph arrivals are
    non-decreasing in graph id.
``tool_delays_bounded``
    Every tool delay is finite and in [0, workload.tool_delay.max_s]; requests other than workers have none.

All checks are vectorised or linear in the number of requests, so the loader runs them before every dispatch.
With ``retokenize=True`` a seventh entry, ``tokenization_exact``, re-encodes every prompt text with the
manifest's tokenizer and compares it with the stored ids (what the compiler already verified for every prompt).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from servelab.artifacts import TRACE_SCHEMA, ArtifactError, read_parquet, read_trace_manifest
from servelab.workload.tokenizer import encode_batch, load_tokenizer
from servelab.workload.topology import ROLE_ORDER

__all__ = [
    "CHECKS",
    "SHARING_TOLERANCE",
    "CheckResult",
    "TokenColumn",
    "TraceValidationError",
    "check_results",
    "check_trace",
    "manifest_value",
    "measure_sharing",
    "prefix_ids_sha256",
    "run_checks",
    "validate_trace",
]

CHECKS = (
    "prefix_sha256",
    "achieved_sharing",
    "suffixes_distinct",
    "graphs_acyclic_resolvable",
    "arrivals_ordered",
    "tool_delays_bounded",
)
SHARING_TOLERANCE = 0.01
_ACHIEVED_EPS = 1e-9


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str = ""  # empty when ok; otherwise what failed, naming the request or graph


class TraceValidationError(ValueError):
    """A trace failed validation. `failures` maps each failed check's name to what failed."""

    def __init__(self, where: str, failures: Mapping[str, str]) -> None:
        self.where = where
        self.failures = dict(failures)
        lines = "\n  ".join(f"{name}: {detail}" for name, detail in self.failures.items())
        super().__init__(f"{where}: trace failed validation:\n  {lines}")


def prefix_ids_sha256(ids: np.ndarray) -> str:
    """SHA-256 of token ids as little-endian int32 bytes."""
    return hashlib.sha256(np.asarray(ids).astype("<i4").tobytes()).hexdigest()


def manifest_value(manifest: Mapping[str, Any], key: str, where: str) -> Any:
    """`manifest[a][b]...` for dotted `key`, or an ArtifactError naming the file and the key."""
    node: Any = manifest
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ArtifactError(f"{where}: manifest field {key!r} is missing")
        node = node[part]
    return node


class TokenColumn:
    """The prompt_token_ids column as flat numpy values and offsets (no per-token Python objects)."""

    def __init__(self, table: pa.Table) -> None:
        col = table.column("prompt_token_ids").combine_chunks()
        if isinstance(col, pa.ChunkedArray):  # an empty table combines to an empty chunked array
            col = pa.array([], type=TRACE_SCHEMA.field("prompt_token_ids").type)
        self.offsets = col.offsets.to_numpy().astype(np.int64)
        self.values: np.ndarray = col.values.to_numpy(zero_copy_only=False)
        self.lengths = np.diff(self.offsets)
        self.n = int(self.lengths.size)
        uniform = self.n > 0 and bool(np.all(self.lengths == self.lengths[0]))
        self.matrix: np.ndarray | None = None
        if uniform:
            start, stop = int(self.offsets[0]), int(self.offsets[-1])
            self.matrix = self.values[start:stop].reshape(self.n, int(self.lengths[0]))

    def row(self, r: int) -> np.ndarray:
        return self.values[self.offsets[r] : self.offsets[r + 1]]


def measure_sharing(tokens: TokenColumn, prefix_tokens: np.ndarray) -> tuple[int, np.ndarray]:
    """(F_shared, per-prompt σ_r): the longest common prefix of all prompts over each prompt's length."""
    if tokens.n == 0:
        return 0, np.empty(0)
    if tokens.n == 1:
        shared = int(min(int(prefix_tokens[0]), tokens.lengths[0]))
    elif tokens.matrix is not None:
        same = np.all(tokens.matrix == tokens.matrix[0], axis=0)
        shared = int(np.argmin(same)) if not same.all() else int(same.size)
    else:
        first = tokens.row(0)
        shared = int(tokens.lengths.min())
        for r in range(1, tokens.n):
            diff = np.flatnonzero(tokens.row(r)[:shared] != first[:shared])
            if diff.size:
                shared = int(diff[0])
    lengths = np.maximum(tokens.lengths, 1)
    return shared, shared / lengths


def _check_prefix(
    table: pa.Table, tokens: TokenColumn, manifest: Mapping[str, Any], where: str
) -> str:
    ids = table.column("request_id").to_pylist()
    text = manifest_value(manifest, "prefix_text", where)
    f = manifest_value(manifest, "prefix_tokens", where)
    if not isinstance(text, str):
        return "manifest prefix_text is not a string"
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != manifest_value(
        manifest, "prefix_sha256", where
    ):
        return "the manifest's prefix_text does not hash to its prefix_sha256"
    if isinstance(f, bool) or not isinstance(f, int) or f < 0:
        return f"manifest prefix_tokens {f!r} is not a non-negative integer"
    column_f = table.column("prefix_tokens").to_numpy()
    wrong = np.flatnonzero(column_f != f)
    if wrong.size:
        r = int(wrong[0])
        return f"request {ids[r]}: prefix_tokens {int(column_f[r])} != manifest prefix_tokens {f}"
    short = np.flatnonzero(tokens.lengths < f)
    if short.size:
        r = int(short[0])
        return f"request {ids[r]}: {int(tokens.lengths[r])} token ids, fewer than the prefix's {f}"
    starts = pc.starts_with(table.column("prompt_text"), pattern=text).to_numpy(
        zero_copy_only=False
    )
    wrong = np.flatnonzero(~starts)
    if wrong.size:
        return f"request {ids[int(wrong[0])]}: prompt_text does not start with the manifest prefix_text"
    if tokens.n == 0:
        return ""
    ref = tokens.row(0)[:f]
    if tokens.matrix is not None:
        wrong = np.flatnonzero(~np.all(tokens.matrix[:, :f] == ref, axis=1))
    else:
        wrong = np.asarray(
            [r for r in range(tokens.n) if not np.array_equal(tokens.row(r)[:f], ref)]
        )
    if wrong.size:
        return (
            f"request {ids[int(wrong[0])]}: its first {f} token ids differ from request {ids[0]}'s"
        )
    if prefix_ids_sha256(ref) != manifest_value(manifest, "prefix_ids_sha256", where):
        return "the prompts' first F token ids do not hash to the manifest's prefix_ids_sha256"
    return ""


def _check_sharing(
    table: pa.Table, tokens: TokenColumn, manifest: Mapping[str, Any], where: str
) -> str:
    target = float(manifest_value(manifest, "sharing", where))
    recorded = manifest_value(manifest, "achieved_sharing", where)
    if tokens.n == 0:
        return "the trace has no prompts"
    shared, sigma = measure_sharing(tokens, table.column("prefix_tokens").to_numpy())
    dev = np.abs(sigma - target)
    worst = int(np.argmax(dev))
    if dev[worst] > SHARING_TOLERANCE:
        rid = table.column("request_id")[worst].as_py()
        return (
            f"request {rid}: achieved sharing {sigma[worst]:.6f} ({shared} shared of "
            f"{int(tokens.lengths[worst])} tokens) is more than {SHARING_TOLERANCE} from the target {target}"
        )
    mean = float(np.mean(sigma))
    if not isinstance(recorded, int | float) or abs(float(recorded) - mean) > _ACHIEVED_EPS:
        return f"manifest achieved_sharing {recorded!r} != measured {mean!r}"
    return ""


def _check_suffixes(
    table: pa.Table, tokens: TokenColumn, manifest: Mapping[str, Any], where: str
) -> str:
    f = int(manifest_value(manifest, "prefix_tokens", where))
    ids = table.column("request_id").to_pylist()
    seen: dict[bytes, int] = {}
    for r in range(tokens.n):
        suffix = tokens.row(r)[f:]
        if suffix.size == 0:
            return f"request {ids[r]}: empty suffix (no token after the {f}-token prefix)"
        key = suffix.tobytes()
        if key in seen:
            return f"request {ids[r]}: same suffix as request {ids[seen[key]]}"
        seen[key] = r
    return ""


def _check_graphs(table: pa.Table, manifest: Mapping[str, Any], where: str) -> str:
    ids = table.column("request_id").to_pylist()
    graphs = table.column("graph_id").to_pylist()
    roles = table.column("role").to_pylist()
    deps = table.column("depends_on").to_pylist()
    if not ids:
        return "the trace has no requests"
    index: dict[str, int] = {}
    for r, rid in enumerate(ids):
        if rid in index:
            return f"request id {rid} appears twice (rows {index[rid]} and {r})"
        index[rid] = r
    waiting = [0] * len(ids)
    dependents: list[list[int]] = [[] for _ in ids]
    for r, rid in enumerate(ids):
        if roles[r] not in ROLE_ORDER:
            return f"request {rid}: unknown role {roles[r]!r}"
        for dep in deps[r]:
            if dep not in index:
                return f"request {rid} (graph {graphs[r]}): depends on unknown request {dep}"
            if dep == rid:
                return f"request {rid} (graph {graphs[r]}): depends on itself"
            d = index[dep]
            if graphs[d] != graphs[r]:
                return f"request {rid} (graph {graphs[r]}): depends on {dep} of graph {graphs[d]}"
            dependents[d].append(r)
        waiting[r] = len(deps[r])
    ready = [r for r in range(len(ids)) if waiting[r] == 0]
    resolved = 0
    while ready:
        r = ready.pop()
        resolved += 1
        for d in dependents[r]:
            waiting[d] -= 1
            if waiting[d] == 0:
                ready.append(d)
    if resolved != len(ids):
        stuck = next(r for r in range(len(ids)) if waiting[r] > 0)
        return (
            f"graph {graphs[stuck]}: request {ids[stuck]} is never released "
            f"(a dependency cycle; {len(ids) - resolved} request(s) unreachable)"
        )
    n_requests = manifest_value(manifest, "n_requests", where)
    n_graphs = manifest_value(manifest, "n_graphs", where)
    if n_requests != len(ids):
        return f"manifest n_requests {n_requests!r} != {len(ids)} rows"
    if n_graphs != len(set(graphs)):
        return f"manifest n_graphs {n_graphs!r} != {len(set(graphs))} graphs in the trace"
    return ""


def _check_arrivals(table: pa.Table, manifest: Mapping[str, Any], where: str) -> str:
    duration = float(manifest_value(manifest, "duration_s", where))
    ids = table.column("request_id").to_pylist()
    g = table.column("graph_id").to_numpy().astype(np.int64)
    arrival = table.column("arrival_s").to_numpy()
    roles = table.column("role").to_pylist()
    if not ids:
        return "the trace has no requests"
    bad = np.flatnonzero(~np.isfinite(arrival) | (arrival < 0) | (arrival >= duration))
    if bad.size:
        r = int(bad[0])
        return f"request {ids[r]}: arrival {arrival[r]!r} s is outside [0, {duration}) s"
    if g[0] != 0:
        return f"request {ids[0]}: the first row belongs to graph {int(g[0])}, not graph 0"
    step = np.diff(g)
    bad = np.flatnonzero((step != 0) & (step != 1))
    if bad.size:
        r = int(bad[0]) + 1
        return f"request {ids[r]}: graph {int(g[r])} follows graph {int(g[r - 1])} (graph ids must run 0, 1, ...)"
    starts = np.concatenate([[0], np.flatnonzero(step) + 1])
    first_arrival = arrival[starts]
    bad = np.flatnonzero(arrival != first_arrival[g])
    if bad.size:
        r = int(bad[0])
        return (
            f"graph {int(g[r])}: request {ids[r]} arrives at {arrival[r]!r} s, not with its graph"
        )
    bad = np.flatnonzero(np.diff(first_arrival) < 0)
    if bad.size:
        k = int(bad[0]) + 1
        return (
            f"graph {k} arrives at {first_arrival[k]!r} s, before graph {k - 1} "
            f"({first_arrival[k - 1]!r} s)"
        )
    order = np.asarray([ROLE_ORDER.get(role, -1) for role in roles])
    bad = np.flatnonzero((np.diff(order) < 0) & (step == 0))
    if bad.size:
        r = int(bad[0]) + 1
        return f"graph {int(g[r])}: request {ids[r]} ({roles[r]}) is out of role order"
    return ""


def _check_delays(table: pa.Table, manifest: Mapping[str, Any], where: str) -> str:
    max_s = float(manifest_value(manifest, "workload.tool_delay.max_s", where))
    ids = table.column("request_id").to_pylist()
    delay = table.column("tool_delay_s").to_numpy()
    worker = np.asarray(table.column("role").to_pylist(), dtype=object) == "worker"
    bad = np.flatnonzero(~np.isfinite(delay) | (delay < 0) | (delay > max_s))
    if bad.size:
        r = int(bad[0])
        return f"request {ids[r]}: tool delay {delay[r]!r} s is outside [0, {max_s}] s"
    bad = np.flatnonzero(~worker & (delay != 0))
    if bad.size:
        r = int(bad[0])
        return f"request {ids[r]}: a non-worker request has tool delay {delay[r]!r} s"
    return ""


def run_checks(
    table: pa.Table, manifest: Mapping[str, Any], where: str = "trace"
) -> dict[str, CheckResult]:
    """Run the six checks on a TRACE_SCHEMA table against its manifest; `where` names the files in messages."""
    tokens = TokenColumn(table)
    details = {
        "prefix_sha256": _check_prefix(table, tokens, manifest, where),
        "achieved_sharing": _check_sharing(table, tokens, manifest, where),
        "suffixes_distinct": _check_suffixes(table, tokens, manifest, where),
        "graphs_acyclic_resolvable": _check_graphs(table, manifest, where),
        "arrivals_ordered": _check_arrivals(table, manifest, where),
        "tool_delays_bounded": _check_delays(table, manifest, where),
    }
    return {name: CheckResult(name, not details[name], details[name]) for name in CHECKS}


def _retokenize(table: pa.Table, tokenizer: str) -> str:
    tok = load_tokenizer(tokenizer)
    tokens = TokenColumn(table)
    ids = table.column("request_id").to_pylist()
    texts = table.column("prompt_text").to_pylist()
    batch = 256
    for start in range(0, len(texts), batch):
        encoded = encode_batch(tok, texts[start : start + batch])
        for k, got in enumerate(encoded):
            r = start + k
            if not np.array_equal(np.asarray(got, dtype=np.int64), tokens.row(r)):
                return f"request {ids[r]}: prompt_text does not tokenize to its prompt_token_ids"
    return ""


def _read(
    trace_path: str | os.PathLike[str], manifest_path: str | os.PathLike[str]
) -> tuple[pa.Table, dict[str, Any]]:
    manifest = read_trace_manifest(manifest_path)
    table = read_parquet(trace_path, TRACE_SCHEMA)
    return table, manifest


def validate_trace(
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
    *,
    retokenize: bool = False,
) -> dict[str, bool]:
    """The six check results by name (plus ``tokenization_exact`` with `retokenize`).

    Raises ArtifactError (naming the file) when a file is missing or does not match its schema.
    """
    return {
        name: res.ok for name, res in check_results(trace_path, manifest_path, retokenize).items()
    }


def check_results(
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
    retokenize: bool = False,
) -> dict[str, CheckResult]:
    """Each check's CheckResult (with what failed), by name."""
    table, manifest = _read(trace_path, manifest_path)
    where = f"{trace_path} with {manifest_path}"
    results = run_checks(table, manifest, where)
    if retokenize:
        detail = _retokenize(table, str(manifest_value(manifest, "tokenizer", where)))
        results["tokenization_exact"] = CheckResult("tokenization_exact", not detail, detail)
    return results


def check_trace(
    trace_path: str | os.PathLike[str],
    manifest_path: str | os.PathLike[str],
    *,
    retokenize: bool = False,
) -> dict[str, bool]:
    """Like `validate_trace`, but raise TraceValidationError saying which checks failed on which request/graph."""
    results = check_results(trace_path, manifest_path, retokenize)
    failures = {name: res.detail for name, res in results.items() if not res.ok}
    if failures:
        raise TraceValidationError(str(trace_path), failures)
    return {name: res.ok for name, res in results.items()}
