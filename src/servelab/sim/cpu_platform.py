"""The simulator's CPU platform: each real engine's step time on this machine class, as a linear model
fitted from the engine's unloaded floor only (the fit: servelab.sim.cpu_fit; docs/simulator.md,
"Against the real engines").

On the L4 the step time is a roofline with calibrated efficiencies (`sim.cost`). On the CPU both
real engines run here, so the cost side is measured instead of assumed: one linear model per
engine,

    t(step) = step_s                          every forward pass (scheduling, input preparation)
            + per_token_s     · tokens        tokens computed (prefill not served from cache, decode)
            + per_sampled_s   · sampled       sequences sampled (LM head over 128,256 logits,
                                              sampler, detokenising and streaming one token)
            + per_attn_pair_s · attn_pairs    prefill attention (query × context pairs)
            + per_kv_token_s  · kv_tokens     KV entries read or written
            + per_admitted_s  · admitted      requests whose prefill starts in the step (the HTTP
                                              front end's tokenising and request set-up, on the
                                              same pinned core)
            + per_mask_cell_s · mask_cells    cells of the pass's attention mask: query tokens ×
                                              the KV view's length
            + per_mask_check_s · mask_checks  mask cells the host tests one by one to fill it
            + per_wakeup_s    · wakeups       HTTP threads of other requests woken by the results
                                              sent since the previous pass, on the same core

The last three are llama.cpp's (servelab.sim.llamacpp, `mask_work` and `_send`, which cite
them). Its CPU flash attention reads a mask row of the whole padded KV view for every query
token, so a prompt's unchunked micro-batch of 512 tokens does more of that work than two of 256.
And every result it sends wakes the HTTP thread of every request it holds, served or waiting for
a slot, so a pass grows dearer with the queue. The other engines' models pass 0 for all three.

with `StepCost.iteration_time` the same method the engine models call on the L4 cost model, so the
scheduling logic (`sim.vllm`, `sim.llamacpp`) is unchanged on it. Config `gpu.step_cost` holds the
coefficients per engine (the sim backend on `gpu.name: CPU`).

**After an idle** a pass may cost more: the engine's core comes back to speed over its first
work. How much is the machine's: llama-server's first pass after 9 s of idle took 1.59 times its
warm time on one machine of the CPU pair's class and 1.02 on another (benchmarks/idle_wake_cost.py;
docs/simulator.md, "A twelfth measurement"), so it is fitted from each floor's idle gaps, never
assumed. A step cost may carry an after-idle term, the core's coldness
c in [0, 1]: while the engine idles for `idle` seconds, c rises toward 1,

    c ← 1 − (1 − c) · exp(−idle / idle_rise_s)

each pass takes (1 + idle_gain · c) times its linear time t, and c then decays over the work,

    c ← c · exp(−(1 + idle_gain · c) · t / idle_decay_s).

An engine starts cold (c = 1): a run begins after the deployment idled. With `idle_gain` 0 (the
default, and every platform fitted from a floor without idle gaps) the term is absent. The term has
state, so it lives in an `AfterIdleClock`, one per engine instance (`after_idle_clock`), which the
engine models call with each pass's start time; the recurrence itself is `after_idle_step`, which
the fit (servelab.sim.cpu_fit, `fit_after_idle`) replays on the floor's own passes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.sim.cost import OnePassTimes

__all__ = [
    "AFTER_IDLE",
    "COEFFICIENTS",
    "FEATURES",
    "AfterIdleClock",
    "FeatureRecorder",
    "StepCost",
    "after_idle_clock",
    "after_idle_step",
    "step_costs_from_config",
]

# The features of one forward pass, in the order of StepCost's coefficients.
FEATURES = (
    "step",
    "tokens",
    "sampled",
    "attn_pairs",
    "kv_tokens",
    "admitted",
    "mask_cells",
    "mask_checks",
    "wakeups",
)
COEFFICIENTS = (
    "step_s",
    "per_token_s",
    "per_sampled_s",
    "per_attn_pair_s",
    "per_kv_token_s",
    "per_admitted_s",
    "per_mask_cell_s",
    "per_mask_check_s",
    "per_wakeup_s",
)
# Coefficients added after platform files and configs were written (the mask terms and the
# wake-ups, 2026-12-05): a mapping without one is the model before it, the term at 0.
ADDED_COEFFICIENTS = ("per_mask_cell_s", "per_mask_check_s", "per_wakeup_s")
# The after-idle term's parameters (module docstring), beside the coefficients in a step cost's
# mapping; absent: no term (idle_gain 0).
AFTER_IDLE = ("idle_gain", "idle_rise_s", "idle_decay_s")


def after_idle_step(
    coldness: float,
    idle_s: float,
    seconds: float,
    *,
    gain: float,
    rise_s: float,
    decay_s: float,
) -> tuple[float, float]:
    """One pass of linear time `seconds` after `idle_s` of idle, at the core's `coldness` before
    the idle: (the pass's time with the after-idle term, the coldness after it) (module
    docstring)."""
    cold = 1.0 - (1.0 - coldness) * math.exp(-max(idle_s, 0.0) / rise_s)
    taken = seconds * (1.0 + gain * cold)
    return taken, cold * math.exp(-taken / decay_s)


def _features(
    *,
    tokens: int,
    sampled: int,
    attn_pairs: float,
    kv_tokens: float,
    admitted: int,
    mask_cells: float,
    mask_checks: float,
    wakeups: float,
) -> np.ndarray:
    return np.array(
        [
            1.0,
            float(tokens),
            float(sampled),
            float(attn_pairs),
            float(kv_tokens),
            float(admitted),
            float(mask_cells),
            float(mask_checks),
            float(wakeups),
        ]
    )


@dataclass(frozen=True)
class StepCost(OnePassTimes):
    """One real engine's fitted step time on the CPU platform (module docstring): the same
    `iteration_time` the engine models call on the L4's `CostModel`."""

    engine: str
    step_s: float
    per_token_s: float
    per_sampled_s: float
    per_attn_pair_s: float
    per_kv_token_s: float
    per_admitted_s: float
    per_mask_cell_s: float = 0.0
    per_mask_check_s: float = 0.0
    per_wakeup_s: float = 0.0
    slowdown: float = 1.0
    # the after-idle term (module docstring); gain 0: none
    idle_gain: float = 0.0
    idle_rise_s: float = 1.0
    idle_decay_s: float = 0.1

    def __post_init__(self) -> None:
        for name in (*COEFFICIENTS, "idle_gain"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"step cost of {self.engine}: {name} = {value} is not >= 0")
        for name in ("idle_rise_s", "idle_decay_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"step cost of {self.engine}: {name} = {value} is not > 0")
        if not self.slowdown > 0:
            raise ValueError(f"slowdown: must be positive, got {self.slowdown}")

    @classmethod
    def from_mapping(cls, engine: str, values: Mapping[str, Any], where: str) -> StepCost:
        missing = [k for k in COEFFICIENTS if k not in values and k not in ADDED_COEFFICIENTS]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        given = [k for k in (*COEFFICIENTS, *AFTER_IDLE) if k in values]
        return cls(engine, **{k: float(values[k]) for k in given})

    def coefficients(self) -> dict[str, float]:
        """The linear model's coefficients (COEFFICIENTS), without the after-idle term."""
        return {k: getattr(self, k) for k in COEFFICIENTS}

    def after_idle(self) -> dict[str, float]:
        """The after-idle term's parameters (AFTER_IDLE); empty when it has none (gain 0)."""
        return {k: getattr(self, k) for k in AFTER_IDLE} if self.idle_gain > 0 else {}

    def with_after_idle(self, gain: float, rise_s: float, decay_s: float) -> StepCost:
        return dataclasses.replace(
            self, idle_gain=float(gain), idle_rise_s=float(rise_s), idle_decay_s=float(decay_s)
        )

    def with_slowdown(self, slowdown: float) -> StepCost:
        return dataclasses.replace(self, slowdown=float(slowdown))

    @property
    def front_end_s(self) -> float:
        """A request's front-end work (`per_admitted_s`), for an engine whose front end hands
        requests to its scheduler one at a time (servelab.sim.vllm, V1)."""
        return self.per_admitted_s * self.slowdown

    def iteration_time(
        self,
        *,
        tokens: int,
        seqs: int,
        sampled: int,
        attn_pairs: float,
        kv_tokens: float,
        cuda_graph: bool,
        kv_repeat: float = 0.0,
        admitted: int = 0,
        mask_cells: float = 0.0,
        mask_checks: float = 0.0,
        wakeups: float = 0.0,
        start_s: float | None = None,
    ) -> float:
        """Seconds for one forward pass on the linear model (arguments as
        `sim.cost.CostModel.iteration_time`; `seqs`, `cuda_graph` and `kv_repeat` carry nothing
        on a CPU: no graphs, no cache hierarchy the model separates). The after-idle term has
        state and is an `AfterIdleClock`'s: here `start_s` is not used."""
        del seqs, cuda_graph, kv_repeat, start_s
        t = (
            self.step_s
            + self.per_token_s * tokens
            + self.per_sampled_s * sampled
            + self.per_attn_pair_s * attn_pairs
            + self.per_kv_token_s * kv_tokens
            + self.per_admitted_s * admitted
            + self.per_mask_cell_s * mask_cells
            + self.per_mask_check_s * mask_checks
            + self.per_wakeup_s * wakeups
        )
        return t * self.slowdown


class AfterIdleClock:
    """One engine instance's passes on a step cost with an after-idle term (module docstring):
    the core's coldness and when its last pass ended. The engine models call `iteration_time`
    with each pass's `start_s`; a pass without one follows the last with no idle."""

    def __init__(self, cost: StepCost) -> None:
        self.cost = cost
        self.coldness = 1.0  # a run begins after the deployment idled
        self._last_end: float | None = None

    @property
    def front_end_s(self) -> float:
        return self.cost.front_end_s

    def iteration_time(self, *, start_s: float | None = None, **features: Any) -> float:
        seconds = self.cost.iteration_time(**features)
        start = start_s if start_s is not None else (self._last_end or 0.0)
        idle = 0.0 if self._last_end is None else start - self._last_end
        taken, self.coldness = after_idle_step(
            self.coldness,
            idle,
            seconds,
            gain=self.cost.idle_gain,
            rise_s=self.cost.idle_rise_s,
            decay_s=self.cost.idle_decay_s,
        )
        self._last_end = start + taken
        return taken


def after_idle_clock(cost: StepCost) -> StepCost | AfterIdleClock:
    """What one engine instance times its passes with: `cost` itself, or with an after-idle term,
    a clock of its own (the term's state belongs to one engine's timeline)."""
    return AfterIdleClock(cost) if cost.idle_gain > 0 else cost


def step_costs_from_config(gpu: Mapping[str, Any]) -> dict[str, StepCost]:
    """config `gpu.step_cost`: engine -> its StepCost (empty when the section has none)."""
    return {
        engine: StepCost.from_mapping(engine, values, f"config key gpu.step_cost.{engine}")
        for engine, values in (gpu.get("step_cost") or {}).items()
    }


@dataclass
class FeatureRecorder:
    """A stand-in cost model that records each forward pass's features. Its durations (and the
    front-end time an engine reads from it) are `timing`'s, a step cost fitted before, or else a
    fixed `duration_s` and no front end (with one request at a time, durations change no
    scheduling decision; with requests sent together, the front end and the step times decide
    which step admits which: servelab.sim.cpu_fit fits again on its own estimate)."""

    duration_s: float = 1e-3
    calls: list[np.ndarray] = field(default_factory=list)
    # each call's start as the engine model gave it (None: not given), and the time it returned
    starts: list[float | None] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    timing: StepCost | None = None

    @property
    def front_end_s(self) -> float:
        return self.timing.front_end_s if self.timing is not None else 0.0

    def iteration_time(
        self,
        *,
        tokens: int,
        seqs: int,
        sampled: int,
        attn_pairs: float,
        kv_tokens: float,
        cuda_graph: bool,
        kv_repeat: float = 0.0,
        admitted: int = 0,
        mask_cells: float = 0.0,
        mask_checks: float = 0.0,
        wakeups: float = 0.0,
        start_s: float | None = None,
    ) -> float:
        del kv_repeat
        self.starts.append(start_s)
        self.calls.append(
            _features(
                tokens=tokens,
                sampled=sampled,
                attn_pairs=attn_pairs,
                kv_tokens=kv_tokens,
                admitted=admitted,
                mask_cells=mask_cells,
                mask_checks=mask_checks,
                wakeups=wakeups,
            )
        )
        seconds = (
            self.timing.iteration_time(
                tokens=tokens,
                seqs=seqs,
                sampled=sampled,
                attn_pairs=attn_pairs,
                kv_tokens=kv_tokens,
                cuda_graph=cuda_graph,
                admitted=admitted,
                mask_cells=mask_cells,
                mask_checks=mask_checks,
                wakeups=wakeups,
            )
            if self.timing is not None
            else self.duration_s
        )
        self.durations.append(seconds)
        return seconds
