"""Benchmark spec for pii_redactor: default entities, replace mode, prefilter on."""

from __future__ import annotations

import pathlib
import time

SPEC = {
    "transform": "pii_redactor",
    "input": "sample",
    "params": {},
    "targets": "GUIDE: ~650 docs/s with pattern recognizers; well above the baseline (Presidio's BatchAnalyzerEngine "
    "+ AnonymizerEngine on every document, same recognizers)",
}

BASELINE_DOCS = 3_000  # the plain Presidio path is slow: time it on the first documents only


def baseline(src_dir: pathlib.Path) -> dict:
    """Presidio used plainly: BatchAnalyzerEngine over every document (blank spaCy tokenizer), then the anonymizer."""
    import pyarrow.parquet as pq
    from presidio_analyzer import BatchAnalyzerEngine
    from presidio_anonymizer import AnonymizerEngine

    from prepline.transforms.pii_redactor import DEFAULT_ENTITIES, build_analyzer

    files = sorted(p for p in pathlib.Path(src_dir).rglob("*.parquet") if not any(x.startswith("_") for x in p.relative_to(src_dir).parts))
    texts: list[str] = []
    for f in files:
        texts.extend(pq.read_table(f, columns=["contents"])["contents"].to_pylist()[: BASELINE_DOCS - len(texts)])
        if len(texts) >= BASELINE_DOCS:
            break
    analyzer, _, _ = build_analyzer("en")
    batch, anonymizer = BatchAnalyzerEngine(analyzer), AnonymizerEngine()
    t0, c0 = time.perf_counter(), time.process_time()
    results = batch.analyze_iterator(texts, language="en", entities=DEFAULT_ENTITIES, batch_size=64, score_threshold=0.5)
    for text, res in zip(texts, results):
        if res:
            anonymizer.anonymize(text=text, analyzer_results=res)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"name": f"Presidio BatchAnalyzerEngine + AnonymizerEngine on {len(texts):,} docs", "docs_per_s": len(texts) / secs, "docs_per_cpu_s": len(texts) / cpu}
