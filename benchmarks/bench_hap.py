"""Benchmark spec for hap: sentence-level scoring of every document, flag at the default threshold."""

from __future__ import annotations

import pathlib
import time

SPEC = {
    "transform": "hap",
    "input": "sample",
    "params": {},
    "targets": "throughput well above the raw library rate on the same sentences (profanity_check.predict_prob); "
    "AUC >= 0.98 on the sample's planted English profanity (tests/transforms/test_hap.py)",
}

BASELINE_DOCS = 20_000  # the library path is slow: time it on the first documents only


def baseline(src_dir: pathlib.Path) -> dict:
    """profanity_check.predict_prob (the package's own API) on the same sentences of the first documents."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from profanity_check import predict_prob

    from prepline.transforms.hap import SENTENCE_SPLIT

    files = sorted(p for p in pathlib.Path(src_dir).rglob("*.parquet") if not any(x.startswith("_") for x in p.relative_to(src_dir).parts))
    texts, n = [], 0
    for f in files:
        col = pq.read_table(f, columns=["contents"])["contents"]
        take = col.slice(0, BASELINE_DOCS - n)
        texts.append(take)
        n += len(take)
        if n >= BASELINE_DOCS:
            break
    sentences = []
    for col in texts:
        parts = pc.split_pattern_regex(col.combine_chunks(), SENTENCE_SPLIT)
        sentences.extend(s for s in parts.flatten().to_pylist() if s)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(sentences), 50_000):
        predict_prob(sentences[i : i + 50_000])
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"name": f"profanity_check.predict_prob on {len(sentences):,} sentences of {n:,} docs", "docs_per_s": n / secs, "docs_per_cpu_s": n / cpu}
