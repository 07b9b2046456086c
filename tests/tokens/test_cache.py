"""The token cache: a Megatron .bin on S3 (the moto server) read in ranges through a node's cache.
Windows equal the local file's; a second job reads nothing from the store; a replaced object is never
served from the old version's blocks (a new job reads the new bytes, a job reading while it is replaced
fails with a clear error); a corrupt cached block is read again; the cache stays within its bound."""

from __future__ import annotations

import numpy as np
import pytest

from prepline.data_access import open_location
from prepline.errors import InputError
from prepline.tokens.cache import BlockCache, RemoteStream

pytestmark = pytest.mark.s3


@pytest.fixture
def stored(s3_bucket):
    ids = np.random.default_rng(3).integers(0, 50_000, 300_000, dtype=np.int64).astype(np.uint16)
    loc = open_location(f"s3://{s3_bucket}/tok")
    loc.write_bytes("text_document.bin", ids.tobytes())
    return loc, ids


def _stream(loc, cache, block=64 * 1024):
    return RemoteStream(loc, "text_document.bin", np.uint16, cache, block_bytes=block)


def test_ranges_equal_the_file_and_a_second_job_reads_from_the_cache(stored, tmp_path):
    loc, ids = stored
    a = _stream(loc, BlockCache(str(tmp_path / "c"), 1 << 30))
    assert a.size == ids.size and a.etag.startswith("ETag=")
    for lo, hi in [(0, 10), (32_760, 32_780), (299_990, 300_000), (5, 200_000), (100, 100)]:
        assert np.array_equal(a[lo:hi], ids[lo:hi])
    assert a.gets == 8  # each block read once: 0-6 and 9 (the ranges above never touch 7 and 8)
    b = _stream(loc, BlockCache(str(tmp_path / "c"), 1 << 30))  # a later job on the node
    assert np.array_equal(b[5:200_000], ids[5:200_000]) and np.array_equal(b[299_990:300_000], ids[299_990:])
    assert b.gets == 0 and b.cache.hits == 8
    assert np.array_equal(b[0:300_000], ids) and b.gets == 2  # blocks 7 and 8 only


def test_a_replaced_object_is_never_served_stale(stored, tmp_path):
    loc, ids = stored
    cache_dir = str(tmp_path / "c")
    a = _stream(loc, BlockCache(cache_dir, 1 << 30))
    assert np.array_equal(a[0:1000], ids[:1000])
    new = ids[::-1].copy()
    loc.write_bytes("text_document.bin", new.tobytes())  # same size, other bytes: another ETag
    with pytest.raises(InputError, match="changed while it was read") as e:
        a[200_000:200_010]  # not cached: the GET of the old version is refused (If-Match)
    assert "rerun" in e.value.fix
    b = _stream(loc, BlockCache(cache_dir, 1 << 30))  # a job that starts after the replacement
    assert b.etag != a.etag and np.array_equal(b[0:1000], new[:1000])


def test_a_corrupt_cached_block_is_read_again(stored, tmp_path):
    loc, ids = stored
    cache = BlockCache(str(tmp_path / "c"), 1 << 30)
    assert np.array_equal(_stream(loc, cache)[0:10], ids[:10])
    (blk,) = list((tmp_path / "c").glob("*/00000000.*.blk"))
    data = bytearray(blk.read_bytes())
    data[7] ^= 0xFF
    blk.write_bytes(bytes(data))
    again = _stream(loc, cache)
    assert np.array_equal(again[0:10], ids[:10]) and again.gets == 1 and cache.corrupt == 1


def test_the_cache_stays_within_its_bound(stored, tmp_path):
    loc, ids = stored
    cache = BlockCache(str(tmp_path / "c"), 4 * 64 * 1024)
    s = _stream(loc, cache)
    assert np.array_equal(s[0:300_000], ids)
    cache.evict()
    assert sum(p.stat().st_size for p in (tmp_path / "c").glob("*/*.blk")) <= 4 * 64 * 1024


def test_the_cache_off_reads_every_time(stored, tmp_path):
    loc, ids = stored
    s = _stream(loc, BlockCache(str(tmp_path / "c"), 0))
    assert np.array_equal(s[0:10], ids[:10]) and np.array_equal(s[10:20], ids[10:20]) and s.gets == 1  # its recent blocks, in memory
    t = _stream(loc, BlockCache(str(tmp_path / "c"), 0))  # another job: nothing kept on disk
    assert np.array_equal(t[0:10], ids[:10]) and t.gets == 1
    assert not (tmp_path / "c").exists()
