"""Benchmark spec of fuzzy_dedup, and a speed/accuracy comparison of its MinHash with datasketch.

``scripts/bench.py --only fuzzy_dedup`` runs the stage (all phases) on exact_dedup's output; the
baseline is datasketch's per-document loop (``MinHash(112).update_batch`` of the same word
5-shingles, then ``LeanMinHash``) on the first 20,000 documents: the MinHash step alone.

    .venv/bin/python benchmarks/bench_fuzzy_dedup.py <folder of Parquet files> [docs]

compares the two MinHash implementations on the same texts: signatures per second, and how far
each estimate is from the exact shingle Jaccard similarity on pairs of real near duplicates and
on random pairs (mean absolute error, 99th percentile).
"""

from __future__ import annotations

import pathlib
import sys
import time

SPEC = {
    "transform": "fuzzy_dedup",
    "input": "exact_dedup",
    "params": {},
    "targets": ">= 6,000 docs/s end to end on 2 cores (--workers 2) at 200k docs; peak RSS flat from 200k to 400k docs "
    "(--memory-sizes 200000,400000); MinHash faster than datasketch at equal accuracy",
}

BASELINE_DOCS = 20_000


def _texts(src_dir: pathlib.Path, limit: int) -> list[str]:
    import pyarrow.parquet as pq

    out: list[str] = []
    for f in sorted(pathlib.Path(src_dir).rglob("*.parquet")):
        if any(p.startswith(("_", ".")) for p in f.relative_to(src_dir).parts):
            continue
        out += pq.read_table(f, columns=["contents"]).column("contents").to_pylist()
        if len(out) >= limit:
            break
    return out[:limit]


def _shingles(text: str, k: int = 5) -> list[bytes]:
    w = text.lower().split()
    if not w:
        return []
    if len(w) < k:
        return [" ".join(w).encode()]
    return [" ".join(w[i : i + k]).encode() for i in range(len(w) - k + 1)]


def datasketch_signatures(texts: list[str], num_perm: int = 112):
    """datasketch's usual loop: one MinHash per document (shingling included, as in the stage)."""
    from datasketch import LeanMinHash, MinHash

    proto = MinHash(num_perm=num_perm)
    out = []
    for t in texts:
        m = MinHash(num_perm=num_perm, permutations=proto.permutations, scheme="affine32")
        sh = _shingles(t)
        if sh:
            m.update_batch(sh)
        out.append(LeanMinHash(m))
    return out


def prepline_signatures(texts: list[str], num_perm: int = 112):
    import pyarrow as pa

    from prepline import minhash

    return minhash.signatures(minhash.shingle(pa.array(texts, pa.large_string()), 5), num_perm)


def baseline(src_dir: pathlib.Path) -> dict:
    """datasketch MinHash (112 permutations, word 5-shingles) per document on the same texts."""
    texts = _texts(src_dir, BASELINE_DOCS)
    t0 = time.perf_counter()
    datasketch_signatures(texts)
    secs = time.perf_counter() - t0
    return {"name": f"datasketch MinHash+LeanMinHash loop, {len(texts):,} docs (signatures only)", "docs_per_s": len(texts) / secs}


def compare(src_dir: pathlib.Path, docs: int = 20_000) -> dict:
    """Speed and accuracy of prepline.minhash against datasketch on the same texts."""
    import numpy as np

    texts = _texts(src_dir, docs)
    t0 = time.perf_counter()
    ds = datasketch_signatures(texts)
    t_ds = time.perf_counter() - t0
    t0 = time.perf_counter()
    sig, rows = prepline_signatures(texts)
    t_pl = time.perf_counter() - t0
    row_of = {int(r): i for i, r in enumerate(rows)}

    # pairs to score: every pair sharing a shingle with Jaccard >= 0.3 (near duplicates), plus random pairs
    sets = [set(_shingles(t)) for t in texts]
    post: dict = {}
    for i, s in enumerate(sets):
        for x in s:
            post.setdefault(x, []).append(i)
    inter: dict = {}
    for d in post.values():
        if 1 < len(d) <= 200:
            for x in range(len(d)):
                for y in range(x + 1, len(d)):
                    inter[(d[x], d[y])] = inter.get((d[x], d[y]), 0) + 1
    near = [(a, b, n / (len(sets[a]) + len(sets[b]) - n)) for (a, b), n in inter.items()]
    near = [p for p in near if p[2] >= 0.3]
    rng = np.random.default_rng(0)
    rand = []
    for a, b in rng.integers(0, len(texts), size=(2000, 2)):
        if a != b and sets[a] and sets[b]:
            n = len(sets[a] & sets[b])
            rand.append((int(a), int(b), n / len(sets[a] | sets[b])))
    out = {"docs": len(texts), "datasketch_docs_per_s": len(texts) / t_ds, "prepline_docs_per_s": len(texts) / t_pl,
           "speedup": t_ds / t_pl}
    for name, pairs in (("near_pairs", near), ("random_pairs", rand)):
        e_ds = np.array([abs(ds[a].jaccard(ds[b]) - j) for a, b, j in pairs if sets[a] and sets[b]])
        e_pl = np.array([abs(float((sig[row_of[a]] == sig[row_of[b]]).mean()) - j) for a, b, j in pairs if sets[a] and sets[b]])
        out[name] = {
            "pairs": len(e_ds),
            "datasketch_mae": round(float(e_ds.mean()), 4), "datasketch_p99": round(float(np.quantile(e_ds, 0.99)), 4),
            "prepline_mae": round(float(e_pl.mean()), 4), "prepline_p99": round(float(np.quantile(e_pl, 0.99)), 4),
        }
    return out


if __name__ == "__main__":
    import json

    src = pathlib.Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    print(json.dumps(compare(src, n), indent=2))
