"""prepline.data_access on local folders and on S3.

S3 here is the real S3-protocol server of the ``s3_server`` fixture (moto_server on 127.0.0.1,
real HTTP): boto3 is never mocked in-process. What boto3 sends is observed with botocore event
hooks on the location's own client.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import tree_bytes, write_parquet
from prepline import data_access as da
from prepline.data_access import (
    FileInfo,
    LocalLocation,
    Location,
    S3Location,
    inside,
    is_s3,
    open_location,
    s3_client,
)
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError, OutputError


# ----------------------------------------------------------------------------------------------
# helpers


class Sent:
    """Records every request a boto3 client sends (operation name, headers) and GetObject sizes."""

    def __init__(self, client):
        self.client = client
        self.requests: list[tuple[str, dict]] = []
        self.get_bytes: list[int] = []
        client.meta.events.register("before-send.s3.*", self._before_send)
        client.meta.events.register("after-call.s3.GetObject", self._after_get)

    def _before_send(self, request, event_name, **kwargs):
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        self.requests.append((event_name.rsplit(".", 1)[-1], headers))
        return None  # never short-circuit the real request

    def _after_get(self, parsed, **kwargs):
        self.get_bytes.append(int(parsed["ContentLength"]))

    def ops(self, name: str) -> list[dict]:
        return [h for op, h in self.requests if op == name]

    def names(self) -> list[str]:
        return [op for op, _ in self.requests]

    def close(self) -> None:
        self.client.meta.events.unregister("before-send.s3.*", self._before_send)
        self.client.meta.events.unregister("after-call.s3.GetObject", self._after_get)


def put_raw(loc: Location, rel: str, data: bytes) -> None:
    """Create a file without going through the code under test."""
    if isinstance(loc, S3Location):
        s3_client().put_object(Bucket=loc.bucket, Key=loc.key(rel), Body=data)
    else:
        p = Path(loc.path(rel))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def s3_objects(bucket: str, prefix: str) -> dict[str, int]:
    """Every key under prefix (key relative to it -> size), straight from the server."""
    c = s3_client()
    out = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix.rstrip("/")) + 1 :]] = o["Size"]
    return out


def s3_get(bucket: str, key: str) -> bytes:
    return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()


def upload_many(bucket: str, keys_sizes: dict[str, int], threads: int = 8) -> None:
    c = s3_client()  # boto3 clients are thread-safe; default pool is 10 connections

    def put(item):
        k, n = item
        c.put_object(Bucket=bucket, Key=k, Body=b"x" * n)

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(put, keys_sizes.items()))


def all_local_names(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*"))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request, tmp_path) -> Location:
    """An empty location, a local folder or an S3 prefix in a fresh bucket."""
    if request.param == "local":
        return LocalLocation(str(tmp_path / "root"))
    bucket = request.getfixturevalue("s3_bucket")
    return open_location(f"s3://{bucket}/root")


# A tree with data, non-data and hidden files. "sub-x.parquet" sorts before "sub/..." ('-' < '/'):
# local and S3 listings must agree on that order.
TREE = {
    "a.parquet": 11,
    "b_c.parquet": 7,  # '_' inside a name is fine
    "sub-x.parquet": 5,
    "sub/b.parquet": 3,
    "sub/deeper/c.parquet": 0,  # empty: still listed, with size 0
    "z=1/d.parquet": 1234,
    "a.parquet.bak": 9,
    "notes.txt": 4,
    "sub/readme.txt": 6,
    "_prepline/markers/final/a.parquet.json": 2,
    "_prepline/x.parquet": 2,
    "_tmp.parquet": 2,
    ".hidden.parquet": 2,
    ".cache/e.parquet": 2,
    "sub/_SUCCESS": 0,
    "sub/.b.parquet.tmp-0123": 8,
    "sub/deeper/_work/f.parquet": 2,
    "z=1/.d.parquet.crc": 2,
}
VISIBLE_PARQUET = ["a.parquet", "b_c.parquet", "sub-x.parquet", "sub/b.parquet", "sub/deeper/c.parquet", "z=1/d.parquet"]


# ----------------------------------------------------------------------------------------------
# URIs, open_location, pickling


def test_open_location_and_paths(tmp_path):
    assert is_s3("s3://b/x") and not is_s3("/tmp/s3://x") and not is_s3("s3:/x")
    loc = open_location("s3://bkt/a/b/")
    assert isinstance(loc, S3Location)
    assert (loc.bucket, loc.prefix, loc.uri) == ("bkt", "a/b", "s3://bkt/a/b")
    assert loc.key("c/d.parquet") == "a/b/c/d.parquet" and loc.path("c") == "s3://bkt/a/b/c"
    assert loc.sub("c").uri == "s3://bkt/a/b/c"
    top = open_location("s3://bkt")
    assert (top.prefix, top.uri, top.key("x")) == ("", "s3://bkt", "x")
    with pytest.raises(InputError, match="names no bucket"):
        open_location("s3:///x")
    local = open_location(str(tmp_path / "d" / ".." / "e"))
    assert isinstance(local, LocalLocation) and local.uri == str(tmp_path / "e")
    assert local.path("f/g.parquet") == str(tmp_path / "e" / "f" / "g.parquet")
    assert local.sub("f").uri == str(tmp_path / "e" / "f")


@pytest.mark.s3
def test_s3_location_pickles_without_its_client(s3_bucket):
    loc = open_location(f"s3://{s3_bucket}/p")
    loc.write_bytes("x", b"1")  # the filesystem (and its client) exists
    assert loc._fs is not None
    back = pickle.loads(pickle.dumps(loc))
    assert back._fs is None and back.uri == loc.uri
    assert back.read_bytes("x") == b"1"  # makes its own filesystem (endpoint from the env)


@pytest.mark.s3
def test_endpoint_from_aws_endpoint_url_s3(s3_server, s3_bucket, monkeypatch):
    """The documented alternative to PREPLINE_S3_ENDPOINT: path-style requests to that endpoint."""
    monkeypatch.delenv("PREPLINE_S3_ENDPOINT")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    loc = open_location(f"s3://{s3_bucket}/e")
    assert loc.client.meta.endpoint_url == s3_server
    assert loc.client.meta.config.s3["addressing_style"] == "path"
    loc.write_bytes("a.parquet", b"12")
    assert loc.list_files() == [FileInfo("a.parquet", 2)]


# ----------------------------------------------------------------------------------------------
# listing


def test_list_files_sorted_recursive_sizes_hidden_suffix(root):
    for rel, n in TREE.items():
        put_raw(root, rel, b"x" * n)
    files = root.list_files()
    assert [f.rel for f in files] == VISIBLE_PARQUET  # sorted, recursive, hidden skipped
    assert all(f.size == TREE[f.rel] for f in files)
    assert all(isinstance(f, FileInfo) for f in files)
    assert root.list_files(".txt") == [FileInfo("notes.txt", 4), FileInfo("sub/readme.txt", 6)]
    assert root.list_files(".bak") == [FileInfo("a.parquet.bak", 9)]
    assert root.list_files(".csv") == []
    # list_all: everything, hidden too, sorted; and under a sub-prefix (relative to the root)
    everything = root.list_all()
    assert [f.rel for f in everything] == sorted(TREE)
    assert {f.rel: f.size for f in everything} == TREE
    assert [f.rel for f in root.list_all("sub/deeper")] == ["sub/deeper/_work/f.parquet", "sub/deeper/c.parquet"]
    assert [f.rel for f in root.list_all("sub/deeper/")] == ["sub/deeper/_work/f.parquet", "sub/deeper/c.parquet"]
    assert root.list_all("nope") == []
    # sub-locations list relative to themselves
    assert root.sub("sub").list_files() == [FileInfo("b.parquet", 3), FileInfo("deeper/c.parquet", 0)]
    assert root.exists()


def test_list_files_real_sizes_of_parquet(root, tmp_path):
    src = tmp_path / "src"
    for i, rel in enumerate(["p/one.parquet", "two.parquet"]):
        p = write_parquet(src, rel, {"contents": [f"doc {j}" * (i + 1) for j in range(50 * (i + 1))]})
        put_raw(root, rel, p.read_bytes())
    assert root.list_files() == [
        FileInfo("p/one.parquet", os.path.getsize(src / "p/one.parquet")),
        FileInfo("two.parquet", os.path.getsize(src / "two.parquet")),
    ]


def test_missing_or_empty_location(root):
    assert root.list_files() == [] and root.list_all() == []
    assert not root.exists()
    assert root.read_text("metadata.json") is None
    with pytest.raises(FileNotFoundError):
        root.read_bytes("nope.parquet")
    root.delete()  # deleting nothing is fine
    root.delete("nope")


def test_local_list_follows_symlinks_and_survives_loops(tmp_path):
    base = tmp_path / "data"
    write_parquet(base, "a.parquet", {"x": [1]})
    write_parquet(tmp_path / "elsewhere", "e.parquet", {"x": [1, 2]})
    os.symlink(tmp_path / "elsewhere", base / "linked")
    os.symlink(base, base / "loop")  # a folder linking back to its parent
    (base / "sub").mkdir()
    os.symlink(base, base / "sub" / "up")
    os.symlink(tmp_path / "missing", base / "dangling.parquet")
    files = LocalLocation(str(base)).list_files()
    assert [f.rel for f in files] == ["a.parquet", "linked/e.parquet"]
    assert files[1].size == os.path.getsize(tmp_path / "elsewhere" / "e.parquet")


@pytest.mark.s3
def test_s3_list_paginates_without_per_object_requests_and_delete_batches(s3_bucket):
    n = 1205
    keys = {}
    for i in range(n):
        hidden = i % 97 == 0
        keys[f"many/{'_work/' if hidden else ''}d{i % 7}/f{i:05d}.parquet"] = i % 41
    keys["many2/sibling.parquet"] = 3  # shares the string prefix "many", not the folder
    keys["many.parquet"] = 3
    upload_many(s3_bucket, keys)

    loc = open_location(f"s3://{s3_bucket}/many")
    sent = Sent(loc.client)
    files = loc.list_files()
    assert sent.names() == ["ListObjectsV2"] * math.ceil(n / 1000)
    assert sent.ops("HeadObject") == [] and sent.ops("GetObject") == []
    expected = {k[len("many/") :]: v for k, v in keys.items() if k.startswith("many/") and "/_work/" not in k}
    assert [f.rel for f in files] == sorted(expected)
    assert {f.rel: f.size for f in files} == expected
    assert len(files) == n - len(range(0, n, 97))

    sent.requests.clear()
    everything = loc.list_all()
    assert len(everything) == n and sent.names() == ["ListObjectsV2"] * 2

    # delete: > 1000 keys go in batches of 1000; the sibling prefix and file survive
    sent.requests.clear()
    loc.delete("")
    assert len(sent.ops("DeleteObjects")) == math.ceil(n / 1000)
    assert sent.ops("HeadObject") == [] and sent.ops("GetObject") == []
    assert loc.list_all() == [] and not loc.exists()
    left = s3_client().list_objects_v2(Bucket=s3_bucket)
    assert sorted(o["Key"] for o in left.get("Contents", [])) == ["many.parquet", "many2/sibling.parquet"]
    sent.close()


# ----------------------------------------------------------------------------------------------
# writes and reads


def test_write_read_round_trip(root):
    root.write_bytes("x/y.bin", b"\x00\x01 hello")
    assert root.read_bytes("x/y.bin") == b"\x00\x01 hello"
    root.write_bytes("x/y.bin", b"second")  # overwrite
    assert root.read_bytes("x/y.bin") == b"second"
    root.write_bytes("m.json", json.dumps({"ü": 1}).encode())
    assert json.loads(root.read_text("m.json")) == {"ü": 1}
    assert root.read_text("nope.json") is None
    assert root.exists()

    table = pa.table({"contents": ["a", "bb", None, "dddd"], "n": pa.array([1, 2, 3, 4], pa.int64())})
    size = root.write_parquet("lang=en/t.parquet", table)
    assert {f.rel: f.size for f in root.list_files()} == {"lang=en/t.parquet": size}
    assert root.read_parquet("lang=en/t.parquet").equals(table)
    assert root.read_parquet("lang=en/t.parquet", columns=["n"]).column_names == ["n"]
    pf = root.parquet_file("lang=en/t.parquet")
    assert pf.metadata.num_rows == 4 and pf.schema_arrow.names == ["contents", "n"]
    assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
    # the bytes on disk / in the bucket are the bytes written, and equal across kinds of location
    raw = root.read_bytes("lang=en/t.parquet")
    assert len(raw) == size and pq.read_table(pa.BufferReader(raw)).equals(table)
    assert root.sub("lang=en").read_parquet("t.parquet").equals(table)

    if isinstance(root, LocalLocation):  # no temp file left behind after success
        assert all_local_names(Path(root.root)) == ["lang=en", "lang=en/t.parquet", "m.json", "x", "x/y.bin"]


def test_write_parquet_same_bytes_local_and_memory(tmp_path):
    """Local writes go to a file, S3 writes to a buffer: the bytes must be the same."""
    table = pa.table({"contents": [f"doc {i}" for i in range(1000)], "n": list(range(1000))})
    loc = LocalLocation(str(tmp_path))
    size = loc.write_parquet("t.parquet", table)
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, **da.PARQUET_WRITE_OPTIONS)
    assert loc.read_bytes("t.parquet") == buf.getvalue().to_pybytes() and size == buf.getvalue().size


def test_long_text_columns_are_written_plain_without_statistics(tmp_path):
    """Documents' text (values of 256 bytes or more on average in the first table written) is
    written without a dictionary or min/max statistics; short strings, ids and numbers keep both
    (the sorted-id reads prune row groups by their statistics). The data is the same."""
    rng = np.random.default_rng(5)
    words = np.array(["alpha", "beta", "gamma", "delta", "épsilon", "zeta"])
    texts = [" ".join(rng.choice(words, 80)) for _ in range(400)]
    texts[7] = None
    table = pa.table({
        "contents": texts,
        "html": pa.array([t.encode() * 2 if t else None for t in texts], pa.binary()),
        "lang": ["en", "fr"] * 200,
        "id": pa.array(range(400), pa.int64()),
        "short_text": [t[:40] if t else None for t in texts],  # 40 bytes on average: a label, not a document
    })
    loc = LocalLocation(str(tmp_path))
    with loc.parquet_writer("t.parquet", table.schema) as w:
        w.write(table.slice(0, 200))
        w.write(table.slice(200))  # the second table follows the choice made for the first
    pf = loc.parquet_file("t.parquet")
    assert pf.read().equals(table)
    for g in range(pf.metadata.num_row_groups):
        cols = {pf.metadata.row_group(g).column(i).path_in_schema: pf.metadata.row_group(g).column(i) for i in range(5)}
        for name in ("contents", "html"):
            assert "RLE_DICTIONARY" not in cols[name].encodings and not cols[name].is_stats_set, name
        for name in ("lang", "id", "short_text"):
            assert "RLE_DICTIONARY" in cols[name].encodings and cols[name].statistics.has_min_max, name
        assert cols[name].compression == "ZSTD"
    # an all-null or empty first table keeps the defaults; a sink with no table writes the schema
    with loc.parquet_writer("n.parquet", table.schema) as w:
        w.write(table.slice(7, 1).select(["contents", "html", "lang", "id", "short_text"]).filter(pa.array([True])))
    assert loc.parquet_file("n.parquet").metadata.row_group(0).column(0).statistics is not None
    with loc.parquet_writer("e.parquet", table.schema):
        pass
    assert loc.read_parquet("e.parquet").schema == table.schema and loc.read_parquet("e.parquet").num_rows == 0


def test_write_parquet_failure_leaves_nothing(root, monkeypatch):
    table = pa.table({"x": [1, 2, 3]})
    root.write_parquet("keep.parquet", table)
    before = root.read_bytes("keep.parquet")
    real = da.ParquetSink.close
    seen = []

    def boom(sink):
        real(sink)  # the temp file (or the upload) now holds a complete file...
        seen.append(sink.bytes_written)
        raise OSError("disk full (simulated)")  # ...and the writer fails before the commit

    monkeypatch.setattr(da.ParquetSink, "close", boom)
    with pytest.raises(OSError, match="simulated"):
        root.write_parquet("sub/t.parquet", table)
    with pytest.raises(OSError, match="simulated"):
        root.write_parquet("keep.parquet", pa.table({"x": [9]}))
    monkeypatch.undo()

    assert len(seen) == 2 and all(n > 0 for n in seen)
    assert [f.rel for f in root.list_all()] == ["keep.parquet"]  # no target, no temp file
    assert root.read_bytes("keep.parquet") == before  # the old file is intact
    if isinstance(root, LocalLocation):
        assert all_local_names(Path(root.root)) == ["keep.parquet", "sub"]


def test_local_write_bytes_failure_mid_write_leaves_nothing(tmp_path):
    loc = LocalLocation(str(tmp_path / "out"))
    loc.write_bytes("a.json", b"old")

    class Unwritable:  # fails inside f.write(), after the temp file was created
        pass

    with pytest.raises(TypeError):
        loc.write_bytes("a.json", Unwritable())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        loc.write_bytes("new/b.json", Unwritable())  # type: ignore[arg-type]
    assert loc.read_bytes("a.json") == b"old"
    assert all_local_names(tmp_path / "out") == ["a.json", "new"]


def test_local_write_bytes_failure_at_rename(tmp_path, monkeypatch):
    loc = LocalLocation(str(tmp_path / "out"))

    def no_replace(src, dst):
        assert os.path.exists(src)
        raise PermissionError("rename refused (simulated)")

    monkeypatch.setattr(da.os, "replace", no_replace)
    with pytest.raises(PermissionError):
        loc.write_bytes("a.json", b"data")
    monkeypatch.undo()
    assert all_local_names(tmp_path / "out") == []


def test_clean_temp_files(tmp_path):
    loc = LocalLocation(str(tmp_path / "out"))
    loc.write_parquet("a.parquet", pa.table({"x": [1]}))
    # litter as a killed writer leaves it: the writer's own temp names
    t1 = loc._tmp("a.parquet")
    Path(t1).write_bytes(b"partial")
    t2 = loc._tmp("sub/b.parquet")
    Path(t2).write_bytes(b"partial")
    t3 = loc._tmp("_prepline/markers/final/a.parquet.json")
    Path(t3).write_bytes(b"{")
    # not litter
    put_raw(loc, ".keep", b"")
    put_raw(loc, "_prepline/run.json", b"{}")
    put_raw(loc, "x.tmp-notes.txt", b"visible file with .tmp- in its name")
    put_raw(loc, "x.tmp-1/.keep", b"a hidden file in a folder with .tmp- in its name")
    assert loc.list_files() == [FileInfo("a.parquet", os.path.getsize(loc.path("a.parquet")))]  # litter is hidden
    assert loc.clean_temp_files() == 3
    assert not any(os.path.exists(t) for t in (t1, t2, t3))
    assert [f.rel for f in loc.list_all()] == [".keep", "_prepline/run.json", "a.parquet", "x.tmp-1/.keep", "x.tmp-notes.txt"]
    assert loc.clean_temp_files() == 0


# ----------------------------------------------------------------------------------------------
# Parquet footers on S3


@pytest.mark.s3
def test_s3_parquet_footer_reads_only_ranges(s3_bucket):
    rng = np.random.default_rng(0)
    blob = rng.bytes(3_000_000)  # incompressible: the file stays ~3 MB under zstd
    n = 30_000
    table = pa.table(
        {
            "contents": pa.array([blob[i * 100 : (i + 1) * 100] for i in range(n)], pa.binary()),
            "n": pa.array(np.arange(n), pa.int64()),
            "lang": pa.array(["en", "fr", "de"] * (n // 3)),
        }
    )
    writer = open_location(f"s3://{s3_bucket}/in")
    size = writer.write_parquet("big.parquet", table)
    assert size > 2_500_000
    assert writer.list_files() == [FileInfo("big.parquet", size)]

    loc = open_location(f"s3://{s3_bucket}/in")  # a fresh client, observed from its first request
    sent = Sent(loc.client)
    pf = loc.parquet_footer("big.parquet", size)
    schema = pf.schema_arrow
    assert schema.names == ["contents", "n", "lang"]
    assert [schema.field(c).type for c in schema.names] == [pa.binary(), pa.int64(), pa.string()]
    assert pf.metadata.num_rows == n
    gets = sent.ops("GetObject")
    assert gets and set(sent.names()) == {"GetObject"}  # no HeadObject, no listing
    assert all(re.fullmatch(r"bytes=\d+-\d+", h.get("Range", "")) for h in gets)
    assert len(sent.get_bytes) == len(gets)
    assert sum(sent.get_bytes) < size / 10  # only the tail, not the data
    sent.close()

    # a small file (smaller than one buffer) and a broken one
    small = pa.table({"contents": ["a", "b"]})
    small_size = loc.write_parquet("small.parquet", small)
    assert loc.parquet_footer("small.parquet", small_size).metadata.num_rows == 2
    loc.write_bytes("bad.parquet", b"this is not parquet at all" * 10)
    with pytest.raises((pa.ArrowInvalid, OSError)):
        loc.parquet_footer("bad.parquet", 260).schema_arrow


# ----------------------------------------------------------------------------------------------
# inside()


def test_inside_local(tmp_path):
    a, ab = tmp_path / "a", tmp_path / "ab"
    (a / "x").mkdir(parents=True)
    ab.mkdir()
    L = LocalLocation
    assert inside(L(str(a)), L(str(a)))
    assert inside(L(str(a) + "/"), L(str(a)))
    assert inside(L(str(a / "x")), L(str(a)))
    assert inside(L(str(a / "x" / "not-yet" / "deeper")), L(str(a)))  # need not exist
    assert not inside(L(str(ab)), L(str(a)))  # a prefix of the name is not a parent
    assert not inside(L(str(a)), L(str(ab)))
    assert not inside(L(str(a)), L(str(a / "x")))
    # '..' is resolved
    assert inside(L(str(a / "x" / ".." / "y")), L(str(a)))
    assert not inside(L(str(a / ".." / "ab")), L(str(a)))
    assert inside(L(str(a / ".." / "ab")), L(str(tmp_path)))
    # symlinks are resolved, both ways
    link = tmp_path / "link"
    os.symlink(a, link)
    assert inside(L(str(link / "x")), L(str(a)))
    assert inside(L(str(a / "x")), L(str(link)))
    assert inside(L(str(link)), L(str(a))) and inside(L(str(a)), L(str(link)))
    assert not inside(L(str(link)), L(str(ab)))
    # the filesystem root contains everything
    assert inside(L(str(a)), L("/")) and inside(L("/"), L("/"))
    assert not inside(L("/"), L(str(a)))


def test_inside_s3():
    S = open_location
    assert inside(S("s3://bkt/a"), S("s3://bkt/a"))
    assert inside(S("s3://bkt/a/"), S("s3://bkt/a"))
    assert inside(S("s3://bkt/a/x/y"), S("s3://bkt/a"))
    assert not inside(S("s3://bkt/ab"), S("s3://bkt/a"))
    assert not inside(S("s3://bkt/a"), S("s3://bkt/ab"))
    assert not inside(S("s3://bkt/a"), S("s3://bkt/a/x"))
    assert inside(S("s3://bkt/a"), S("s3://bkt"))  # the bucket root contains everything in it
    assert inside(S("s3://bkt"), S("s3://bkt/"))
    assert not inside(S("s3://bkt"), S("s3://bkt/a"))
    assert not inside(S("s3://bkt2/a"), S("s3://bkt"))  # another bucket, even with a common prefix
    assert not inside(S("s3://bkt/a"), S("s3://bkt2"))
    assert not inside(S("s3://other/a"), S("s3://bkt/a"))


def test_inside_mixed(tmp_path):
    local = LocalLocation(str(tmp_path / "a"))
    s3 = open_location("s3://bkt/a")
    assert not inside(local, s3) and not inside(s3, local)
    assert not inside(s3, LocalLocation("/"))
    assert not inside(LocalLocation("/"), open_location("s3://bkt"))
    # a local folder literally named like the URI is still local
    odd = LocalLocation(str(tmp_path / "s3:" / "bkt" / "a"))
    assert not inside(odd, s3) and not inside(s3, odd)


def test_engine_refuses_nested_s3_folders():
    """inside() is what keeps a run from reading its own output: checked before any request."""
    with pytest.raises(ConfigError, match="inside input"):
        run_transform("doc_id", {}, RunOptions(input="s3://bkt/in", output="s3://bkt/in/out", workers=1))
    with pytest.raises(ConfigError, match="inside output"):
        run_transform("doc_id", {}, RunOptions(input="s3://bkt/out/in", output="s3://bkt/out", workers=1))


# ----------------------------------------------------------------------------------------------
# delete()


def test_delete(root):
    for rel in ["a.parquet", "sub/b.parquet", "sub/c/d.parquet", "subway/e.parquet", "sub.parquet", "_prepline/m/x.json"]:
        put_raw(root, rel, b"1")
    root.delete("sub")  # a folder: everything below, and not 'subway/' nor 'sub.parquet'
    assert [f.rel for f in root.list_all()] == ["_prepline/m/x.json", "a.parquet", "sub.parquet", "subway/e.parquet"]
    root.delete("_prepline")
    root.delete("sub.parquet")  # a single file
    assert [f.rel for f in root.list_all()] == ["a.parquet", "subway/e.parquet"]
    root.delete("")  # everything
    assert root.list_all() == [] and not root.exists()


def test_local_delete_through_symlinks(tmp_path):
    real = tmp_path / "disk2" / "out"
    write_parquet(real, "a.parquet", {"x": [1]})
    write_parquet(real, "sub/b.parquet", {"x": [1]})
    write_parquet(tmp_path / "keep", "k.parquet", {"x": [1]})
    os.symlink(tmp_path / "keep", real / "link-to-keep")
    os.symlink(real, tmp_path / "out")
    loc = LocalLocation(str(tmp_path / "out"))  # the output folder is a link (e.g. to another disk)
    assert [f.rel for f in loc.list_files()] == ["a.parquet", "link-to-keep/k.parquet", "sub/b.parquet"]
    loc.delete()
    assert loc.list_all() == [] and (tmp_path / "out").is_symlink()
    assert (tmp_path / "keep" / "k.parquet").exists()  # links inside are removed, not followed
    loc.write_bytes("new.json", b"{}")  # still usable
    assert (real / "new.json").read_bytes() == b"{}"
    os.symlink(tmp_path / "missing", real / "dangling")
    loc.delete("dangling")
    assert not os.path.lexists(real / "dangling")


@pytest.mark.s3
def test_s3_delete_leaves_other_prefixes(s3_bucket):
    upload_many(s3_bucket, {"out/a.parquet": 1, "out/x/b.parquet": 1, "outer/c.parquet": 1, "out.json": 1})
    open_location(f"s3://{s3_bucket}/out").delete()
    assert sorted(s3_objects(s3_bucket, "outer")) == ["c.parquet"]
    assert s3_get(s3_bucket, "out.json") == b"x"
    assert s3_objects(s3_bucket, "out") == {}


# ----------------------------------------------------------------------------------------------
# a missing bucket


@pytest.mark.s3
def test_missing_bucket_is_an_input_error_naming_it(s3_server, corpus):
    name = "prepline-no-such-bucket-7f3a"
    loc = open_location(f"s3://{name}/in")
    for call in (
        loc.list_files,
        loc.list_all,
        loc.exists,
        lambda: loc.read_bytes("a.parquet"),
        lambda: loc.read_text("metadata.json"),
        lambda: loc.write_bytes("a.json", b"{}"),
        lambda: loc.write_parquet("a.parquet", pa.table({"x": [1]})),
        lambda: loc.parquet_file("a.parquet"),
        lambda: loc.delete(),
    ):
        with pytest.raises(InputError, match=name) as ei:
            call()
        assert ei.value.fix
    with pytest.raises(InputError, match=name):
        run_transform("doc_id", {}, RunOptions(input=f"s3://{name}/in", output=str(corpus.parent / "out"), workers=1))
    with pytest.raises(OutputError, match=name):  # the output's bucket: an output error
        run_transform("doc_id", {}, RunOptions(input=str(corpus), output=f"s3://{name}/out", workers=1))


# ----------------------------------------------------------------------------------------------
# end to end: the engine on S3


@pytest.mark.s3
@pytest.mark.integration
def test_run_transform_on_s3_mirrors_tree_and_is_worker_independent(corpus, s3_bucket, tmp_path):
    c = s3_client()
    inputs = {str(p.relative_to(corpus)): p.read_bytes() for p in sorted(corpus.rglob("*.parquet"))}
    assert set(inputs) == {"a.parquet", "c.parquet", "lang=en/b.parquet"}
    for rel, data in inputs.items():
        c.put_object(Bucket=s3_bucket, Key=f"in/{rel}", Body=data)

    res = run_transform(
        "doc_id", {}, RunOptions(input=f"s3://{s3_bucket}/in", output=f"s3://{s3_bucket}/out1", workers=1, progress=False)
    )
    objs = s3_objects(s3_bucket, "out1")
    # the tree mirrors the input; the work folder is gone
    assert sorted(objs) == ["a.parquet", "c.parquet", "lang=en/b.parquet", "metadata.json"]
    meta = json.loads(s3_get(s3_bucket, "out1/metadata.json"))
    assert meta == res.metadata
    assert meta["status"] == "success"
    t = meta["totals"]
    assert (t["files"], t["docs_in"], t["docs_out"], t["removed_total"], t["files_failed"]) == (3, 10, 10, 0, 0)
    assert t["bytes_in"] == sum(len(b) for b in inputs.values())
    assert t["bytes_out"] == sum(v for k, v in objs.items() if k.endswith(".parquet"))
    assert meta["plan"] == {"first_id": 0, "last_id": 9}
    assert sorted(meta["files"]) == sorted(inputs)
    assert meta["files"]["lang=en/b.parquet"]["outputs"] == ["lang=en/b.parquet"]
    # contents: ids follow the sorted listing, texts are kept
    offsets = {"a.parquet": 0, "c.parquet": 4, "lang=en/b.parquet": 6}
    for rel, start in offsets.items():
        out = pq.read_table(pa.BufferReader(s3_get(s3_bucket, f"out1/{rel}")))
        src = pq.read_table(pa.BufferReader(inputs[rel]))
        assert out.column("contents").equals(src.column("contents"))
        assert out.column("doc_id").to_pylist() == list(range(start, start + src.num_rows))
        assert out.column_names == ["contents", "n", "doc_hash", "doc_id"]

    # a rerun finds the complete output and does nothing
    again = run_transform(
        "doc_id", {}, RunOptions(input=f"s3://{s3_bucket}/in", output=f"s3://{s3_bucket}/out1", workers=1, progress=False)
    )
    assert again.resumed

    # two worker processes (spawned: they find the endpoint in the environment) write the same bytes
    res2 = run_transform(
        "doc_id", {}, RunOptions(input=f"s3://{s3_bucket}/in", output=f"s3://{s3_bucket}/out2", workers=2, progress=False)
    )
    assert res2.metadata["phases"]["final"]["workers"] == 2
    assert res2.metadata["totals"]["docs_out"] == 10
    objs2 = s3_objects(s3_bucket, "out2")
    assert sorted(objs2) == sorted(objs)
    for rel in offsets:
        assert s3_get(s3_bucket, f"out2/{rel}") == s3_get(s3_bucket, f"out1/{rel}"), rel

    # and a local run of the same input writes the same bytes as the S3 runs
    run_transform("doc_id", {}, RunOptions(input=str(corpus), output=str(tmp_path / "local_out"), workers=1, progress=False))
    assert tree_bytes(tmp_path / "local_out") == {rel: s3_get(s3_bucket, f"out1/{rel}") for rel in offsets}


def test_page_checksums_are_written_and_a_corrupted_page_fails_its_file(tmp_path):
    from prepline.context import FileTask, read_checked
    from prepline.data_access import LocalLocation

    loc = LocalLocation(str(tmp_path))
    texts = [f"document number {i}" for i in range(300)]
    table = pa.table({"contents": texts})
    import pyarrow.parquet as _pq

    _pq.write_table(table, tmp_path / "a.parquet", compression="none", write_page_checksum=True)
    raw = bytearray((tmp_path / "a.parquet").read_bytes())
    raw[raw.index(b"document number 150") + 3] ^= 1
    (tmp_path / "a.parquet").write_bytes(bytes(raw))

    class T:
        def check_schema(self, schema, where):
            pass

        def input_columns(self):
            return []

    with pytest.raises(InputError, match="a.parquet: Parquet data is corrupt or truncated .*CRC checksum"):
        read_checked(loc, FileTask(str(tmp_path / "a.parquet"), "a.parquet", len(raw)), T(), None)
    loc.write_parquet("b.parquet", table)  # prepline's own files carry page checksums
    assert _pq.ParquetFile(tmp_path / "b.parquet").metadata.row_group(0).column(0).statistics is not None


@pytest.mark.parametrize("where", ["local", "s3"])
def test_many_files_keep_their_detail_out_of_metadata_json(tmp_path, monkeypatch, where, request):
    """Past FILES_INLINE input files, metadata.json keeps totals and names _files.jsonl, which holds one
    line per file; read_metadata, a resumed run and the in-memory result still see every file, and the
    next stage does not take _files.jsonl as input (hidden)."""
    from prepline import metadata
    from prepline.api import read_metadata

    monkeypatch.setattr(metadata, "FILES_INLINE", 2)
    corpus = tmp_path / "in"
    for i in range(3):
        write_parquet(corpus, f"p{i}.parquet", {"contents": [f"doc {i} a", f"doc {i} b"]})
    out = str(tmp_path / "out")
    if where == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        c = s3_client()
        for p in sorted(corpus.rglob("*.parquet")):
            c.put_object(Bucket=bucket, Key=f"in/{p.name}", Body=p.read_bytes())
        src, out = f"s3://{bucket}/in", f"s3://{bucket}/out"
    else:
        src = str(corpus)
    res = run_transform("doc_id", {}, RunOptions(input=src, output=out, workers=1, progress=False))
    assert sorted(res.metadata["files"]) == ["p0.parquet", "p1.parquet", "p2.parquet"]
    loc = open_location(out)
    doc = json.loads(loc.read_text("metadata.json"))
    assert doc["files"] == {} and doc["files_detail"] == {"path": "_files.jsonl", "files": 3}
    lines = [json.loads(x) for x in loc.read_text("_files.jsonl").splitlines()]
    assert [x["file"] for x in lines] == ["p0.parquet", "p1.parquet", "p2.parquet"] and all(x["docs_in"] == 2 for x in lines)
    assert read_metadata(out).files == res.metadata["files"]
    again = run_transform("doc_id", {}, RunOptions(input=src, output=out, workers=1, progress=False))
    assert again.resumed and again.metadata["files"] == res.metadata["files"]
    nxt = run_transform("filter", {"criteria": ["doc_id >= 0"]}, RunOptions(input=out, output=out + "2", workers=1, progress=False))
    assert nxt.metadata["totals"]["files"] == 3 and nxt.metadata["totals"]["docs_in"] == 6
