"""The simulated platform: how much slower or faster one deployment and one run are than the model.

A real campaign runs on rented GPUs in virtual machines. The study measured what that does
(docs/simulator.md, "The platform model"): two independently provisioned deployments of SGLang
under one configuration differ by 0.5 to 11.7% in latency, all in one direction, and by up to
1.3% in TPOT (its Table 4 and §5.4); the median TPOT of three seed-paired repetitions spreads by a
median of 0.021 in ln (§7.2). With every simulated deployment the same GPU, Table 4 was exactly
0% with no p-values.

The model: every iteration of a run takes `drift × noise` times its cost-model duration, with
ln drift ~ N(0, deployment_sd²) drawn once per deployment and ln noise ~ N(0, run_sd²) once per
(deployment, condition, repetition). Both are seeded by SHA-256 of those names only, so identical
inputs give byte-identical artifacts on any machine, and a run and its retries see the same
platform. The spreads are config `sim.platform` (servelab.grid.settings.PlatformSettings).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.grid.settings import PlatformSettings, SimSettings

__all__ = ["PlatformModel"]


def _standard_normal(*names: str) -> float:
    digest = hashlib.sha256("\0".join(("servelab-platform", *names)).encode()).digest()
    return float(np.random.default_rng(int.from_bytes(digest[:8], "big")).standard_normal())


@dataclass(frozen=True)
class PlatformModel:
    """The factors of one simulated platform (module docstring)."""

    settings: PlatformSettings = field(default_factory=PlatformSettings)

    @classmethod
    def from_config(cls, sim: Mapping[str, Any] | None) -> PlatformModel:
        """From config `sim` (the whole section; defaults when absent)."""
        return cls(SimSettings.from_section(sim).platform)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.settings)

    def drift(self, deployment_id: str) -> float:
        """The deployment's factor on every iteration's duration (1 when disabled)."""
        s = self.settings
        if not s.enabled or s.deployment_sd == 0:
            return 1.0
        return math.exp(s.deployment_sd * _standard_normal("deployment", deployment_id))

    def noise(self, deployment_id: str, condition: str, rep: str) -> float:
        """The run's own factor on every iteration's duration (1 when disabled)."""
        s = self.settings
        if not s.enabled or s.run_sd == 0:
            return 1.0
        return math.exp(s.run_sd * _standard_normal("run", deployment_id, condition, rep))

    def slowdown(self, deployment_id: str, condition: str, rep: str) -> float:
        return self.drift(deployment_id) * self.noise(deployment_id, condition, rep)
