SPEC = {
    "transform": "exact_dedup",
    "input": "doc_id",
    "params": {},
    "variants": {"nfkc": {"nfkc": True}},
    "targets": "engine <= 2x the plain Parquet copy at 200k docs; peak RSS growth <= 64 bytes per document from 200k to "
    "1M docs at the same file size (--memory-sizes 200000:16,1000000:80)",
}
