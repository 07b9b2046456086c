"""Token data read from an object store in ranges, through a node's read-through cache.

A training input on ``s3://`` is not downloaded whole: its ``.bin`` is a :class:`RemoteStream`, an
array-like of the token ids that reads the blocks a batch needs (``PREPLINE_TOKEN_BLOCK_MB``, default
4 MiB, one ranged GET each) and keeps them in a :class:`BlockCache`: a size-bounded local directory
(``PREPLINE_TOKEN_CACHE``, default ``/tmp/prepline-token-cache``; ``PREPLINE_TOKEN_CACHE_GB``, default
20; 0 turns the cache off), shared by the ranks of a node and by later jobs on it.

Never stale: a stream is opened with the object's ETag (one HEAD), its blocks live under that ETag,
and every GET carries ``If-Match: <ETag>``, so an object replaced while a job reads it fails the read
(S3 answers 412) with a clear error instead of mixing two versions; a job that starts after the
replacement sees a new ETag and reads the new object. A cached block is written to a temporary file
and renamed (readers never see half a block), named with its CRC-32 and checked against it and its
length when read: a corrupt block is read again from the store. Past the size bound the least
recently used blocks (by modification time, touched on each hit) are deleted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np

from prepline.errors import ConfigError, InputError

log = logging.getLogger("prepline.tokens")

DEFAULT_DIR = "/tmp/prepline-token-cache"
#: bytes of recently read blocks a stream keeps in memory (PREPLINE_TOKEN_RECENT_MB; one block without the cache)
RECENT_BYTES = 64 << 20


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number", f"set {name} to a number, e.g. {default:g}") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} is negative", f"set {name} to 0 or more")
    return value


class BlockCache:
    """Blocks of objects on local disk, keyed by (object, ETag, block number)."""

    def __init__(self, root: str | None = None, max_bytes: int | None = None):
        self.root = Path(root or os.environ.get("PREPLINE_TOKEN_CACHE") or DEFAULT_DIR)
        self.max_bytes = int(_env_float("PREPLINE_TOKEN_CACHE_GB", 20) * 2**30) if max_bytes is None else max_bytes
        self.hits = self.misses = self.corrupt = 0
        self._lock = threading.Lock()
        self._added = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def _dir(self, uri: str, etag: str) -> Path:
        return self.root / hashlib.sha256(f"{uri}\n{etag}".encode()).hexdigest()[:32]

    def has(self, uri: str, etag: str, block: int) -> bool:
        """Whether block ``block`` is kept (not checked: :meth:`get` checks it when it is read)."""
        d = self._dir(uri, etag)
        return self.enabled and d.is_dir() and any(d.glob(f"{block:08d}.*.blk"))

    def get(self, uri: str, etag: str, block: int, length: int) -> bytes | None:
        if not self.enabled:
            return None
        d = self._dir(uri, etag)
        for p in d.glob(f"{block:08d}.*.blk") if d.is_dir() else ():
            try:
                data = p.read_bytes()
            except FileNotFoundError:  # evicted meanwhile
                continue
            if len(data) == length and f"{zlib.crc32(data):08x}" == p.name.split(".")[1]:
                with self._lock:
                    self.hits += 1
                try:
                    os.utime(p)  # recently used
                except FileNotFoundError:
                    pass
                return data
            with self._lock:
                self.corrupt += 1
            log.warning("token cache: %s is corrupt (length or CRC-32 differs); reading the block again", p)
            p.unlink(missing_ok=True)
        with self._lock:
            self.misses += 1
        return None

    def put(self, uri: str, etag: str, block: int, data: bytes) -> None:
        if not self.enabled:
            return
        d = self._dir(uri, etag)
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".part-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, d / f"{block:08d}.{zlib.crc32(data):08x}.blk")
        except OSError as e:  # a full or read-only disk: the job goes on, reading from the store
            log.warning("token cache: cannot keep a block in %s (%s); reading from the store", d, e)
            return
        with self._lock:
            self._added += len(data)
            due = self._added > max(self.max_bytes // 10, 1)
            if due:
                self._added = 0
        if due:
            self.evict()

    def evict(self) -> None:
        """Delete the least recently used blocks until the cache is within its bound."""
        files = []
        for p in self.root.glob("*/*.blk"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, st.st_size, p))
        total = sum(s for _, s, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size


class RemoteStream:
    """The token ids of one object (a Megatron ``.bin``) as an array-like: ``len``, ``size``, ``[a:b]``."""

    def __init__(self, loc, rel: str, dtype: np.dtype, cache: BlockCache | None = None, block_bytes: int | None = None):
        info = loc.file_info(rel)
        if info is None:
            raise InputError(f"{loc.path(rel)} does not exist", "re-run the tokenization stage (the Megatron dataset is incomplete)")
        self.loc, self.rel, self.uri, self.dtype = loc, rel, loc.path(rel), np.dtype(dtype)
        self.nbytes, self.etag = info.size, info.tag
        self.size = self.nbytes // self.dtype.itemsize
        self.shape = (self.size,)
        mb = _env_float("PREPLINE_TOKEN_BLOCK_MB", 4)
        self.block = block_bytes or max(self.dtype.itemsize, int(mb * 2**20) // self.dtype.itemsize * self.dtype.itemsize)
        self.cache = cache if cache is not None else BlockCache()
        self.gets = 0
        self.wait_seconds = 0.0
        self._lock = threading.Lock()
        # the last blocks read, in memory (up to RECENT_BYTES): consecutive windows share a block, and
        # reading it from the cache directory again (a file and its CRC) for each one cost ~6 % of step time
        self._recent: OrderedDict[int, bytes] = OrderedDict()
        recent = int(_env_float("PREPLINE_TOKEN_RECENT_MB", RECENT_BYTES / 2**20) * 2**20)
        self._recent_max = max(2, recent // self.block) if self.cache.enabled else 1

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a RemoteStream takes contiguous slices only")
        start, stop, _ = key.indices(self.size)
        if stop <= start:
            return np.zeros(0, self.dtype)
        b0, b1 = start * self.dtype.itemsize, stop * self.dtype.itemsize
        first, last = b0 // self.block, (b1 - 1) // self.block
        data = b"".join(self._block(k) for k in range(first, last + 1))
        off = b0 - first * self.block
        return np.frombuffer(data, self.dtype, count=stop - start, offset=off)

    def blocks_of(self, start: int, stop: int) -> range:
        b0, b1 = start * self.dtype.itemsize, min(stop, self.size) * self.dtype.itemsize
        return range(b0 // self.block, (max(b1, b0 + 1) - 1) // self.block + 1)

    def warm(self, k: int) -> None:
        """Block ``k`` into the cache (a prefetch)."""
        if not self.cache.has(self.uri, self.etag, k):
            self._fetch(k)

    def _block(self, k: int) -> bytes:
        with self._lock:
            if k in self._recent:
                self._recent.move_to_end(k)
                return self._recent[k]
        data = self._fetch(k)
        with self._lock:
            self._recent[k] = data
            while len(self._recent) > self._recent_max:
                self._recent.popitem(last=False)
        return data

    def _fetch(self, k: int) -> bytes:
        lo = k * self.block
        length = min(self.block, self.nbytes - lo)
        data = self.cache.get(self.uri, self.etag, k, length)
        if data is not None:
            return data
        t0 = time.perf_counter()
        data = self._get(lo, lo + length)
        with self._lock:
            self.gets += 1
            self.wait_seconds += time.perf_counter() - t0
        if len(data) != length:
            raise InputError(f"{self.uri}: bytes {lo}-{lo + length - 1} came back as {len(data)} bytes",
                             "the object changed while it was read: rerun the job")
        self.cache.put(self.uri, self.etag, k, data)
        return data

    def _get(self, lo: int, hi: int) -> bytes:
        """One ranged GET of the version this stream opened (If-Match its ETag)."""
        from prepline.objstore import read_range

        return read_range(self.loc, self.rel, lo, hi, self.etag)
