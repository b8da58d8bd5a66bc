"""Graph-release logic: which request becomes ready when.

One implementation, driven by the simulator on a virtual clock and by the dispatcher on the real one.
A request with no predecessors is scheduled at its graph's arrival time. A request with
predecessors is released when the last of them finishes (whatever its status: a failed planner
still releases its workers, so the offered load does not depend on the engine under test), and is
scheduled at that release time plus its own tool delay.

"The last of them" is the latest finish time, not the last one reported: a client that reads its
streams in batches may learn of the ends out of their (kernel-stamped) order, and a dependant is
never due before any of its predecessors finished.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ReleaseTracker", "TraceRequest"]


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """The scheduling-relevant part of one trace row."""

    request_id: str
    graph_id: int
    role: str
    arrival_s: float
    depends_on: tuple[str, ...]
    tool_delay_s: float
    max_tokens: int


class ReleaseTracker:
    """Tracks unfinished predecessors and yields (scheduled_s, request_id) as requests become ready."""

    def __init__(self, requests: Iterable[TraceRequest]) -> None:
        self._requests = {r.request_id: r for r in requests}
        self._waiting_on: dict[str, int] = {}
        self._dependents: dict[str, list[str]] = {rid: [] for rid in self._requests}
        self._finished: dict[str, float] = {}
        for r in self._requests.values():
            self._waiting_on[r.request_id] = len(r.depends_on)
            for dep in r.depends_on:
                if dep not in self._requests:
                    raise ValueError(f"request {r.request_id} depends on unknown request {dep}")
                self._dependents[dep].append(r.request_id)

    def __len__(self) -> int:
        return len(self._requests)

    def request(self, request_id: str) -> TraceRequest:
        return self._requests[request_id]

    def initial(self) -> list[tuple[float, str]]:
        """Requests without predecessors, at their graph's arrival (plus any tool delay)."""
        ready = [
            (r.arrival_s + r.tool_delay_s, r.request_id)
            for r in self._requests.values()
            if not r.depends_on
        ]
        return sorted(ready)

    def finish(self, request_id: str, t_s: float) -> list[tuple[float, str]]:
        """Mark `request_id` finished at `t_s`; return the requests this releases."""
        if request_id in self._finished:
            raise ValueError(f"request {request_id} finished twice")
        self._finished[request_id] = t_s
        released: list[tuple[float, str]] = []
        for dep in self._dependents[request_id]:
            self._waiting_on[dep] -= 1
            if self._waiting_on[dep] == 0:
                r = self._requests[dep]
                last = max(self._finished[p] for p in r.depends_on)
                released.append((max(last, r.arrival_s) + r.tool_delay_s, dep))
        return released

    @property
    def n_finished(self) -> int:
        return len(self._finished)

    @property
    def done(self) -> bool:
        return len(self._finished) == len(self._requests)
