"""SGLang's radix prefix cache, as far as serving time sees it: which prompt tokens are already in KV.

A request whose prompt starts with tokens an earlier request already prefilled (a shared system
prompt, the RAG context, the previous turns of a chat) reuses their KV entries and prefills only
the rest (``#cached-token`` in SGLang's ``Prefill batch`` line, ``cached_tokens`` in its usage).
Keys are token sequences: token ids as sent, or the emulator's words of a text prompt. Edges are
compressed (a radix tree, as ``mem_cache/radix_cache.py``) and compared slice against slice, so a
2,048-token system prompt costs a few C-level comparisons, not 2,048 Python steps. When the
cached tokens pass ``capacity`` (the KV pool), the least recently used leaves are evicted, as
SGLang's LRU eviction does; entries a running request holds are not pinned (a simplification:
the emulator never reads them back).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

Key = tuple[Hashable, ...]


class _Node:
    __slots__ = ("key", "children", "parent", "used")

    def __init__(self, key: Key, parent: _Node | None, used: int) -> None:
        self.key = key
        self.children: dict[Hashable, _Node] = {}
        self.parent = parent
        self.used = used


def _common(edge: Key, seq: Sequence[Hashable], start: int) -> int:
    """How many of ``edge``'s tokens ``seq`` repeats from ``start`` (its first is known to match)."""
    n = min(len(edge), len(seq) - start)
    if tuple(seq[start:start + n]) == edge[:n]:
        return n
    lo, hi = 1, n - 1  # edge[:lo] matches, edge[:hi + 1] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tuple(seq[start:start + mid]) == edge[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class RadixCache:
    """Prefix matches and inserts over token sequences, bounded by ``capacity`` tokens."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._clock = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        """Forget everything (``/flush_cache``)."""
        self.root = _Node((), None, 0)
        self.tokens = 0

    def match(self, seq: Sequence[Hashable]) -> int:
        """The number of leading tokens of ``seq`` already cached (touched as recently used)."""
        node, i, now = self.root, 0, next(self._clock)
        while i < len(seq):
            child = node.children.get(seq[i])
            if child is None:
                break
            n = _common(child.key, seq, i)
            child.used = now
            i += n
            if n < len(child.key):
                break
            node = child
        return i

    def insert(self, seq: Sequence[Hashable]) -> None:
        """Cache ``seq`` (its prefill is done), splitting an edge where it diverges; evict past capacity."""
        node, i, now = self.root, 0, next(self._clock)
        while i < len(seq):
            child = node.children.get(seq[i])
            if child is None:
                leaf = _Node(tuple(seq[i:]), node, now)
                node.children[seq[i]] = leaf
                self.tokens += len(leaf.key)
                break
            n = _common(child.key, seq, i)
            if n < len(child.key):  # split: a middle node holds the shared part
                mid = _Node(child.key[:n], node, now)
                child.key, child.parent = child.key[n:], mid
                mid.children[child.key[0]] = child
                node.children[seq[i]] = mid
                child = mid
            child.used = now
            i += n
            node = child
        if self.tokens > self.capacity:
            self._evict(self.tokens - self.capacity)

    def _evict(self, need: int) -> None:
        """Drop least recently used leaves until ``need`` tokens are freed (a parent left childless
        becomes a leaf and may go next)."""
        leaves = [n for n in self._nodes() if not n.children]
        while need > 0 and leaves:
            leaves.sort(key=lambda n: n.used, reverse=True)
            leaf = leaves.pop()
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.tokens -= len(leaf.key)
            need -= len(leaf.key)
            if parent is not self.root and not parent.children:
                leaves.append(parent)

    def _nodes(self) -> list[_Node]:
        out, todo = [], list(self.root.children.values())
        while todo:
            node = todo.pop()
            out.append(node)
            todo.extend(node.children.values())
        return out
