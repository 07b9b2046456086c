"""Runs that must end in a clear error or a correct result, never a success with documents lost or
duplicated (issue 30): a resume after an input file was edited in place, a tolerated file failing
after a dedup plan was made, colliding ids in fuzzy_dedup, counts of what was really written.
Each is measured as the issue measured it: ids and counts against an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.engine import RunOptions, run_transform
from prepline.errors import OutputError, PreplineError

KILL_AT = Path(__file__).parents[1] / "transforms" / "kill_at.py"
TEXT_LEN = 60


def _text(i: int) -> str:
    """A document of TEXT_LEN characters, distinct for each i (no two normalise alike)."""
    words = " ".join(f"w{(i * 7 + k) % 9973:04d}x{k}" for k in range(8))
    return f"doc {i:07d} {words}".ljust(TEXT_LEN, ".")[:TEXT_LEN]


def _write_fixed(path: Path, ids: list[int], texts: list[str]) -> None:
    """Uncompressed, plain-encoded, without statistics: the file's size depends only on the row
    count and the text lengths, so an edit that keeps the lengths keeps the size."""
    assert all(len(t) == TEXT_LEN for t in texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"doc_id": pa.array(ids, pa.int64()), "contents": pa.array(texts, pa.string())})
    pq.write_table(table, path, compression="none", use_dictionary=False, write_statistics=False)


def _rewrite_same_size(path: Path, ids: list[int], texts: list[str]) -> None:
    """Rewrite ``path`` in place with other texts of the same lengths: same size, later mtime (a
    file system with a coarse clock could give the rewrite its old time stamp within one tick;
    a real edit comes later than that, so the test moves it on by 1 ms if it did)."""
    before = path.stat()
    _write_fixed(path, ids, texts)
    after = path.stat()
    assert after.st_size == before.st_size
    if after.st_mtime_ns == before.st_mtime_ns:
        os.utime(path, ns=(after.st_atime_ns, after.st_mtime_ns + 1_000_000))


def _ids(folder: Path) -> Counter:
    """Every output document's id (a Counter: a duplicate shows as a count of 2)."""
    got: Counter = Counter()
    for p in sorted(folder.rglob("*.parquet")):
        if "_prepline" not in p.parts and "_removed" not in p.parts:
            got.update(pq.read_table(p, columns=["doc_id"]).column("doc_id").to_pylist())
    return got


def _texts(folder: Path) -> Counter:
    got: Counter = Counter()
    for p in sorted(folder.rglob("*.parquet")):
        if "_prepline" not in p.parts and "_removed" not in p.parts:
            got.update(pq.read_table(p, columns=["contents"]).column("contents").to_pylist())
    return got


def _cli(*args: str) -> list[str]:
    return ["run", *args, "--no-progress", "--workers", "1"]


# -- 1. a resume after an in-place, same-size edit of an input file -------------------------------

def _two_files(src: Path, n: int = 300) -> tuple[list[int], list[str]]:
    """Two files of n documents; the second half of b repeats texts of a (exact duplicates)."""
    a_ids, a_txt = list(range(n)), [_text(i) for i in range(n)]
    b_ids = list(range(n, 2 * n))
    b_txt = [_text(i) if i < n + n // 2 else _text(i - n) for i in b_ids]
    _write_fixed(src / "a.parquet", a_ids, a_txt)
    _write_fixed(src / "b.parquet", b_ids, b_txt)
    return b_ids, b_txt


@pytest.mark.parametrize("name, phase", [("exact_dedup", "reduce"), ("fuzzy_dedup", "buckets")])
def test_resume_after_same_size_edit_is_refused_not_mixed(tmp_path, name, phase):
    src, out = tmp_path / "in", tmp_path / "out"
    b_ids, b_txt = _two_files(src)
    params = json.dumps({"num_shards": 4})
    killed = subprocess.run([sys.executable, str(KILL_AT), phase, "1", "--",
                             *_cli(name, "--input", str(src), "--output", str(out), "--params", params)],
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, f"not killed in {phase} (exit {killed.returncode}): {killed.stderr[-2000:]}"
    assert (out / "_prepline" / "run.json").exists() and not (out / "metadata.json").exists()

    # b's first document (unique until now) becomes an equal-length copy of a's document 10; b's
    # copy of a's document 0 (row n // 2) becomes a new unique text: a same-size, in-place edit
    b_txt = list(b_txt)
    b_txt[0] = _text(10)
    b_txt[len(b_txt) // 2] = _text(999_999)
    _rewrite_same_size(src / "b.parquet", b_ids, b_txt)

    # what an uninterrupted run of the edited input gives
    ref = tmp_path / "ref"
    run_transform(name, {"num_shards": 4}, RunOptions(str(src), str(ref), workers=1, progress=False))
    want = _ids(ref)
    assert max(_texts(ref).values()) == 1 and b_ids[0] not in want  # the new copy is removed

    try:
        meta = run_transform(name, {"num_shards": 4}, RunOptions(str(src), str(out), workers=1, progress=False)).metadata
    except OutputError as e:  # refused: the error says which file changed and what to do
        assert "b.parquet" in e.message and "changed" in e.message and "--overwrite" in e.fix
        assert not (out / "metadata.json").exists()
    else:  # redone: then it must equal the uninterrupted run
        got = _ids(out)
        lost, extra = sum((want - got).values()), sum((got - want).values())
        assert (lost, extra) == (0, 0), f"resume mixed old and new data: {lost} lost, {extra} extra ({meta['status']})"
    # --overwrite starts over and gives the uninterrupted run's documents
    run_transform(name, {"num_shards": 4}, RunOptions(str(src), str(out), workers=1, progress=False, overwrite=True))
    assert _ids(out) == want


def test_fingerprint_sees_a_same_size_rewrite(tmp_path):
    from prepline import registry
    from prepline.data_access import open_location
    from prepline.engine import fingerprint, list_input

    src = tmp_path / "in"
    _write_fixed(src / "a.parquet", [1, 2], [_text(1), _text(2)])
    t = registry.build("exact_dedup", {})
    loc = open_location(str(src))
    before = fingerprint(t, list_input(loc), loc.uri)
    st = (src / "a.parquet").stat()
    _write_fixed(src / "a.parquet", [1, 2], [_text(1), _text(3)])
    os.utime(src / "a.parquet", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse clocks: a later mtime
    assert (src / "a.parquet").stat().st_size == st.st_size
    assert fingerprint(t, list_input(loc), loc.uri) != before


def test_s3_listing_and_single_object_carry_the_etag(s3_bucket):
    """On S3 the version tag is the ETag, the same from a listing (ListObjectsV2) and a HEAD; a
    rewrite of the same size changes it, and so the run's fingerprint."""
    from prepline import registry
    from prepline.data_access import open_location
    from prepline.engine import fingerprint

    loc = open_location(f"s3://{s3_bucket}/in")
    loc.write_bytes("a.parquet", b"x" * 100)
    [listed] = loc.list_files()
    one = loc.file_info("a.parquet")
    assert listed.tag.startswith("ETag=") and one is not None and one.tag == listed.tag and one.size == 100
    t = registry.build("exact_dedup", {})
    before = fingerprint(t, [listed], loc.uri)
    loc.write_bytes("a.parquet", b"y" * 100)
    [again] = loc.list_files()
    assert again.size == listed.size and again.tag != listed.tag
    assert fingerprint(t, [again], loc.uri) != before


# -- 2. a tolerated file that fails after the dedup plan was made ---------------------------------

META = "M" * 40  # the value of a column that the dedup phases do not read


def _with_meta(path: Path, ids: list[int], texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"doc_id": pa.array(ids, pa.int64()), "contents": pa.array(texts, pa.string()),
                      "meta": pa.array([META] * len(ids), pa.string())})
    pq.write_table(table, path, compression="none", use_dictionary=False, write_statistics=False, write_page_checksum=True)


def _kept_copies_elsewhere(src: Path, n: int = 200) -> None:
    """a.parquet holds the smallest ids; b and c repeat some of a's texts (a holds the kept copies)."""
    _with_meta(src / "a.parquet", list(range(n)), [_text(i) for i in range(n)])
    _with_meta(src / "b.parquet", list(range(n, 2 * n)), [_text(i - n) if (i - n) % 3 == 1 else _text(i) for i in range(n, 2 * n)])
    _with_meta(src / "c.parquet", list(range(2 * n, 3 * n)), [_text(i - 2 * n) if (i - 2 * n) % 6 == 0 else _text(i) for i in range(2 * n, 3 * n)])


def _corrupt_meta_page(path: Path) -> None:
    """Flip a byte inside a data page of column 'meta' (its page checksum no longer matches): the
    file's footer and its other columns read fine."""
    data = bytearray(path.read_bytes())
    at = data.index(META.encode()) + 5
    data[at] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(OSError):
        pq.read_table(path, columns=["meta"], page_checksum_verification=True)
    pq.read_table(path, columns=["doc_id", "contents"], page_checksum_verification=True)


def _delete_after_first_marker(monkeypatch, phase: str, victim: Path) -> list:
    """Delete ``victim`` when the first completion marker of ``phase`` is written (the plan's input
    was read, its later phases have not run): a file removed mid-run. Returns a list that holds
    True once it happened."""
    from prepline.context import MARKERS
    from prepline.data_access import LocalLocation

    done: list = []
    write = LocalLocation.write_bytes

    def hooked(self, rel, data):
        write(self, rel, data)
        if rel.startswith(f"{MARKERS}/{phase}/") and not done:
            victim.unlink()
            done.append(True)

    monkeypatch.setattr(LocalLocation, "write_bytes", hooked)
    return done


@pytest.mark.parametrize("name, first_reduce", [("exact_dedup", "reduce"), ("fuzzy_dedup", "buckets")])
@pytest.mark.parametrize("fault", ["corrupt_page", "deleted_mid_run"])
def test_a_file_failing_after_the_plan_never_costs_documents_of_healthy_files(tmp_path, monkeypatch, name, first_reduce, fault):
    src, out, ref_in, ref = tmp_path / "in", tmp_path / "out", tmp_path / "ref_in", tmp_path / "ref"
    _kept_copies_elsewhere(src)
    # the uninterrupted run without the failing file: what the healthy files must give
    _kept_copies_elsewhere(ref_in)
    (ref_in / "a.parquet").unlink()
    run_transform(name, {"num_shards": 4}, RunOptions(str(ref_in), str(ref), workers=1, progress=False))
    want = _ids(ref)
    assert sum(want.values()) == 400  # b and c share no text: nothing removed

    happened: list = [True]
    if fault == "corrupt_page":
        _corrupt_meta_page(src / "a.parquet")
    else:
        happened = _delete_after_first_marker(monkeypatch, first_reduce, src / "a.parquet")
    opts = RunOptions(str(src), str(out), workers=1, progress=False, max_failed_files=1)
    try:
        meta = run_transform(name, {"num_shards": 4}, opts).metadata
    except PreplineError as e:  # refused: the error names the file and says why it cannot be tolerated
        assert happened
        assert "a.parquet" in e.message and ("plan" in e.message or "changed while the run" in e.message), e.message
        assert e.fix
        meta = json.loads((out / "metadata.json").read_text())
        assert meta["status"] == "failed"
    else:  # tolerated: then the healthy files' documents are all there, none removed
        assert happened and meta["status"] == "success" and "a.parquet" in meta["failures"]
        got = _ids(out)
        lost, extra = sum((want - got).values()), sum((got - want).values())
        assert (lost, extra) == (0, 0), f"{lost} documents of healthy files lost, {extra} extra, status success"
        t = meta["totals"]
        assert t["docs_out"] == sum(got.values()) and t["docs_in"] == t["docs_out"] + t["removed_total"]


# -- 5. fuzzy_dedup with doc_id values that collide across different texts ------------------------

def _merged_numbered_from_zero(src: Path, n: int = 300, offset: int = 0) -> None:
    """Two datasets each numbered from 0 (``offset`` renumbers the second), merged: the second
    repeats every fourth text of the first under another position, so its id differs."""
    _write_fixed(src / "one" / "part-0.parquet", list(range(n)), [_text(i) for i in range(n)])
    two = [_text((i * 7 + 1) % n) if i % 4 == 0 else _text(10_000 + i) for i in range(n)]  # never its own id
    _write_fixed(src / "two" / "part-0.parquet", [offset + i for i in range(n)], two)


@pytest.mark.parametrize("verify", ["jaccard", "estimate"])
def test_fuzzy_dedup_with_ids_colliding_across_texts_keeps_no_duplicate(tmp_path, verify):
    """The texts share no shingle unless equal: the right output is every distinct text once (525
    of 600). exact_dedup on the same input is right (its keys are texts, not ids)."""
    src, out = tmp_path / "in", tmp_path / "out"
    _merged_numbered_from_zero(src)
    want = Counter(set(_texts(src)))
    assert sum(want.values()) == 600 - 75
    run_transform("exact_dedup", {"num_shards": 4}, RunOptions(str(src), str(tmp_path / "exact"), workers=1, progress=False))
    assert _texts(tmp_path / "exact") == want
    params = {"num_shards": 4, "verify": verify}
    try:
        meta = run_transform("fuzzy_dedup", params, RunOptions(str(src), str(out), workers=1, progress=False)).metadata
    except PreplineError as e:  # refused: names the id column and says how to get unique ids
        assert "doc_id" in e.message and "more than one document" in e.message, e.message
        assert "run doc_id first" in e.fix
        assert json.loads((out / "metadata.json").read_text())["status"] == "failed"
    else:  # handled: no exact duplicate kept, no distinct text lost
        got = _texts(out)
        kept_dups, lost = sum(v - 1 for v in got.values() if v > 1), sum((want - got).values())
        assert (kept_dups, lost) == (0, 0), f"{kept_dups} exact duplicates kept, {lost} distinct texts lost ({meta['status']})"


# -- 8. counts derived from what was written ------------------------------------------------------

def _rows_on_disk(folder: Path) -> int:
    return sum(pq.ParquetFile(p).metadata.num_rows for p in folder.rglob("*.parquet") if "_prepline" not in p.parts)


def test_filter_dropping_every_column_never_records_documents_it_did_not_write(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    _two_files(src, n=150)
    try:
        meta = run_transform("filter", {"columns_to_drop": ["doc_id", "contents"]},
                             RunOptions(str(src), str(out), workers=1, progress=False)).metadata
    except PreplineError as e:  # refused before any output: says why and what to do
        assert "every column" in e.message and "columns_to_drop" in e.message and e.fix
        assert _rows_on_disk(out) == 0
    else:  # ran: then metadata counts what the files hold, and the documents add up
        t = meta["totals"]
        assert t["docs_out"] == _rows_on_disk(out), f"docs_out {t['docs_out']} but the files hold {_rows_on_disk(out)} rows"
        assert t["docs_in"] == 300 == t["docs_out"] + t["removed_total"]


def test_a_sink_counts_the_rows_its_file_holds(tmp_path):
    """Whatever a transform hands the writer, docs_out is the written file's row count: a table
    without columns holds no rows in Parquet, so the file's count (0) is recorded, and the run's
    conservation check (docs_in = docs_out + removed) then fails it instead of lying."""
    from prepline.data_access import open_location

    loc = open_location(str(tmp_path))
    with loc.parquet_writer("x.parquet", pa.schema([])) as sink:
        sink.write(pa.table({"a": [1, 2, 3]}).drop_columns(["a"]))
    assert sink.rows == pq.ParquetFile(tmp_path / "x.parquet").metadata.num_rows == 0
    with loc.parquet_writer("y.parquet", pa.schema([("a", pa.int64())])) as sink:
        sink.write(pa.table({"a": [1, 2, 3]}))
        sink.write(pa.table({"a": [4]}))
    assert sink.rows == pq.ParquetFile(tmp_path / "y.parquet").metadata.num_rows == 4


@pytest.mark.parametrize("verify", ["jaccard", "none"])
def test_fuzzy_dedup_removes_every_exact_duplicate_with_unique_ids(tmp_path, verify):
    """Texts ending in white space, exact duplicates across two files under unique ids: fuzzy_dedup
    must remove every one, as exact_dedup does. pyarrow's utf8_split_whitespace sometimes (it
    depends on the bytes after the array's last string) leaves the last string's trailing space on
    its last word, so that document got another last shingle and an exact duplicate was kept
    (measured here: 1 or 2 of 75 kept, depending on the process's memory)."""
    src, n = tmp_path / "in", 300
    _write_fixed(src / "one" / "part-0.parquet", list(range(n)), [_text(i) for i in range(n)])
    _write_fixed(src / "two" / "part-0.parquet", [10**6 + i for i in range(n)],
                 [_text((i * 7) % n) if i % 4 == 0 else _text(10_000 + i) for i in range(n)])
    run_transform("exact_dedup", {"num_shards": 4}, RunOptions(str(src), str(tmp_path / "exact"), workers=1, progress=False))
    want = _texts(tmp_path / "exact")
    assert sum(want.values()) == 525 and max(want.values()) == 1
    meta = run_transform("fuzzy_dedup", {"num_shards": 4, "verify": verify},
                         RunOptions(str(src), str(tmp_path / "fuzzy"), workers=1, progress=False)).metadata
    got = _texts(tmp_path / "fuzzy")
    kept = sum(v - 1 for v in got.values() if v > 1)
    assert kept == 0, f"{kept} exact duplicates kept ({meta['totals']['removed']})"
    if verify == "jaccard":  # the texts share no shingle unless equal: nothing else is removed
        assert got == want


def _rewrite_after_first_marker(monkeypatch, phase: str, path: Path, ids: list[int], texts: list[str]) -> list:
    """Rewrite ``path`` (same size, other texts) when the first completion marker of ``phase`` is written."""
    from prepline.context import MARKERS
    from prepline.data_access import LocalLocation

    done: list = []
    write = LocalLocation.write_bytes

    def hooked(self, rel, data):
        write(self, rel, data)
        if rel.startswith(f"{MARKERS}/{phase}/") and not done:
            _rewrite_same_size(path, ids, texts)
            done.append(True)

    monkeypatch.setattr(LocalLocation, "write_bytes", hooked)
    return done


@pytest.mark.parametrize("name, phase", [("exact_dedup", "reduce"), ("fuzzy_dedup", "buckets")])
def test_an_input_file_edited_during_the_run_never_ends_in_success(tmp_path, monkeypatch, name, phase):
    """The same same-size edit as above, but while the run is going: the plan was made from the old
    file, the final map would read the new one."""
    src, out = tmp_path / "in", tmp_path / "out"
    b_ids, b_txt = _two_files(src)
    new = list(b_txt)
    new[0], new[len(new) // 2] = _text(10), _text(999_999)
    happened = _rewrite_after_first_marker(monkeypatch, phase, src / "b.parquet", b_ids, new)
    try:
        meta = run_transform(name, {"num_shards": 4}, RunOptions(str(src), str(out), workers=1, progress=False)).metadata
    except PreplineError as e:
        assert happened and "b.parquet" in e.message and "changed" in e.message and "--overwrite" in e.fix
        assert json.loads((out / "metadata.json").read_text())["status"] == "failed"
    else:
        assert happened
        monkeypatch.undo()
        ref = tmp_path / "ref"
        run_transform(name, {"num_shards": 4}, RunOptions(str(src), str(ref), workers=1, progress=False))
        want, got = _texts(ref), _texts(out)
        lost, extra = sum((want - got).values()), sum((got - want).values())
        assert (lost, extra) == (0, 0), f"edited during the run: {lost} texts lost, {extra} extra ({meta['status']})"


def test_words_never_carry_white_space():
    """pyarrow 26's utf8_split_whitespace, on an array produced by a kernel (take, utf8_lower), now
    and then keeps the trailing white space of the array's last string on its last word (measured:
    about 1 array in 10 after take + utf8_lower, 1 in 140 after take alone). The words fuzzy_dedup
    hashes and doc_quality counts must be Python's ``str.split()`` every time."""
    import random

    import numpy as np
    import pyarrow.compute as pc

    from prepline import minhash, textstats

    pool = pa.array([_text(i) for i in range(2000)])
    rng = random.Random(0)
    bad_units = bad_words = 0
    for _ in range(300):
        rows = np.sort(np.array(rng.sample(range(2000), rng.randint(1, 120))))
        low = pc.utf8_lower(pool.take(pa.array(rows)))
        want = [w for s in low.to_pylist() for w in s.split()]
        ref = minhash._word_units(pa.array(want))[0]  # each word hashed alone: the right hashes
        units, offsets = minhash._word_units(low)
        bad_units += not (np.array_equal(units, ref) and offsets[-1] == len(want))
        bad_words += textstats.words(low).values.to_pylist() != want
    assert (bad_units, bad_words) == (0, 0), f"{bad_units} / {bad_words} of 300 batches split wrong"
