"""One interface over local folders and remote ones (``s3://``, ``gs://``, ``az://``, ``hf://``).

:func:`open_location` turns what a user typed into a :class:`~prepline.location.Location`: a local
path (or ``file://``) is a :class:`LocalLocation`; a URI with a scheme goes through fsspec
(:mod:`prepline.objstore`; ``s3://`` is an :class:`~prepline.objstore.S3Location`), and a scheme
whose package is not installed, or that prepline does not know, is refused with the fix.

Listing takes sizes from the listing itself (``os.scandir`` locally, ``ListObjectsV2`` pages on S3:
never one metadata request per object). Files and folders whose name starts with ``_`` or ``.``
are not data (work folders, temp files, ground truth) and are skipped by ``list_files``.
Writes are atomic: a temp name then ``os.replace`` locally; on S3 a multipart upload that is
completed only when the writer finishes (aborted otherwise). S3 settings: docs/storage.md.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import uuid
from typing import IO, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from prepline.errors import ConfigError
from prepline.location import (
    PARQUET_READ_OPTIONS,
    PARQUET_WRITE_OPTIONS,
    FileInfo,
    Location,
    ParquetSink,
    StorageError,
    TransientStorageError,
    hidden,
)
from prepline.objstore import SCHEMES, RemoteLocation, S3Location, S3Settings, is_transient, s3_client

__all__ = [
    "PARQUET_WRITE_OPTIONS", "FileInfo", "Location", "LocalLocation", "RemoteLocation", "S3Location", "S3Settings",
    "ParquetSink", "StorageError", "TransientStorageError", "is_transient", "is_s3", "scheme_of", "open_location",
    "inside", "s3_client",
]

# what LocalLocation._tmp makes: ".<name>.tmp-<uuid4 hex>"
_TEMP_NAME = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme_of(uri: str) -> str | None:
    """'s3' for 's3://b/k'; None for a local path (also 'file://...')."""
    m = _SCHEME.match(uri)
    if not m or m.group(1).lower() == "file":
        return None
    return m.group(1).lower()


def is_s3(uri: str) -> bool:
    return scheme_of(uri) in ("s3", "s3a")


class LocalLocation(Location):
    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        self.uri = self.root

    def path(self, rel: str = "") -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    def at(self, uri: str) -> "LocalLocation":
        return LocalLocation(uri)

    def exists(self) -> bool:
        return os.path.isdir(self.root)

    def list_all(self, rel_prefix: str = "") -> list[FileInfo]:
        out: list[FileInfo] = []

        def walk(d: str, rel: str, seen: frozenset) -> None:
            try:
                entries = list(os.scandir(d))
            except (FileNotFoundError, NotADirectoryError):
                return
            for e in entries:
                r = f"{rel}/{e.name}" if rel else e.name
                if e.is_dir(follow_symlinks=True):
                    st = e.stat(follow_symlinks=True)
                    ident = (st.st_dev, st.st_ino)
                    if ident in seen:  # a symlink back to a folder above: a loop, not more data
                        continue
                    walk(e.path, r, seen | {ident})
                elif e.is_file(follow_symlinks=True):
                    st = e.stat()
                    out.append(FileInfo(r, st.st_size, _local_tag(st)))

        start = self.path(rel_prefix)
        try:
            st = os.stat(start)
            seen = frozenset({(st.st_dev, st.st_ino)})
        except OSError:
            seen = frozenset()
        walk(start, rel_prefix.strip("/"), seen)
        return sorted(out, key=lambda f: f.rel)

    def read_bytes(self, rel: str) -> bytes:
        with open(self.path(rel), "rb") as f:
            return f.read()

    def _tmp(self, rel: str) -> str:
        d, name = os.path.split(self.path(rel))
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, f".{name}.tmp-{uuid.uuid4().hex}")

    def write_bytes(self, rel: str, data: bytes) -> None:
        with self.open_output(rel) as f:
            f.write(data)

    @contextlib.contextmanager
    def open_output(self, rel: str) -> Iterator[IO[bytes]]:
        tmp = self._tmp(rel)
        try:
            with open(tmp, "wb") as f:
                yield f
            self.check_fence()
            os.replace(tmp, self.path(rel))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    # Plain reads, not memory maps: the pages of a mapped file that were read count in the process's
    # RSS (and a container's memory) until unmapped, so a 2 GB input peaked at ~2 GB
    # (scripts/bench_memory.py, docs/performance.md).
    def open_input(self, rel: str, size: int | None = None) -> pa.NativeFile:
        return pa.OSFile(self.path(rel))

    def parquet_file(self, rel: str, size: int | None = None) -> pq.ParquetFile:
        return pq.ParquetFile(self.path(rel), buffer_size=1 << 20, **PARQUET_READ_OPTIONS)

    def file_size(self, rel: str = "") -> int | None:
        p = self.path(rel)
        return os.path.getsize(p) if os.path.isfile(p) else None

    def file_info(self, rel: str = "") -> FileInfo | None:
        p = self.path(rel)
        if not os.path.isfile(p):
            return None
        st = os.stat(p)
        return FileInfo(rel or os.path.basename(self.root), st.st_size, _local_tag(st))

    def parent_and_name(self) -> tuple[Location, str]:
        return LocalLocation(os.path.dirname(self.root)), os.path.basename(self.root)

    def delete(self, rel_prefix: str = "") -> None:
        import shutil

        self.check_fence()
        p = self.path(rel_prefix)
        if os.path.islink(p) and os.path.isdir(p):
            # a linked folder (e.g. an output on another disk): empty it, keep the link
            for e in os.scandir(p):
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path)
                else:
                    os.unlink(e.path)
        elif os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.unlink(p)

    def clean_temp_files(self) -> int:
        """Remove temp files left by a killed writer (they are never data). Returns how many."""
        n = 0
        for f in self.list_all():
            if _TEMP_NAME.match(posixpath.basename(f.rel)):
                os.unlink(self.path(f.rel))
                n += 1
        return n


def _local_tag(st: os.stat_result) -> str:
    """A local file's version: its modification time in ns (a rewrite changes it, a read does not)."""
    return f"mtime_ns={st.st_mtime_ns}"


def open_location(uri: str) -> Location:
    """The location ``uri`` names: a local path, ``file://...`` or ``<scheme>://bucket/prefix``."""
    scheme = scheme_of(uri)
    if scheme is None:
        return LocalLocation(uri[len("file://") :] if uri.lower().startswith("file://") else uri)
    if scheme in ("s3", "s3a"):
        return S3Location(uri)
    if scheme not in SCHEMES:
        raise ConfigError(
            f"'{uri}': the scheme '{scheme}://' is not supported",
            f"use a local path or one of {', '.join(k + '://' for k in SCHEMES)}",
        )
    return RemoteLocation(uri, scheme)


def inside(child: Location, parent: Location) -> bool:
    """True when ``child`` is ``parent`` or a folder below it."""
    if isinstance(child, LocalLocation) and isinstance(parent, LocalLocation):
        a, b = os.path.realpath(child.path()), os.path.realpath(parent.path())
        return a == b or a.startswith(b.rstrip(os.sep) + os.sep)
    if isinstance(child, RemoteLocation) and isinstance(parent, RemoteLocation):
        if (SCHEMES[child.scheme][0], child.bucket) != (SCHEMES[parent.scheme][0], parent.bucket):
            return False
        a, b = child.prefix, parent.prefix
        return not b or a == b or a.startswith(b + "/")
    return False  # one local, one remote
