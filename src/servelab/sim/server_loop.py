"""The live sim server's engine loop: an engine model stepped back to back on the real clock.

The loop asks the model for the next iteration, sleeps for that iteration's duration, then hands
the tokens it emitted to `deliver(request id, n_tokens, finished)` (the server pushes them to the
waiting streams). Requests that arrive during an iteration join at the next one, as in the real
engines. It knows nothing of HTTP (`servelab.sim.server_http`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from servelab.sim.base import EngineModel

__all__ = ["EngineLoop"]

_RESYNC_S = 0.05  # an engine loop further behind its plan than this restarts from "now"


class EngineLoop:
    """Steps `model` on the clock `now` (seconds); `halted()` true (a crashed server) drops each
    iteration's tokens. `wake` is set when a request is added; `stall()` stops the loop for good.
    Its statistics give the true inter-token latency: the achieved length of back-to-back
    iterations (`busy_interval_s / busy_intervals`) and how far iterations overran their plan."""

    def __init__(
        self,
        model: EngineModel,
        *,
        now: Callable[[], float],
        deliver: Callable[[str, int, bool], None],
        halted: Callable[[], bool],
    ) -> None:
        self.model = model
        self._now = now
        self._deliver = deliver
        self._halted = halted
        self.wake = asyncio.Event()
        self.stalled = False
        self.iterations = 0
        self.iteration_overrun_s = 0.0
        self.busy_intervals = 0
        self.busy_interval_s = 0.0

    def stall(self) -> None:
        """The engine stops stepping (streams stall)."""
        self.stalled = True

    async def run(self) -> None:
        """Step the model back to back on the real clock.

        While busy, each iteration starts at the previous one's planned end (sleep overshoot does
        not accumulate); after idling, or when more than `_RESYNC_S` behind, at the current time.
        """
        planned_end: float | None = None
        prev_end: float | None = None  # end of the previous iteration while busy
        while True:
            if self.stalled or not self.model.has_work():
                self.wake.clear()
                planned_end = prev_end = None
                if self.stalled:
                    await asyncio.Event().wait()  # forever (cancelled at close)
                if not self.model.has_work():
                    await self.wake.wait()
                continue
            now = self._now()
            start = (
                planned_end if planned_end is not None and now - planned_end < _RESYNC_S else now
            )
            it = self.model.step(start)
            duration = it.duration_s
            emitted = it.emitted
            finished = (*it.finished, *it.rejected)  # a refused prompt ends with no output
            if duration <= 0 and not emitted and not finished:
                planned_end = prev_end = None
                await asyncio.sleep(0.001)  # nothing could be scheduled: do not spin
                continue
            planned_end = start + duration
            # always yield, even when late, so requests keep being read and chunks written
            await asyncio.sleep(max(0.0, planned_end - self._now()))
            end = self._now()
            self.iterations += 1
            self.iteration_overrun_s += max(0.0, end - planned_end)
            if prev_end is not None:  # back-to-back iterations: the achieved emission interval
                self.busy_intervals += 1
                self.busy_interval_s += end - prev_end
            prev_end = end
            if self.stalled or self._halted():
                continue
            finished_set = set(finished)
            for rid in emitted:  # one token each
                self._deliver(rid, 1, rid in finished_set)
            for rid in finished_set.difference(emitted):
                self._deliver(rid, 0, True)
