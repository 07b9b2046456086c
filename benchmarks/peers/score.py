"""Accuracy of each tool's output against the peer corpus' truth (benchmarks/peers/corpus.py).

* dedup: a removed document is one of the input's ids missing from the output. Exact: per planted
  group (original + its copies), a tool should remove all but one; recall = removed in groups,
  capped at size - 1 per group, / copies; precision = the same count / removed (a document removed
  outside any group, or the last one of a group, is a false positive). Fuzzy: recall = true pairs (Jaccard >= threshold, word
  5-shingles, brute force) with at least one side removed / true pairs; precision = removed
  documents that have a partner at Jaccard >= threshold / removed.
* lang_id: share of documents whose predicted code (region/script cut off) equals the language of
  the source text.
* tokenization: per-document token counts against prepline's (same tokenizer.json), and totals.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def read_columns(folder: Path, columns: list[str]) -> pa.Table:
    """The given columns (those present) of every Parquet file under folder, skipping _/. folders and tokens/."""
    parts = []
    for f in sorted(Path(folder).rglob("*.parquet")):
        rel = f.relative_to(folder).parts
        if any(p.startswith(("_", ".")) for p in rel) or "tokens" in rel[:-1]:
            continue
        names = pq.read_schema(f).names
        parts.append(pq.read_table(f, columns=[c for c in columns if c in names]))
    if not parts:
        return pa.table({})
    return pa.concat_tables(parts, promote_options="permissive")


def _ids(folder: Path) -> set[str]:
    t = read_columns(folder, ["id"])
    return set(t.column("id").to_pylist()) if "id" in t.column_names else set()


def exact(truth: Path, src: Path, out: Path) -> dict:
    docs = pq.read_table(truth / "docs.parquet", columns=["id", "kind", "dup_of"]).to_pylist()
    group = {d["id"]: d["dup_of"] if d["kind"].startswith("exact") else d["id"] for d in docs}
    sizes = Counter(group.values())
    removed = _ids(src) - _ids(out)
    gone = Counter(group[i] for i in removed if sizes[group[i]] > 1)
    copies = sum(s - 1 for s in sizes.values() if s > 1)
    caught = sum(min(n, sizes[g] - 1) for g, n in gone.items())
    return {"removed": len(removed), "recall": caught / copies if copies else 1.0,
            "precision": caught / len(removed) if removed else 1.0}


def fuzzy(truth: Path, src: Path, out: Path, threshold: float = 0.75) -> dict:
    pairs = pq.read_table(truth / "pairs.parquet")
    pairs = pairs.filter(pc.greater_equal(pairs.column("jaccard"), threshold))
    a, b = pairs.column("a").to_pylist(), pairs.column("b").to_pylist()
    removed = _ids(src) - _ids(out)
    hit = sum(1 for x, y in zip(a, b) if x in removed or y in removed)
    partnered = set(a) | set(b)
    return {"removed": len(removed), "pairs": len(a), "recall": hit / len(a) if a else 1.0,
            "precision": len(removed & partnered) / len(removed) if removed else 1.0}


def _code(c: str | None) -> str:
    return (c or "").replace("__label__", "").split("-")[0].split("_")[0].lower()


def lang(truth: Path, out: Path, column: str) -> dict:
    docs = pq.read_table(truth / "docs.parquet", columns=["id", "lang"])
    want = dict(zip(docs.column("id").to_pylist(), docs.column("lang").to_pylist()))
    t = read_columns(out, ["id", column])
    if column not in t.column_names:
        return {"error": f"no column {column!r} in the output"}
    got = dict(zip(t.column("id").to_pylist(), t.column(column).to_pylist()))
    scored = [i for i in got if want.get(i)]
    right = sum(1 for i in scored if _code(got[i]) == want[i])
    return {"docs": len(scored), "accuracy": right / len(scored) if scored else 0.0}


def token_counts(out: Path, id_column: str, count_column: str) -> dict[str, int]:
    t = read_columns(out, [id_column, count_column])
    return dict(zip(t.column(id_column).to_pylist(), t.column(count_column).to_pylist()))


def datatrove_tokens(out: Path) -> int:
    """Total tokens of datatrove's .ds files (uint16 per token for a vocabulary under 65,536)."""
    return sum(f.stat().st_size for f in Path(out).rglob("*.ds")) // 2


def compare_tokens(ref: dict[str, int], other: dict[str, int] | None, total: int | None = None) -> dict:
    """Per-document counts equal to prepline's (ids both have), and the totals."""
    ref_total = int(np.sum(list(ref.values()), dtype=np.int64))
    if other is None:
        return {"total": total, "prepline_total": ref_total, "identical_total": total == ref_total}
    common = [i for i in other if i in ref]
    same = sum(1 for i in common if other[i] == ref[i])
    # documents without tokens (empty text) may be skipped by a tool: they hold no tokens either way
    missing = [i for i in ref if i not in other and ref[i] != 0]
    return {"docs": len(common), "identical_docs": same, "missing_nonempty": len(missing),
            "total": int(sum(other.values())), "prepline_total": ref_total}


def c4_agreement(src: Path, out: Path, text_column: str, ref: dict) -> dict:
    """C4 cleaning: prepline's output is the reference (it runs first); a peer's keep/remove decisions
    are compared with it over every input document, and the texts of the documents both keep."""
    t = read_columns(out, ["id", text_column])
    kept = dict(zip((str(x) for x in t.column("id").to_pylist()), t.column(text_column).to_pylist())) if t.num_rows else {}
    if "c4" not in ref:
        ref["c4"] = kept
        return {"docs_out": len(kept)}
    mine, ids = ref["c4"], {str(i) for i in _ids(src)}
    agree = sum((i in mine) == (i in kept) for i in ids)
    both = [i for i in kept if i in mine]
    return {"docs_out": len(kept), "agreement": agree / max(len(ids), 1), "both_kept": len(both),
            "same_text": sum(mine[i] == kept[i] for i in both)}


def nonblank_lines(texts: pa.ChunkedArray | pa.Array) -> int:
    """Lines with something besides white space, over all texts (split at "\\n", as line_dedup counts)."""
    lines = pc.list_flatten(pc.split_pattern(texts, "\n"))
    return int(pc.sum(pc.invert(pc.match_substring_regex(lines, r"^\s*$"))).as_py() or 0)
