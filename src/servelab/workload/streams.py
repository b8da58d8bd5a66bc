"""Named, independent random streams derived from one trace seed.

Each layer of the compiler draws from its own stream, keyed by name rather than by position, so changing how many
numbers one layer draws (more graphs, another tool-delay distribution, longer prompts) never shifts another
layer's draws.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["STREAMS", "keyed_substream", "substream"]

# The streams the compiler uses. Adding a name here never changes the existing streams.
# "topology": each graph's shape when workload.topologies lists several; "blocks": an imported
# trace's token blocks, one generator per block key (`keyed_substream`).
STREAMS = ("arrivals", "tool_delay", "prefix", "suffix", "warmup", "topology", "blocks")


def _stream_key(seed: int, name: str) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int.from_bytes(hashlib.sha256(f"servelab-stream\0{name}".encode()).digest()[:4], "big")


def substream(seed: int, name: str) -> np.random.Generator:
    """A PCG64 generator for stream `name` of trace seed `seed` (a SeedSequence child keyed by the name)."""
    key = _stream_key(seed, name)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(key,))))


def keyed_substream(seed: int, name: str, item: int) -> np.random.Generator:
    """A PCG64 generator for item `item` (a non-negative integer, e.g. a block's hash id) of
    stream `name`: the SeedSequence child (name's key, item), so each item's draws depend on the
    seed and the item alone, never on which other items are drawn or in which order."""
    if isinstance(item, bool) or not isinstance(item, int) or item < 0:
        raise ValueError(f"item must be a non-negative integer, got {item!r}")
    key = _stream_key(seed, name)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(key, item))))
