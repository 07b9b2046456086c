"""Connected components of an edge list, in numpy (fuzzy_dedup's clusters, the sample's groups)."""

from __future__ import annotations

import numpy as np

__all__ = ["Components", "component_roots", "connected_components"]


class Components:
    """Connected components of undirected edges that arrive in chunks (:meth:`add`).

    It holds the nodes seen so far (sorted) and, for each, the index of its root (the smallest
    node of its component), never the edges: memory follows the nodes plus one chunk. Label
    propagation with pointer jumping, no per-node Python: each round hooks the larger of two
    differing roots under the smaller, then jumps pointers until every node points at its root.
    The result does not depend on the edge order or on how the edges were cut into chunks.
    """

    def __init__(self) -> None:
        self.nodes = np.zeros(0, np.int64)
        self.label = np.zeros(0, np.int64)  # label[i] <= i: the index of node i's root
        self.edges = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        if len(a) == 0:
            return
        self.edges += len(a)
        self._insert(np.unique(np.concatenate([a, b])))
        ia, ib = np.searchsorted(self.nodes, a), np.searchsorted(self.nodes, b)
        del a, b
        label = self.label
        while True:
            la, lb = label[ia], label[ib]
            diff = la != lb
            if not diff.any():
                break
            la, lb = la[diff], lb[diff]
            np.minimum.at(label, np.maximum(la, lb), np.minimum(la, lb))  # hook the larger root under the smaller
            del la, lb, diff
            while True:  # pointer jumping until every node points at its root
                nxt = label[label]
                if np.array_equal(nxt, label):
                    break
                label = nxt
        self.label = label

    def _insert(self, seen: np.ndarray) -> None:
        """Add the nodes of ``seen`` (sorted, distinct) that are new, as roots of their own; the
        old nodes' labels move with their positions (the order is kept, so label[i] <= i holds)."""
        if len(self.nodes):
            pos = np.minimum(np.searchsorted(self.nodes, seen), len(self.nodes) - 1)
            seen = seen[self.nodes[pos] != seen]
        if len(seen) == 0:
            return
        if len(self.nodes) == 0:
            self.nodes, self.label = seen, np.arange(len(seen), dtype=np.int64)
            return
        merged = np.concatenate([self.nodes, seen])
        merged.sort(kind="stable")
        moved = np.searchsorted(merged, self.nodes)
        label = np.arange(len(merged), dtype=np.int64)
        label[moved] = moved[self.label]
        self.nodes, self.label = merged, label

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """``(nodes, root)``: the nodes that have an edge, sorted, and the smallest node of each
        one's component."""
        return self.nodes, self.nodes[self.label]


def connected_components(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Connected components of the undirected edges ``(a[i], b[i])`` over integer node ids.

    Returns ``(nodes, root)``: the nodes that have an edge, sorted, and the smallest node of each
    one's component (see :class:`Components`, which also takes the edges in chunks).
    """
    c = Components()
    c.add(a, b)
    return c.result()


def component_roots(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For nodes ``0 .. n-1`` and edges ``(a[i], b[i])``: the smallest node of each one's component
    (a node without edges is its own)."""
    roots = np.arange(n, dtype=np.int64)
    if len(a):
        nodes, root = connected_components(a, b)
        roots[nodes] = root
    return roots
