SPEC = {"transform": "doc_id", "input": "sample", "params": {}, "targets": "<= 1.5x the plain Parquet copy"}
