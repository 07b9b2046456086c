"""Benchmark spec for lang_id: the transform against raw fastText batch prediction on the same texts."""

from __future__ import annotations

import pathlib
import time

SPEC = {
    "transform": "lang_id",
    "input": "fuzzy_dedup",  # the previous pipeline stage (the sample when it is not registered)
    "params": {},
    "targets": ">= 0.9x the raw fastText batch predict rate (model.predict(list, k=1)) on the same normalised texts",
}


def baseline(src_dir: pathlib.Path) -> dict:
    """Raw fastText: one model.predict(list, k=1) over every document, texts normalised as lang_id does.

    Reading the files and normalising the text are not timed: only the library call is.
    """
    import fasttext
    import pyarrow.parquet as pq

    from prepline.transforms.lang_id import LangIdConfig, normalise, packaged_model

    cfg = LangIdConfig()
    texts: list[str] = []
    for f in sorted(pathlib.Path(src_dir).rglob("*.parquet")):
        if any(p.startswith(("_", ".")) for p in f.relative_to(src_dir).parts):
            continue
        col = pq.read_table(f, columns=[cfg.content_column]).column(cfg.content_column).combine_chunks()
        texts.extend(normalise(col, cfg.max_chars).to_pylist())
    model = fasttext.load_model(str(packaged_model()))
    n = len(texts)
    t0 = time.perf_counter()
    model.predict(texts, k=1)
    secs = time.perf_counter() - t0
    return {"name": f"fastText predict(list, k=1), max_chars={cfg.max_chars}", "docs_per_s": n / secs}
