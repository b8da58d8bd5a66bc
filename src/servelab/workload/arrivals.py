"""L1: agent-graph arrivals, a renewal process with i.i.d. Gamma gaps (docs/workload.md, study §3.5).

Gaps have mean 1/λ and coefficient of variation cv: shape k = 1/cv², scale θ = cv²/λ. The first graph arrives
one gap after the run starts (t₁ = g₁), and every graph with t < duration_s belongs to the trace, so a trace holds
about λ·duration_s graphs.
"""

from __future__ import annotations

import math

import numpy as np

from servelab.workload.streams import substream

__all__ = ["arrival_times", "gamma_gaps"]


def _check(rate: float, cv: float) -> None:
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of agent graphs per second, got {rate!r}")
    if not (math.isfinite(cv) and cv > 0):
        raise ValueError(f"workload.arrival_cv must be positive, got {cv!r}")


def gamma_gaps(rng: np.random.Generator, n: int, rate: float, cv: float) -> np.ndarray:
    """`n` i.i.d. Gamma(shape=1/cv², scale=cv²/rate) inter-arrival gaps (seconds)."""
    _check(rate, cv)
    return rng.gamma(shape=1.0 / cv**2, scale=cv**2 / rate, size=n)


def arrival_times(seed: int, rate: float, cv: float, duration_s: float) -> np.ndarray:
    """Arrival times in [0, duration_s) of the graphs of trace seed `seed` (stream "arrivals"), ascending."""
    _check(rate, cv)
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be positive, got {duration_s!r}")
    rng = substream(seed, "arrivals")
    expected = rate * duration_s
    # Draw in blocks whose size depends only on the parameters; the stream is sequential, so the times do not
    # depend on the block size either.
    block = int(expected + 8.0 * cv * math.sqrt(expected) + 16)
    times = np.cumsum(gamma_gaps(rng, block, rate, cv))
    while times[-1] < duration_s:
        more = np.cumsum(gamma_gaps(rng, block, rate, cv)) + times[-1]
        times = np.concatenate([times, more])
    return times[times < duration_s]
