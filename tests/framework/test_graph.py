"""Connected components against breadth-first search over an adjacency list (another algorithm)."""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prepline.graph import Components, component_roots, connected_components


def bfs_smallest(edges: list[tuple[int, int]]) -> dict[int, int]:
    """node -> smallest node of its component, by breadth-first search."""
    adj: dict[int, set[int]] = defaultdict(set)
    for a, b in edges:
        adj[a].add(b)
        adj[b].add(a)
    out: dict[int, int] = {}
    for start in sorted(adj):
        if start in out:
            continue
        seen, queue = {start}, deque([start])
        while queue:
            for y in adj[queue.popleft()] - seen:
                seen.add(y)
                queue.append(y)
        for x in seen:
            out[x] = start  # nodes visited in sorted order: start is the smallest of its component
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(-50, 50)), max_size=120))
def test_components_equal_breadth_first_search(edges):
    sparse = [(a * 1000 - 7, b * 1000 - 7) for a, b in edges]  # sparse and negative ids; self loops too
    a = np.array([e[0] for e in sparse], dtype=np.int64)
    b = np.array([e[1] for e in sparse], dtype=np.int64)
    nodes, root = connected_components(a, b)
    want = bfs_smallest(sparse)
    assert nodes.tolist() == sorted(want)
    assert root.tolist() == [want[x] for x in nodes.tolist()]
    # the edge order and direction do not matter
    order = np.random.default_rng(len(edges)).permutation(len(a))
    n2, r2 = connected_components(b[order], a[order])
    assert n2.tolist() == nodes.tolist() and r2.tolist() == root.tolist()
    # nor how they are cut into chunks (fuzzy_dedup streams its edge files through Components)
    cuts = np.sort(np.random.default_rng(len(edges) + 1).integers(0, len(a) + 1, size=4))
    streamed = Components()
    for part in np.split(order, cuts):
        streamed.add(a[part], b[part])
    n3, r3 = streamed.result()
    assert n3.tolist() == nodes.tolist() and r3.tolist() == root.tolist()
    assert streamed.edges == len(a)


def test_a_long_chain_and_dense_roots():
    n = 5000
    chain = np.arange(n - 1, dtype=np.int64)
    nodes, root = connected_components(chain[::-1], chain[::-1] + 1)  # worst case for naive propagation
    assert nodes.tolist() == list(range(n)) and not root.any()
    roots = component_roots(8, np.array([5, 2, 7]), np.array([3, 6, 3]))
    assert roots.tolist() == [0, 1, 2, 3, 4, 3, 2, 3]
    assert component_roots(3, np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == [0, 1, 2]


def test_chunks_that_join_earlier_components_and_add_smaller_nodes():
    c = Components()
    c.add(np.array([10, 30]), np.array([11, 31]))  # {10, 11}, {30, 31}
    c.add(np.array([5]), np.array([31]))  # a new smaller node takes {30, 31} over
    c.add(np.array([11]), np.array([30]))  # and joins the first component
    nodes, root = c.result()
    assert nodes.tolist() == [5, 10, 11, 30, 31] and root.tolist() == [5] * 5
    c.add(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert c.result()[0].tolist() == [5, 10, 11, 30, 31] and c.edges == 4
