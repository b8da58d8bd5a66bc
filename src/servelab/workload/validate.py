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
    A floor trace with idle gaps (manifest field `floor.idle_gaps`; servelab.workload.floor) holds only
    delays of 0 or one of its gaps, on any role: they are the engine's idles, not tool calls.

``graphs_acyclic_resolvable`` also holds every dependant to come after its predecessors in the trace (the rows
are a topological order), and, for an agent-graph trace, each graph to be a planner, stages of workers and an
aggregator (servelab.grid.topology): one planner first, without predecessors; one aggregator last; a worker of
stage 1 depending on the planner, of stage k on every worker of stage k − 1; the aggregator on every worker of
the last stage; and each graph's stage widths one of the manifest's `topologies` (or the fanout of
`workload.workers_per_graph` when it lists none), as many graphs of each as it records. A floor trace (a
closed-loop chain, manifest field `floor`) is held to the generic part only.

An imported trace (manifest field `imported`; servelab.workload.imported) has no shared prefix of fixed length and
no tool calls; it is held to five checks, `IMPORTED_CHECKS`:

``prefix_sha256``
    As above, with F the longest common prefix of all prompts (the manifest's `prefix_tokens`, usually 0); the
    rows' `prefix_tokens` hold each request's own shared prefix instead (next check).
``prefix_accounting``
    Every prompt is non-empty; every row's `prefix_tokens` is the longest common prefix of its prompt with any
    earlier prompt of the trace (`shared_with_earlier`: what a prefix cache holding every earlier prompt could
    serve); the manifest's `achieved_sharing` is the mean of prefix_tokens / length, and its `sharing` the same.
``graphs_acyclic_resolvable``
    The generic part above; every graph is one request (role planner) without dependencies.
``arrivals_ordered``
    As above.
``tool_delays_bounded``
    Every tool delay is 0.

All checks are vectorised or linear in the number of requests (`shared_with_earlier` is n log n), so the loader
runs them before every dispatch.
With ``retokenize=True`` one more entry, ``tokenization_exact``, re-encodes every prompt text with the
manifest's tokenizer and compares it with the stored ids (what the compiler already verified for every prompt).
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections import Counter
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
    "IMPORTED_CHECKS",
    "SHARING_TOLERANCE",
    "CheckResult",
    "TokenColumn",
    "TraceValidationError",
    "check_results",
    "check_trace",
    "checks_for",
    "manifest_value",
    "measure_sharing",
    "prefix_ids_sha256",
    "run_checks",
    "shared_with_earlier",
    "trace_kind",
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
# The checks of an imported trace (module docstring).
IMPORTED_CHECKS = (
    "prefix_sha256",
    "prefix_accounting",
    "graphs_acyclic_resolvable",
    "arrivals_ordered",
    "tool_delays_bounded",
)
SHARING_TOLERANCE = 0.01
_ACHIEVED_EPS = 1e-9


def trace_kind(manifest: Mapping[str, Any]) -> str:
    """`imported` (manifest field `imported`), `floor` (field `floor`: a closed-loop chain) or
    `graphs` (the compiler's agent graphs)."""
    if "imported" in manifest:
        return "imported"
    if "floor" in manifest:
        return "floor"
    return "graphs"


def checks_for(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """The checks a trace of this manifest's kind must pass: `CHECKS`, or `IMPORTED_CHECKS`."""
    return IMPORTED_CHECKS if trace_kind(manifest) == "imported" else CHECKS


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


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    m = min(a.size, b.size)
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


def shared_with_earlier(tokens: TokenColumn) -> np.ndarray:
    """Per prompt, in row order, the longest common prefix (in token ids) with any earlier prompt:
    the tokens a prefix cache holding every earlier prompt could serve it (0 for the first).

    The earlier prompts are kept sorted (as big-endian bytes, so byte order is id order and a
    prefix sorts first); the longest common prefix with a sorted set is the longer of those with
    the prompt's two neighbours in it, so each prompt costs a binary search and two comparisons.
    """
    out = np.zeros(tokens.n, dtype=np.int64)
    keys: list[bytes] = []
    rows: list[int] = []
    big_endian = tokens.values.astype(">u4")
    for r in range(tokens.n):
        start, stop = int(tokens.offsets[r]), int(tokens.offsets[r + 1])
        key = big_endian[start:stop].tobytes()
        at = bisect.bisect_left(keys, key)
        prompt = tokens.row(r)
        best = 0
        for neighbour in (at - 1, at):
            if 0 <= neighbour < len(keys):
                best = max(best, _lcp(prompt, tokens.row(rows[neighbour])))
        out[r] = best
        keys.insert(at, key)
        rows.insert(at, r)
    return out


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
    imported = trace_kind(manifest) == "imported"
    if not imported:  # an imported trace's rows hold each request's own shared prefix
        column_f = table.column("prefix_tokens").to_numpy()
        wrong = np.flatnonzero(column_f != f)
        if wrong.size:
            r = int(wrong[0])
            return (
                f"request {ids[r]}: prefix_tokens {int(column_f[r])} != manifest prefix_tokens {f}"
            )
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
    if imported and tokens.n > 1:
        common, _ = measure_sharing(tokens, np.zeros(tokens.n, dtype=np.int64))
        if common != f:
            return f"manifest prefix_tokens {f} != {common}, the longest prefix all prompts share"
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


def _check_accounting(
    table: pa.Table, tokens: TokenColumn, manifest: Mapping[str, Any], where: str
) -> str:
    """An imported trace's prefix-sharing accounting (module docstring, ``prefix_accounting``)."""
    ids = table.column("request_id").to_pylist()
    if tokens.n == 0:
        return "the trace has no prompts"
    empty = np.flatnonzero(tokens.lengths == 0)
    if empty.size:
        return f"request {ids[int(empty[0])]}: empty prompt"
    column = table.column("prefix_tokens").to_numpy().astype(np.int64)
    shared = shared_with_earlier(tokens)
    wrong = np.flatnonzero(column != shared)
    if wrong.size:
        r = int(wrong[0])
        return (
            f"request {ids[r]}: prefix_tokens {int(column[r])} != {int(shared[r])}, the longest "
            "prefix it shares with an earlier prompt"
        )
    mean = float(np.mean(shared / tokens.lengths))
    for key in ("achieved_sharing", "sharing"):
        recorded = manifest_value(manifest, key, where)
        if (
            isinstance(recorded, bool)
            or not isinstance(recorded, int | float)
            or abs(float(recorded) - mean) > _ACHIEVED_EPS
        ):
            return f"manifest {key} {recorded!r} != measured {mean!r}"
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
    problem = _check_row_order(ids, graphs, deps, index)
    if problem:
        return problem
    n_requests = manifest_value(manifest, "n_requests", where)
    n_graphs = manifest_value(manifest, "n_graphs", where)
    if n_requests != len(ids):
        return f"manifest n_requests {n_requests!r} != {len(ids)} rows"
    if n_graphs != len(set(graphs)):
        return f"manifest n_graphs {n_graphs!r} != {len(set(graphs))} graphs in the trace"
    kind = trace_kind(manifest)
    if kind == "imported":
        return _check_single_requests(ids, graphs, roles, deps)
    if kind == "graphs":
        return _check_graph_shapes(ids, graphs, roles, deps, manifest, where)
    return ""


def _check_row_order(
    ids: list[str], graphs: list[int], deps: list[list[str]], index: Mapping[str, int]
) -> str:
    """Every dependant comes after its predecessors: the rows are a topological order."""
    for r, rid in enumerate(ids):
        for dep in deps[r]:
            if index[dep] > r:
                return (
                    f"graph {graphs[r]}: request {rid} comes before its predecessor {dep} "
                    "(a dependant must follow its predecessors in the trace)"
                )
    return ""


def _check_single_requests(
    ids: list[str], graphs: list[int], roles: list[str], deps: list[list[str]]
) -> str:
    """An imported trace: every graph is one request, a planner without predecessors."""
    seen: set[int] = set()
    for r, rid in enumerate(ids):
        if roles[r] != "planner" or deps[r]:
            return (
                f"graph {graphs[r]}: request {rid} ({roles[r]}, {len(deps[r])} predecessor(s)) "
                "is not a lone request (an imported trace's graphs are single planners)"
            )
        if graphs[r] in seen:
            return f"graph {graphs[r]}: request {rid} is its second request"
        seen.add(graphs[r])
    return ""


def _stage_widths(
    rows: list[int], ids: list[str], roles: list[str], deps: list[list[str]], graph: int
) -> tuple[tuple[int, ...], str]:
    """One graph's stage widths (planner -> stages of workers -> aggregator), or a reason it is
    not such a graph. `rows` are the graph's rows, in trace order."""
    first, last = rows[0], rows[-1]
    planners = [r for r in rows if roles[r] == "planner"]
    aggregators = [r for r in rows if roles[r] == "aggregator"]
    if planners != [first] or aggregators != [last] or len(rows) < 3:
        return (), (
            f"graph {graph}: {len(planners)} planner(s) and {len(aggregators)} aggregator(s) "
            f"in {len(rows)} request(s); a graph is one planner first, workers, one aggregator last"
        )
    if deps[first]:
        return (), f"graph {graph}: planner {ids[first]} has predecessors {deps[first]}"
    stage = {ids[first]: 0}
    members: list[list[str]] = [[ids[first]]]
    for r in rows[1:-1]:
        if not deps[r]:
            return (), f"graph {graph}: worker {ids[r]} has no predecessor"
        # every predecessor is an earlier row of the graph (checked before): the planner or a worker
        k = 1 + max(stage[d] for d in deps[r])
        if k == len(members):
            members.append([])
        members[k].append(ids[r])
        stage[ids[r]] = k
    for r in rows[1:-1]:
        want = members[stage[ids[r]] - 1]
        if deps[r] != want:
            return (), (
                f"graph {graph}: worker {ids[r]} depends on {deps[r]}, not on exactly the "
                f"stage before it {want}"
            )
    if len(members) < 2 or deps[last] != members[-1]:
        return (), (
            f"graph {graph}: aggregator {ids[last]} depends on {deps[last]}, not on exactly "
            f"the last stage of workers {members[-1] if len(members) > 1 else []}"
        )
    return tuple(len(m) for m in members[1:]), ""


def _check_graph_shapes(
    ids: list[str],
    graphs: list[int],
    roles: list[str],
    deps: list[list[str]],
    manifest: Mapping[str, Any],
    where: str,
) -> str:
    """The compiler's agent graphs: each a planner, stages of workers, an aggregator, of one of the
    manifest's topologies, as many of each as it records."""
    rows_of: dict[int, list[int]] = {}
    for r, g in enumerate(graphs):
        rows_of.setdefault(g, []).append(r)
    listed = manifest.get("topologies")
    # each allowed shape's stage widths -> (its name, the graphs the manifest records or None)
    allowed: dict[tuple[int, ...], tuple[str, int | None]]
    if listed is None:
        workers = manifest_value(manifest, "workload.workers_per_graph", where)
        allowed = {(int(workers),): ("fanout", None)}
    else:
        allowed = {
            tuple(int(w) for w in t["widths"]): (str(t["name"]), int(t["graphs"])) for t in listed
        }
    counts: Counter[tuple[int, ...]] = Counter()
    for g, rows in rows_of.items():
        widths, problem = _stage_widths(rows, ids, roles, deps, g)
        if problem:
            return problem
        if widths not in allowed:
            shapes = ", ".join(f"{name} {list(w)}" for w, (name, _) in allowed.items())
            return (
                f"graph {g}: its workers form stages {list(widths)}, not a topology of the "
                f"manifest ({shapes})"
            )
        counts[widths] += 1
    for widths, (name, recorded) in allowed.items():
        if recorded is not None and counts[widths] != recorded:
            return (
                f"manifest topologies: {name} records {recorded} graph(s), the trace has "
                f"{counts[widths]}"
            )
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
    ids = table.column("request_id").to_pylist()
    delay = table.column("tool_delay_s").to_numpy()
    idle_gaps = (manifest.get("floor") or {}).get("idle_gaps")
    if idle_gaps:  # a floor's idle gaps, on any role, are the only delays it may hold
        allowed = np.array([0.0, *(float(x) for x in idle_gaps["seconds"])])
        bad = np.flatnonzero(~np.isin(delay, allowed))
        if bad.size:
            r = int(bad[0])
            return (
                f"request {ids[r]}: delay {delay[r]!r} s is not one of the floor's idle gaps "
                f"{sorted(set(allowed.tolist()))} s"
            )
        return ""
    imported = trace_kind(manifest) == "imported"
    # an imported trace has no tool calls: its bound is 0
    max_s = 0.0 if imported else float(manifest_value(manifest, "workload.tool_delay.max_s", where))
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
    """Run the checks of the trace's kind (`checks_for`: the six, or an imported trace's five) on a
    TRACE_SCHEMA table against its manifest; `where` names the files in messages."""
    tokens = TokenColumn(table)
    names = checks_for(manifest)
    details: dict[str, str] = {}
    for name in names:
        if name == "prefix_sha256":
            details[name] = _check_prefix(table, tokens, manifest, where)
        elif name == "achieved_sharing":
            details[name] = _check_sharing(table, tokens, manifest, where)
        elif name == "suffixes_distinct":
            details[name] = _check_suffixes(table, tokens, manifest, where)
        elif name == "prefix_accounting":
            details[name] = _check_accounting(table, tokens, manifest, where)
        elif name == "graphs_acyclic_resolvable":
            details[name] = _check_graphs(table, manifest, where)
        elif name == "arrivals_ordered":
            details[name] = _check_arrivals(table, manifest, where)
        else:
            details[name] = _check_delays(table, manifest, where)
    return {name: CheckResult(name, not details[name], details[name]) for name in names}


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
    """The check results by name (the six, or an imported trace's five; plus
    ``tokenization_exact`` with `retokenize`).

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
