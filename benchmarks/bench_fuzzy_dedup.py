"""Benchmark spec of fuzzy_dedup, its recall and precision on planted near copies, and a
speed/accuracy comparison of its MinHash with datasketch.

``scripts/bench.py --only fuzzy_dedup`` runs the stage (all phases) on exact_dedup's output, then
the former default (14 × 8 bands, word shingles) on the same input; the baseline is datasketch's
per-document loop (``MinHash(112).update_batch`` of the same word 5-shingles, then
``LeanMinHash``) on the first 20,000 documents: the MinHash step alone.

    .venv/bin/python benchmarks/bench_fuzzy_dedup.py accuracy <sample folder> [originals per language]

builds a corpus from the sample's original documents (every language it has) with one planted
near copy per original at a known Jaccard similarity (of the default script-aware shingles, drawn
uniformly from [0.5, 1)), runs the stage with its defaults and with the former default, and prints
the recall of the pairs at or above the threshold, the pairs below it that were clustered, and the
precision of the clusters (every member linked to the others by true Jaccard >= threshold).

    .venv/bin/python benchmarks/bench_fuzzy_dedup.py <folder of Parquet files> [docs]

compares the two MinHash implementations on the same texts: signatures per second, and how far
each estimate is from the exact shingle Jaccard similarity on pairs of real near duplicates and
on random pairs (mean absolute error, 99th percentile).
"""

from __future__ import annotations

import pathlib
import sys
import time

#: the default before LSH shapes were derived from target_recall, and before script-aware shingles
FORMER_DEFAULT = {"num_bands": 14, "rows_per_band": 8, "target_recall": 0.77, "shingle_type": "word"}

SPEC = {
    "transform": "fuzzy_dedup",
    "input": "exact_dedup",
    "params": {},
    "variants": {"former default 14x8 word": FORMER_DEFAULT},
    "targets": ">= 6,000 docs/s end to end on 2 cores (--workers 2) at 200k docs; recall >= 0.98 at J >= 0.75 and "
    "precision 1.0 (accuracy mode); peak RSS growth <= 64 bytes per document from 200k to 1M docs at the same "
    "file size (--memory-sizes 200000:16,1000000:80); MinHash faster than datasketch at equal accuracy",
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


def _planted_corpus(sample: pathlib.Path, per_lang: int, out: pathlib.Path, seed: int = 7) -> list[tuple[int, int, float, str]]:
    """Originals of every language of the sample (up to ``per_lang`` each), each with one near copy
    of known Jaccard; written with doc_id into 8 files. Returns the planted pairs (a, b, J, lang)."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from prepline.sample.text import by_chars, near_copy

    truth = pq.read_table(sample / "_truth" / "docs.parquet", columns=["sample_id", "lang", "kind"])
    lang_of = {s: lg for s, lg, k in zip(*(truth.column(c).to_pylist() for c in ("sample_id", "lang", "kind")))
               if k == "original" and lg}
    by_lang: dict[str, list[str]] = {}
    for f in sorted(sample.glob("*.parquet")):
        t = pq.read_table(f, columns=["sample_id", "contents"])
        for sid, text in zip(t.column("sample_id").to_pylist(), t.column("contents").to_pylist()):
            lg = lang_of.get(sid)
            if lg and len(by_lang.setdefault(lg, [])) < per_lang:
                by_lang[lg].append(text)
    rng = random.Random(seed)
    texts: list[str] = []
    pairs = []
    for lg in sorted(by_lang):
        docs = by_lang[lg]
        if len(docs) < 50:  # the long tail of one-document languages
            continue
        pool = sorted({u for d in docs for u in (list(d) if by_chars(d) else d.split()) if not u.isspace()})
        for d in docs:
            copy, j = near_copy(d, rng.uniform(0.5, 1.0), pool, rng)
            texts.append(d)
            if j < 1.0:
                pairs.append((len(texts) - 1, len(texts), j, lg))
                texts.append(copy)
    order = list(range(len(texts)))
    rng.shuffle(order)
    per = (len(order) + 7) // 8
    out.mkdir(parents=True, exist_ok=True)
    for i in range(8):
        rows = order[i * per : (i + 1) * per]
        pq.write_table(pa.table({"contents": [texts[r] for r in rows], "doc_id": pa.array(rows, pa.int64())}),
                       out / f"part-{i}.parquet")
    return pairs


def accuracy(sample: pathlib.Path, per_lang: int = 2000, threshold: float = 0.75) -> dict:
    """Recall (pairs with J >= threshold clustered together), pairs below it clustered, and precision of
    the clusters, for the defaults and the former default, on planted near copies (see the module doc)."""
    import tempfile

    import numpy as np
    import pyarrow.parquet as pq

    from prepline.engine import RunOptions, run_transform
    from prepline.graph import component_roots
    from prepline.sample.text import auto_shingles

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "in"
        pairs = _planted_corpus(pathlib.Path(sample), per_lang, src)
        n = max(b for _, b, *_ in pairs) + 1
        texts = {}
        for f in sorted(src.glob("*.parquet")):
            t = pq.read_table(f)
            texts.update(zip(t.column("doc_id").to_pylist(), t.column("contents").to_pylist()))
        for name, params in (("defaults", {}), ("former default (14 x 8, word)", FORMER_DEFAULT)):
            dst = pathlib.Path(tmp) / name.split()[0]
            t0 = time.perf_counter()
            meta = run_transform("fuzzy_dedup", {"mode": "annotate", **params}, RunOptions(str(src), str(dst), progress=False)).metadata
            secs = time.perf_counter() - t0
            cl: dict[int, int] = {}
            for f in sorted(dst.glob("*.parquet")):
                t = pq.read_table(f, columns=["doc_id", "fuzzy_cluster"])
                cl.update((d, c) for d, c in zip(t.column("doc_id").to_pylist(), t.column("fuzzy_cluster").to_pylist()) if c is not None)
            together = [a in cl and cl.get(a) == cl.get(b) for a, b, *_ in pairs]
            row = {"seconds": round(secs, 2), "lsh": f"{meta['plan']['lsh_bands']} x {meta['plan']['lsh_rows']}",
                   "candidate_pairs": meta["plan"]["candidate_pairs"]}
            for lg in ["all"] + sorted({p[3] for p in pairs}):
                mine = [(t, p[2]) for t, p in zip(together, pairs) if lg in ("all", p[3])]
                above = [t for t, j in mine if j >= threshold]
                edge = [t for t, j in mine if threshold <= j < threshold + 0.05]
                below = [t for t, j in mine if j < threshold]
                row[lg] = {"pairs_at_or_above": len(above), "recall": round(float(np.mean(above)), 4) if above else None,
                           "pairs_near_threshold": len(edge), "recall_near_threshold": round(float(np.mean(edge)), 4) if edge else None,
                           "pairs_below": len(below), "below_clustered": int(sum(below))}
            # precision: a clustered document counts when its cluster's true edges (J >= threshold,
            # Python sets) connect it to the cluster's other members
            members: dict[int, list[int]] = {}
            for d, c in cl.items():
                members.setdefault(c, []).append(d)
            good = 0
            for m in members.values():
                sets = [auto_shingles(texts[d]) for d in m]
                e = [(i, j) for i in range(len(m)) for j in range(i + 1, len(m))
                     if len(sets[i] & sets[j]) >= threshold * len(sets[i] | sets[j])]
                roots = component_roots(len(m), np.array([a for a, _ in e], np.int64), np.array([b for _, b in e], np.int64))
                good += int((roots == roots[0]).sum()) if len(set(roots.tolist())) == 1 else 0
            row["precision"] = round(good / max(1, len(cl)), 4)
            row["docs_in_clusters"] = len(cl)
            out[name] = row
        out["docs"] = n
    return out


if __name__ == "__main__":
    import json

    if sys.argv[1] == "accuracy":
        res = accuracy(pathlib.Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 2000)
        print(f"{res['docs']:,} documents; recall: planted pairs with J >= 0.75 in one cluster; near: 0.75 <= J < 0.80; "
              "below: pairs with J < 0.75 clustered")
        for name, row in res.items():
            if name == "docs":
                continue
            print(f"\n{name}: LSH {row['lsh']}, {row['candidate_pairs']:,} candidate pairs, {row['seconds']} s, "
                  f"precision {row['precision']} over {row['docs_in_clusters']:,} clustered documents")
            print(f"  {'lang':<5}{'pairs':>7}{'recall':>8}{'near':>6}{'recall':>8}{'below':>7}{'clustered':>10}")
            for lg, r in row.items():
                if isinstance(r, dict):
                    print(f"  {lg:<5}{r['pairs_at_or_above']:>7}{r['recall']:>8}{r['pairs_near_threshold']:>6}"
                          f"{str(r['recall_near_threshold']):>8}{r['pairs_below']:>7}{r['below_clustered']:>10}")
    else:
        src = pathlib.Path(sys.argv[1])
        n = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
        print(json.dumps(compare(src, n), indent=2))
