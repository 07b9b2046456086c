"""Benchmark spec for doc_quality: Gopher/C4 annotations over whole columns."""

from __future__ import annotations

SPEC = {
    "transform": "doc_quality",
    "input": "lang_id",  # reads the lang column lang_id adds
    "params": {},
    "targets": ">= 4,000 docs/s on 2 cores (--workers 2) at 200k docs",
}
