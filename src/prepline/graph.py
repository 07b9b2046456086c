"""Connected components of an edge list, in numpy (fuzzy_dedup's clusters, the sample's groups)."""

from __future__ import annotations

import numpy as np

__all__ = ["component_roots", "connected_components"]


def connected_components(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Connected components of the undirected edges ``(a[i], b[i])`` over integer node ids.

    Returns ``(nodes, root)``: the nodes that have an edge, sorted, and the smallest node of each
    one's component. Label propagation with pointer jumping over the edges only (no per-node
    Python): each round hooks the larger of two differing roots under the smaller, then jumps
    pointers until every node points at its root; the result does not depend on edge order.
    """
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    nodes = np.unique(np.concatenate([a, b]))
    ia, ib = np.searchsorted(nodes, a), np.searchsorted(nodes, b)
    label = np.arange(len(nodes), dtype=np.int64)  # label[x] <= x: a pointer to a smaller node
    while True:
        la, lb = label[ia], label[ib]
        diff = la != lb
        if not diff.any():
            break
        la, lb = la[diff], lb[diff]
        lo, hi = np.minimum(la, lb), np.maximum(la, lb)
        np.minimum.at(label, hi, lo)  # hook the larger root under the smaller
        while True:  # pointer jumping until every node points at its root
            nxt = label[label]
            if np.array_equal(nxt, label):
                break
            label = nxt
    return nodes, nodes[label]


def component_roots(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For nodes ``0 .. n-1`` and edges ``(a[i], b[i])``: the smallest node of each one's component
    (a node without edges is its own)."""
    roots = np.arange(n, dtype=np.int64)
    if len(a):
        nodes, root = connected_components(a, b)
        roots[nodes] = root
    return roots
