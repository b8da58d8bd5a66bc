"""Timed actions: something to do at a given time of a run (a restart, a node reclamation, a watch).

The single-process dispatcher (servelab.dispatch.client) and the multi-process supervisor
(servelab.dispatch.parallel) run them the same way, through `run_timed_action`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servelab.dispatch.records import describe_error

__all__ = ["TimedAction", "run_timed_action"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimedAction:
    """Something to do at `at_s` seconds from the run start (run in a worker thread).

    With `stop_run`, the dispatch stops once the action has run: in-flight requests are recorded as
    errors and requests not yet sent as errors with no `sent_s` (a reclaimed node, for instance).

    With `every_s`, a watch: `action` runs at `at_s` and every `every_s` after until the run ends,
    and returns why the run must stop (a non-empty string) or None; when it gives a reason the
    dispatch stops as with `stop_run`. A watch that raises is logged and tried again next time.
    """

    at_s: float
    action: Callable[[], Any]
    reason: str
    stop_run: bool = False
    every_s: float | None = None


async def run_timed_action(
    action: TimedAction,
    *,
    clock: Callable[[], float],
    stop: Callable[[str], None],
    started: set[TimedAction],
) -> None:
    """Run `action` on the run's `clock`; `stop(reason)` stops the run. A one-off action joins
    `started` when it starts (it then completes before the run ends); a watch never does (it is
    cancelled when the run ends)."""
    at = action.at_s
    while True:
        await asyncio.sleep(max(0.0, at - clock()))
        if action.every_s is None:
            started.add(action)
            log.warning("at %.3f s: %s", clock(), action.reason)
            if action.stop_run:  # stop sending at once; the action (a restart) may take a while
                stop(f"{action.reason} at {action.at_s:g} s")
            await asyncio.to_thread(action.action)
            return
        try:
            reason = await asyncio.to_thread(action.action)
        except Exception as exc:  # e.g. the API server did not answer: look again next time
            log.warning("%s at %.1f s failed: %s", action.reason, clock(), describe_error(exc))
            reason = None
        if reason:
            log.warning("at %.3f s: %s: %s", clock(), action.reason, reason)
            stop(f"{reason} (seen by the {action.reason} at {clock():.1f} s)")
            return
        at += max(action.every_s, 0.01)
