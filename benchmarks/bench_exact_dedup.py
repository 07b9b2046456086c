SPEC = {"transform": "exact_dedup", "input": "doc_id", "params": {}, "targets": "<= 2x the plain Parquet copy; peak RSS follows distinct texts"}
