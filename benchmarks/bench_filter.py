SPEC = {"transform": "filter", "params": {"criteria": ["length(contents) >= 20"]}, "targets": "<= 1.5x the plain Parquet copy"}
