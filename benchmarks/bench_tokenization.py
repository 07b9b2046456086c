"""Benchmark spec of tokenization: the stage against the raw tokenizer batch rate on the same texts.

The stage trains its BPE on the input (default parameters), encodes every document, writes the
token columns and the Megatron .bin/.idx (a part per file, merged by the driver). The baseline loads the tokenizer the stage wrote
(``<work>/tokenization/tokens/tokenizer.json``; trained here the same way when missing) and times
only ``Tokenizer.encode_batch`` over the same texts, in batches of the same size as the stage's.
"""

from __future__ import annotations

import pathlib
import time

SPEC = {
    "transform": "tokenization",
    "input": "filter",
    "params": {},
    "targets": "docs/s >= 0.9x the raw tokenizer.encode_batch rate on the same texts (training, I/O and the Megatron dataset included)",
}


def _texts(src_dir: pathlib.Path) -> list[str]:
    import pyarrow.parquet as pq

    out: list[str] = []
    for f in sorted(src_dir.rglob("*.parquet")):
        if any(p.startswith(("_", ".")) for p in f.relative_to(src_dir).parts):
            continue
        out += pq.read_table(f, columns=["contents"]).column("contents").to_pylist()
    return out


def baseline(src_dir: pathlib.Path) -> dict:
    from tokenizers import Tokenizer

    from prepline.tokens.tokenizer import train_bpe
    from prepline.transforms.tokenization import BATCH_CHARS

    texts = _texts(src_dir)
    tok_file = src_dir.parent / "tokenization" / "tokens" / "tokenizer.json"
    if tok_file.exists():
        tok = Tokenizer.from_file(str(tok_file))
    else:
        tok = train_bpe([t[:100_000] for t in texts[:: max(1, len(texts) // 10_000)]], 8192)
    tok.encode_special_tokens = True
    batches, cur, size = [], [], 0
    for t in texts:
        cur.append(t)
        size += len(t)
        if size >= BATCH_CHARS:
            batches.append(cur)
            cur, size = [], 0
    if cur:
        batches.append(cur)
    secs = 0.0
    for b in batches:
        t0 = time.perf_counter()
        encs = tok.encode_batch(b, add_special_tokens=False)
        secs += time.perf_counter() - t0
        del encs
    return {"name": "tokenizers encode_batch", "docs_per_s": len(texts) / secs if secs else 0.0}
