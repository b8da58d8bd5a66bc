"""Named, independent random streams derived from one trace seed.

Each layer of the compiler draws from its own stream, keyed by name rather than by position, so changing how many
numbers one layer draws (more graphs, another tool-delay distribution, longer prompts) never shifts another
layer's draws.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["STREAMS", "substream"]

# The streams the compiler uses. Adding a name here never changes the existing streams.
STREAMS = ("arrivals", "tool_delay", "prefix", "suffix", "warmup")


def substream(seed: int, name: str) -> np.random.Generator:
    """A PCG64 generator for stream `name` of trace seed `seed` (a SeedSequence child keyed by the name)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    key = int.from_bytes(hashlib.sha256(f"servelab-stream\0{name}".encode()).digest()[:4], "big")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(key,))))
