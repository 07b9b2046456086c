"""The peer benchmark's corpus: real multilingual text in documents of ~1,280 characters, with
planted exact copies and near copies whose true word 5-shingle Jaccard is known.

    .venv/bin/python benchmarks/peers/corpus.py <out> [docs]

Built from a prepline sample (real text from packages, see :mod:`prepline.sample`): its original
documents are re-cut per language into documents of ~800-1,800 characters (long texts split at
white space, short ones joined; Japanese, Chinese and Korean dialogue documents stay as they are,
so their whitespace shingles stay meaningless for every tool alike). Then, in proportion to
``docs``:

* 3 % exact copies of random originals: half byte-identical, a quarter lower-cased, a quarter
  with inner white space changed (``kind`` ``exact``, ``exact_case``, ``exact_space``);
* 5 % near copies of originals in whitespace languages, with words replaced, deleted or
  inserted until the Jaccard falls to a target drawn uniformly from [0.55, 0.99): some are below
  the usual 0.75 threshold on purpose, so removing them costs precision.

Written under ``<out>``: ``corpus/part-*.parquet`` (columns ``doc_id`` int64 0..N-1, ``id``
string, ``contents``), ``nodups/`` (the same without the planted exact copies: the fuzzy dedup
input every tool reads), and ``truth/``: ``docs.parquet`` (id, lang of the source text, kind,
dup_of, planted jaccard) and ``pairs.parquet`` (every pair of ``nodups`` documents with true
Jaccard >= 0.5: candidates by brute force over hashed shingles (``prepline.sample.near_pairs``),
each measured again exactly, so accidental near copies count too). Nothing here is a test fixture: the tests never read it.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

EXACT_FRACTION = 0.03
NEAR_FRACTION = 0.05
NEAR_TARGET = (0.55, 0.99)
CUT = (800, 1550)  # target lengths in characters (uniform); joined texts overshoot: ~1,300 on average
NO_SPACE_LANGS = ("ja", "zh", "ko")
SCHEMA = pa.schema([("doc_id", pa.int64()), ("id", pa.string()), ("contents", pa.string())])


def _recut(texts: list[str], rng: random.Random) -> list[str]:
    """Texts of one whitespace language, cut and joined into documents of CUT characters."""
    out, buf = [], ""
    want = rng.randint(*CUT)
    for t in texts:
        t = f"{buf}\n\n{t.strip()}" if buf else t.strip()
        buf = ""
        while len(t) > 2 * want:
            at = t.rfind(" ", 0, want)
            at = at if at > want // 2 else want
            out.append(t[:at].strip())
            t, want = t[at:].strip(), rng.randint(*CUT)
        buf = t
        if len(buf) >= want:
            out.append(buf)
            buf, want = "", rng.randint(*CUT)
    return out + ([buf] if buf else [])


def _near_copy(text: str, target: float, rng: random.Random) -> tuple[str, float] | None:
    """Words replaced, deleted or inserted one at a time until the Jaccard is <= target."""
    from prepline.sample import shingle_jaccard

    words = text.split(" ")
    if len(text.split()) < 60:
        return None
    vocab = [w for w in words if len(w) > 3] or ["the"]
    new, j = list(words), 1.0
    for _ in range(400):
        op, at = rng.random(), rng.randrange(len(new))
        if op < 0.6:
            new[at] = rng.choice(vocab) + ("s" if rng.random() < 0.3 else "")
        elif op < 0.8 and len(new) > 20:
            del new[at]
        else:
            new.insert(at, rng.choice(vocab))
        cand = " ".join(new)
        j = shingle_jaccard(text, cand)
        if j <= target:
            break
    if not 0.5 <= j < 1.0 or " ".join(cand.lower().split()) == " ".join(text.lower().split()):
        return None
    return cand, j


def _exact_copy(text: str, rng: random.Random) -> tuple[str, str]:
    from prepline.sample.variants import _case_variant, _space_variant

    r = rng.random()
    if r < 0.25 and (v := _case_variant(text)) is not None:
        return v, "exact_case"
    if r < 0.5 and (v := _space_variant(text, rng)) is not None:
        return v, "exact_space"
    return text, "exact"


def _originals(n: int, seed: int, factor: float = 1.25) -> list[tuple[str, str]]:
    """n (text, lang) originals from a prepline sample, re-cut to CUT characters. A sample of
    ``factor`` × n documents is built (its duplicates and composed documents are not originals); a
    larger one when that gives too few (the 50k corpus, built with 1.25, stays the same)."""
    from prepline.sample import build_sample

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        build_sample(tmp, docs=max(200, int(n * factor)), seed=seed, files=1)
        data = pq.read_table(Path(tmp) / "part-00000.parquet", columns=["sample_id", "contents"])
        truth = pq.read_table(Path(tmp) / "_truth" / "docs.parquet", columns=["sample_id", "lang", "kind"])
    assert data.column("sample_id").equals(truth.column("sample_id"))
    by_lang: dict[str, list[str]] = {}
    for text, lang, kind in zip(data.column("contents").to_pylist(), truth.column("lang").to_pylist(), truth.column("kind").to_pylist()):
        if kind == "original" and lang:
            by_lang.setdefault(lang, []).append(text)
    docs = []
    for lang in sorted(by_lang):
        texts = by_lang[lang] if lang in NO_SPACE_LANGS else _recut(by_lang[lang], rng)
        docs.extend((t, lang) for t in texts if t.strip())
    rng.shuffle(docs)
    if len(docs) < n:
        if factor >= 4:
            raise SystemExit(f"the sample gave {len(docs)} documents, {n} wanted")
        return _originals(n, seed, factor * n / max(len(docs), 1) * 1.05)
    return docs[:n]


def _plan(docs: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    n_exact, n_near = round(docs * EXACT_FRACTION), round(docs * NEAR_FRACTION)
    base = [{"contents": t, "lang": lang, "kind": "original", "dup_of": None, "jaccard": None}
            for t, lang in _originals(docs - n_exact - n_near, seed)]
    extra: list[tuple[int, dict]] = []
    spaced = [i for i, d in enumerate(base) if d["lang"] not in NO_SPACE_LANGS]
    for i in rng.sample(spaced, len(spaced)):
        if len(extra) >= n_near:
            break
        got = _near_copy(base[i]["contents"], rng.uniform(*NEAR_TARGET), rng)
        if got:
            extra.append((i, {"contents": got[0], "lang": base[i]["lang"], "kind": "near", "jaccard": got[1]}))
    if len(extra) < n_near:
        raise SystemExit("not enough long documents for the near copies")
    for i in rng.sample(range(len(base)), n_exact):
        text, kind = _exact_copy(base[i]["contents"], rng)
        extra.append((i, {"contents": text, "lang": base[i]["lang"], "kind": kind, "jaccard": None}))
    # each copy lands after its original
    keyed = [(float(p), p, d, None) for p, d in enumerate(base)]
    keyed += [(i + 0.5 + rng.random() * (len(base) - i), len(base) + k, d, i) for k, (i, d) in enumerate(extra)]
    keyed.sort(key=lambda t: (t[0], t[1]))
    pos = {t[1]: n for n, t in enumerate(keyed) if t[3] is None}
    out = []
    for n, (_, _, d, orig) in enumerate(keyed):
        out.append({**d, "doc_id": n, "id": f"p{n:07d}", "dup_of": None if orig is None else f"p{pos[orig]:07d}"})
    return out


def _write(folder: Path, rows: list[dict], files: int) -> None:
    from prepline.data_access import PARQUET_WRITE_OPTIONS

    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    step = -(-len(rows) // files)
    for f in range(files):
        part = rows[f * step : (f + 1) * step]
        t = pa.table({k: [r[k] for r in part] for k in SCHEMA.names}, schema=SCHEMA)
        pq.write_table(t, folder / f"part-{f:05d}.parquet", **PARQUET_WRITE_OPTIONS)


def true_pairs(texts: list[str], threshold: float = 0.5) -> list[tuple[int, int, float]]:
    """Every pair with word 5-shingle Jaccard >= threshold, with its exact Jaccard.

    ``near_pairs`` finds candidates without the shingles shared by more than 200 texts (formulaic
    parliamentary phrases), so its Jaccard of a pair can be low; candidates are taken well below
    the threshold and each is measured again on the full shingle sets.
    """
    from prepline.sample import near_pairs, shingle_jaccard

    out = []
    for a, b, _ in near_pairs(texts, threshold * 0.6):
        j = shingle_jaccard(texts[a], texts[b])
        if j >= threshold:
            out.append((a, b, j))
    return out


def write_pairs(path: Path, ids: list[str], pairs: list[tuple[int, int, float]]) -> None:
    tmp = path.with_name(".pairs.tmp")
    pq.write_table(pa.table({"a": [ids[a] for a, _, _ in pairs], "b": [ids[b] for _, b, _ in pairs],
                             "jaccard": [j for _, _, j in pairs]}), tmp)
    os.replace(tmp, path)


#: above this many documents the corpus is copies of the corpus of this size (``replicated``): building
#: one holds every document and its near-duplicate pairs in memory (24 GB ran out at 400,000)
REPLICATE_UNIT = 200_000


def replicated(out: Path, docs: int, seed: int = 7, files: int = 8) -> dict:
    """``docs`` documents as ``docs / REPLICATE_UNIT`` copies of the unit corpus (built beside ``out``),
    each copy's ids made unique (``id`` gets ``-r<k>``, ``doc_id`` moves by k units): for the stages that
    judge each document alone (quality_classifier, decontaminate, url_filter, ...). The copies are exact
    duplicates of each other, so the dedup stages' truth does not hold: no ``nodups/`` and no pairs."""
    out = Path(out)
    summary_file = out / "truth" / "summary.json"
    if summary_file.exists():
        s = json.loads(summary_file.read_text())
        if (s["docs"], s["seed"], s["files"], s.get("cut"), s.get("replicas")) == (docs, seed, files, list(CUT), docs // REPLICATE_UNIT):
            return s
    unit = build(out.parent / f"docs{REPLICATE_UNIT}", REPLICATE_UNIT, seed, files)
    reps = docs // REPLICATE_UNIT
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    (out / "truth").mkdir(parents=True, exist_ok=True)
    for k in range(reps):
        for f in sorted((out.parent / f"docs{REPLICATE_UNIT}" / "corpus").glob("*.parquet")):
            t = pq.read_table(f)
            t = t.set_column(t.column_names.index("id"), "id", pa.array([f"{x}-r{k}" for x in t.column("id").to_pylist()]))
            t = t.set_column(t.column_names.index("doc_id"), "doc_id", pc.add(t.column("doc_id"), k * REPLICATE_UNIT))
            pq.write_table(t, out / "corpus" / f"r{k}-{f.name}")
    truth = pq.read_table(out.parent / f"docs{REPLICATE_UNIT}" / "truth" / "docs.parquet")
    parts = []
    for k in range(reps):  # the per-document truth (language, kind), with the copies' ids
        t = truth.set_column(truth.column_names.index("id"), "id", pa.array([f"{x}-r{k}" for x in truth.column("id").to_pylist()]))
        parts.append(t.set_column(t.column_names.index("doc_id"), "doc_id", pc.add(t.column("doc_id"), k * REPLICATE_UNIT)))
    pq.write_table(pa.concat_tables(parts), out / "truth" / "docs.parquet")
    s = {**unit, "docs": docs, "replicas": reps, "files": files, "pairs_ge_0.75": None, "pairs_ge_0.5": None,
         "parquet_mb": round(sum(f.stat().st_size for f in (out / "corpus").glob("*.parquet")) / 1e6, 1),
         "kinds": {k: v * reps for k, v in unit["kinds"].items()}, "langs": {k: v * reps for k, v in unit["langs"].items()}}
    summary_file.write_text(json.dumps(s, indent=2) + "\n")
    return s


def build(out: Path, docs: int = 50_000, seed: int = 7, files: int = 8) -> dict:
    """Write the corpus, the exact-dedup'd copy and the truth under ``out``; return its summary. Above
    ``REPLICATE_UNIT`` documents (a multiple of it), copies of that corpus: :func:`replicated`."""
    out = Path(out)
    if docs > REPLICATE_UNIT:
        if docs % REPLICATE_UNIT:
            raise SystemExit(f"--docs {docs}: above {REPLICATE_UNIT:,} the peer corpus is copies of the {REPLICATE_UNIT:,}-document "
                             f"one: give a multiple of {REPLICATE_UNIT:,}")
        return replicated(out, docs, seed, files)
    summary_file = out / "truth" / "summary.json"
    if summary_file.exists():
        s = json.loads(summary_file.read_text())
        if (s["docs"], s["seed"], s["files"], s.get("cut")) == (docs, seed, files, list(CUT)):
            return s
    rows = _plan(docs, seed)
    _write(out / "corpus", rows, files)
    nodups = [r for r in rows if not r["kind"].startswith("exact")]
    _write(out / "nodups", nodups, files)
    (out / "truth").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in ("id", "doc_id", "lang", "kind", "dup_of", "jaccard")} for r in rows]),
                   out / "truth" / "docs.parquet")
    pairs = true_pairs([r["contents"] for r in nodups])
    write_pairs(out / "truth" / "pairs.parquet", [r["id"] for r in nodups], pairs)
    chars = sum(len(r["contents"]) for r in rows)
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    langs: dict[str, int] = {}
    for r in rows:
        langs[r["lang"]] = langs.get(r["lang"], 0) + 1
    s = {"docs": docs, "seed": seed, "files": files, "cut": list(CUT), "chars_per_doc": round(chars / len(rows)),
         "parquet_mb": round(sum(f.stat().st_size for f in (out / "corpus").glob("*.parquet")) / 1e6, 1),
         "kinds": dict(sorted(kinds.items())), "langs": dict(sorted(langs.items(), key=lambda kv: -kv[1])),
         "pairs_ge_0.75": sum(1 for p in pairs if p[2] >= 0.75), "pairs_ge_0.5": len(pairs)}
    summary_file.write_text(json.dumps(s, indent=2) + "\n")
    return s


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 50_000), indent=2))
