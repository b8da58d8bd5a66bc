"""A token-level radix tree with SGLang 0.4.1's RadixCache semantics (mem_cache/radix_cache.py).

Keys are token sequences stored as little-endian int64 bytes (8 bytes per token), so matching a
prompt against an edge is one C-level `bytes.startswith`; children are keyed by their first token.
Semantics kept from SGLang:
- `match_prefix` walks the tree, sets `last_access` on every node it passes, and SPLITS a node where
  the match ends inside it, so the returned node ends exactly at the match.
- `insert` returns how many leading tokens were already in the tree; new tokens become an unlocked
  (evictable) leaf.
- `inc_lock_ref` / `dec_lock_ref` lock a node and its ancestors; locked tokens are "protected", the
  rest "evictable" (`evictable_size`).
- `evict(n)` removes unlocked leaves in least-recently-used order until at least `n` tokens are
  freed; a parent left without children becomes a candidate.
Eviction uses one persistent heap with lazy invalidation instead of re-collecting all leaves per call;
the order is the same (least `last_access` first; ties in insertion order).
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["Node", "RadixCache", "key_bytes"]

_TOK = 8  # bytes per token


def key_bytes(ids: np.ndarray) -> bytes:
    """The tree key of a token sequence."""
    return np.ascontiguousarray(ids, dtype="<i8").tobytes()


class Node:
    __slots__ = ("alive", "children", "key", "last_access", "lock_ref", "parent")

    def __init__(self, key: bytes, parent: Node | None, now: float) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.lock_ref = 0
        self.last_access = now
        self.alive = True

    @property
    def n(self) -> int:
        return len(self.key) // _TOK

    def path_tokens(self) -> int:
        """Tokens from the root to the end of this node."""
        total = 0
        node: Node | None = self
        while node is not None:
            total += len(node.key) // _TOK
            node = node.parent
        return total


def _common_tokens(a: bytes, b: bytes, b_off: int) -> int:
    """Leading tokens shared by `a` and `b[b_off:]` (compared within len(a))."""
    m = min(len(a), len(b) - b_off)
    if b.startswith(a[:m], b_off):
        return m // _TOK
    x = np.frombuffer(a, dtype="<i8", count=m // _TOK)
    y = np.frombuffer(b, dtype="<i8", count=m // _TOK, offset=b_off)
    return int(np.argmax(x != y))


class RadixCache:
    """SGLang's radix cache (see module docstring). Sizes are in tokens."""

    def __init__(self) -> None:
        self.root = Node(b"", None, 0.0)
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.version = 0  # bumped when a node is added or removed (match results may change)
        self._heap: list[tuple[float, int, Node]] = []
        self._ctr = 0
        self.n_nodes = 0

    # ------------------------------------------------------------------ internals

    def _candidate(self, node: Node) -> None:
        """Register `node` as a possible eviction victim at its current last_access."""
        self._ctr += 1
        heapq.heappush(self._heap, (node.last_access, self._ctr, node))
        if len(self._heap) > 4 * self.n_nodes + 4096:
            self._compact()

    def _split(self, child: Node, split_tokens: int, now: float) -> Node:
        """Split `child` after `split_tokens`; return the new upper node (SGLang `_split_node`)."""
        cut = split_tokens * _TOK
        new = Node(child.key[:cut], child.parent, now)
        new.lock_ref = child.lock_ref
        self.n_nodes += 1
        assert child.parent is not None
        child.parent.children[child.key[:_TOK]] = new
        child.key = child.key[cut:]
        child.parent = new
        new.children[child.key[:_TOK]] = child
        return new

    # ------------------------------------------------------------------ API

    def match_prefix(self, key: bytes, now: float) -> tuple[int, Node]:
        """Longest cached prefix of `key`: (tokens matched, node ending exactly there)."""
        node = self.root
        node.last_access = now
        off = 0
        end = len(key)
        while off < end:
            child = node.children.get(key[off : off + _TOK])
            if child is None:
                break
            ck = child.key
            if key.startswith(ck, off):
                off += len(ck)
                node = child
                node.last_access = now
                continue
            common = _common_tokens(ck, key, off)
            node = self._split(child, common, now)
            off += common * _TOK
            break
        if not node.children and node is not self.root:
            self._candidate(node)
        return off // _TOK, node

    def touch(self, node: Node, now: float) -> None:
        """Refresh `last_access` along the path to `node` (what a repeated match would do)."""
        leaf = node
        step: Node | None = node
        while step is not None:
            step.last_access = now
            step = step.parent
        if not leaf.children and leaf is not self.root:
            self._candidate(leaf)

    def insert(self, key: bytes, now: float) -> int:
        """Insert `key`; return the number of leading tokens that were already present."""
        node = self.root
        node.last_access = now
        off = 0
        end = len(key)
        while off < end:
            child = node.children.get(key[off : off + _TOK])
            if child is None:
                leaf = Node(key[off:], node, now)
                node.children[key[off : off + _TOK]] = leaf
                self.evictable_size += leaf.n
                self.n_nodes += 1
                self.version += 1
                self._candidate(leaf)
                return off // _TOK
            ck = child.key
            if key.startswith(ck, off):
                off += len(ck)
                node = child
                node.last_access = now
                continue
            common = _common_tokens(ck, key, off)
            if off + common * _TOK >= end:
                # key ends inside this edge: SGLang splits and stops (nothing new to add)
                node = self._split(child, common, now)
                off += common * _TOK
                break
            node = self._split(child, common, now)
            node.last_access = now
            off += common * _TOK
        if not node.children and node is not self.root:
            self._candidate(node)
        return off // _TOK

    def inc_lock_ref(self, node: Node) -> int:
        """Lock `node` and its ancestors; return -(tokens that stopped being evictable)."""
        delta = 0
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                n = len(node.key) // _TOK
                self.evictable_size -= n
                self.protected_size += n
                delta -= n
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]
        return delta

    def dec_lock_ref(self, node: Node) -> int:
        """Unlock `node` and its ancestors; return the tokens that became evictable."""
        delta = 0
        root = self.root
        while node is not root:
            if node.lock_ref == 1:
                n = len(node.key) // _TOK
                self.evictable_size += n
                self.protected_size -= n
                delta += n
                if not node.children:
                    self._candidate(node)
            node.lock_ref -= 1
            node = node.parent  # type: ignore[assignment]
        return delta

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves, least recently used first, until >= num_tokens; return tokens freed."""
        freed = 0
        while freed < num_tokens and self._heap:
            t, _, node = heapq.heappop(self._heap)
            if (
                not node.alive
                or node.children
                or node.lock_ref > 0
                or node.last_access != t
                or node is self.root
            ):
                continue
            n = len(node.key) // _TOK
            freed += n
            self.evictable_size -= n
            node.alive = False
            self.n_nodes -= 1
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[:_TOK]]
            self.version += 1
            if not parent.children and parent is not self.root and parent.lock_ref == 0:
                self._candidate(parent)
        return freed

    def _compact(self) -> None:
        self._heap = [
            e
            for e in self._heap
            if e[2].alive and not e[2].children and e[2].lock_ref == 0 and e[2].last_access == e[0]
        ]
        heapq.heapify(self._heap)

    def total_size(self) -> int:
        """Tokens held by the tree (walks it: for tests)."""
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += len(node.key) // _TOK
            stack.extend(node.children.values())
        return total
