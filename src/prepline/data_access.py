"""One interface over local folders and ``s3://`` URIs.

A :class:`Location` is rooted at a folder; paths inside it are relative, '/'-separated. Listing
takes sizes from the listing itself (``os.scandir`` locally, ``ListObjectsV2`` pages on S3:
never one metadata request per object). Files and folders whose name starts with ``_`` or ``.``
are not data (work folders, temp files, ground truth) and are skipped by :meth:`list_files`.
Writes are atomic: a temp name then ``os.replace`` locally; a single ``PutObject`` on S3.

S3 credentials come from the environment (the usual ``AWS_*`` variables, profiles or an
instance role); the endpoint from ``PREPLINE_S3_ENDPOINT`` or ``AWS_ENDPOINT_URL[_S3]`` for
MinIO/Ceph. Retries and timeouts are boto3's standard mode, tunable with
``PREPLINE_S3_MAX_ATTEMPTS``.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from prepline.errors import InputError

PARQUET_WRITE_OPTIONS = dict(compression="zstd", row_group_size=64 * 1024, write_statistics=True)


@dataclass(frozen=True)
class FileInfo:
    rel: str  # relative to the location's root, '/'-separated
    size: int


# what LocalLocation._tmp makes: ".<name>.tmp-<uuid4 hex>"
_TEMP_NAME = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def _hidden(rel: str) -> bool:
    return any(part.startswith(("_", ".")) for part in rel.split("/"))


class Location:
    """A folder, local or on S3. Use :func:`open_location`."""

    uri: str

    def path(self, rel: str = "") -> str:
        raise NotImplementedError

    def list_all(self, rel_prefix: str = "") -> list[FileInfo]:
        """Every file under ``rel_prefix`` (hidden ones too), sorted by path."""
        raise NotImplementedError

    def list_files(self, suffix: str = ".parquet") -> list[FileInfo]:
        """Data files under the root: visible, ending with ``suffix``, sorted by path."""
        return [f for f in self.list_all() if f.rel.endswith(suffix) and not _hidden(f.rel)]

    def exists(self) -> bool:
        raise NotImplementedError

    def read_bytes(self, rel: str) -> bytes:
        raise NotImplementedError

    def write_bytes(self, rel: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, rel_prefix: str = "") -> None:
        """Delete everything under ``rel_prefix`` (the whole location for '')."""
        raise NotImplementedError

    def sub(self, rel: str) -> "Location":
        return open_location(self.path(rel))

    # -- Parquet ---------------------------------------------------------------------------
    def parquet_file(self, rel: str) -> pq.ParquetFile:
        """Open a Parquet file for reading its footer (schema, row counts) before any data."""
        raise NotImplementedError

    def open_random(self, rel: str, size: int | None = None) -> pa.NativeFile:
        """A seekable read-only file for random access (e.g. one record batch of an Arrow IPC
        file): memory-mapped locally, range reads on S3. ``size`` (from a listing) saves a request."""
        raise NotImplementedError

    def read_parquet(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        return self.parquet_file(rel).read(columns=columns)

    def write_parquet(self, rel: str, table: pa.Table) -> int:
        """Write atomically; returns the size in bytes."""
        buf = io.BytesIO()
        pq.write_table(table, buf, **PARQUET_WRITE_OPTIONS)
        data = buf.getvalue()
        self.write_bytes(rel, data)
        return len(data)

    def read_text(self, rel: str) -> str | None:
        try:
            return self.read_bytes(rel).decode("utf-8")
        except FileNotFoundError:
            return None


class LocalLocation(Location):
    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        self.uri = self.root

    def path(self, rel: str = "") -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

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
                    out.append(FileInfo(r, e.stat().st_size))

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
        tmp = self._tmp(rel)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path(rel))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def write_parquet(self, rel: str, table: pa.Table) -> int:
        tmp = self._tmp(rel)
        try:
            pq.write_table(table, tmp, **PARQUET_WRITE_OPTIONS)
            size = os.path.getsize(tmp)
            os.replace(tmp, self.path(rel))
            return size
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def parquet_file(self, rel: str) -> pq.ParquetFile:
        return pq.ParquetFile(self.path(rel), memory_map=True)

    def open_random(self, rel: str, size: int | None = None) -> pa.NativeFile:
        return pa.memory_map(self.path(rel))

    def delete(self, rel_prefix: str = "") -> None:
        import shutil

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


def s3_client():
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get("PREPLINE_S3_ENDPOINT") or None
    cfg = Config(
        retries={"max_attempts": int(os.environ.get("PREPLINE_S3_MAX_ATTEMPTS", "8")), "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
        s3={"addressing_style": "path"}
        if endpoint or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
        else {},
    )
    return boto3.client("s3", endpoint_url=endpoint, config=cfg)


class _S3RangeFile(io.RawIOBase):
    """A seekable read-only file over S3 range GETs, so a Parquet footer is read without the data."""

    def __init__(self, client, bucket: str, key: str, size: int):
        self._c, self._b, self._k, self._size, self._pos = client, bucket, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: offset, 1: self._pos + offset, 2: self._size + offset}[whence]
        return self._pos

    def readinto(self, b) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        rng = f"bytes={self._pos}-{self._pos + n - 1}"
        data = self._c.get_object(Bucket=self._b, Key=self._k, Range=rng)["Body"].read()
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


class S3Location(Location):
    def __init__(self, uri: str):
        rest = uri[len("s3://") :]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise InputError(f"'{uri}' names no bucket", "use s3://<bucket>/<prefix>")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = s3_client()
        return self._client

    def __getstate__(self):  # boto3 clients do not pickle; workers make their own
        d = dict(self.__dict__)
        d["_client"] = None
        return d

    def key(self, rel: str = "") -> str:
        return "/".join(p for p in (self.prefix, rel.strip("/")) if p)

    def path(self, rel: str = "") -> str:
        return f"s3://{self.bucket}/{self.key(rel)}"

    def _iter_objects(self, rel_prefix: str) -> Iterator[dict]:
        prefix = self.key(rel_prefix)
        prefix = prefix + "/" if prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": 1000}):
                yield from page.get("Contents", [])
        except self.client.exceptions.NoSuchBucket:
            raise self._no_bucket() from None

    def _no_bucket(self) -> InputError:
        return InputError(f"bucket '{self.bucket}' does not exist ({self.uri})", "create it or fix the URI")

    def _is_no_bucket(self, e: Exception) -> bool:
        return getattr(e, "response", {}).get("Error", {}).get("Code") == "NoSuchBucket"

    def list_all(self, rel_prefix: str = "") -> list[FileInfo]:
        base = self.key()
        cut = len(base) + 1 if base else 0
        out = [FileInfo(o["Key"][cut:], int(o["Size"])) for o in self._iter_objects(rel_prefix) if not o["Key"].endswith("/")]
        return sorted(out, key=lambda f: f.rel)

    def exists(self) -> bool:
        for _ in self._iter_objects(""):
            return True
        return False

    def read_bytes(self, rel: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(self.path(rel)) from None
        except ClientError as e:
            if self._is_no_bucket(e):
                raise self._no_bucket() from None
            raise

    def write_bytes(self, rel: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key(rel), Body=data)
        except ClientError as e:
            if self._is_no_bucket(e):
                raise self._no_bucket() from None
            raise

    def parquet_file(self, rel: str) -> pq.ParquetFile:
        return pq.ParquetFile(pa.BufferReader(self.read_bytes(rel)))

    def parquet_footer(self, rel: str, size: int) -> pq.ParquetFile:
        """Open with range reads: only the footer is fetched (for schema checks on the driver)."""
        return pq.ParquetFile(self.open_random(rel, size, buffer_size=64 * 1024))

    def open_random(self, rel: str, size: int | None = None, buffer_size: int = 1 << 20) -> pa.NativeFile:
        if size is None:
            try:
                size = int(self.client.head_object(Bucket=self.bucket, Key=self.key(rel))["ContentLength"])
            except self.client.exceptions.ClientError as e:
                if getattr(e, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                    raise FileNotFoundError(self.path(rel)) from None
                raise
        raw = _S3RangeFile(self.client, self.bucket, self.key(rel), size)
        return pa.PythonFile(io.BufferedReader(raw, buffer_size), mode="r")

    def delete(self, rel_prefix: str = "") -> None:
        keys = [o["Key"] for o in self._iter_objects(rel_prefix)]
        key = self.key(rel_prefix)
        if key:  # a single object at exactly that name (locally: a file, not a folder)
            first = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1).get("Contents", [])
            if first and first[0]["Key"] == key:
                keys.insert(0, key)
        for i in range(0, len(keys), 1000):
            resp = self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True}
            )
            errors = resp.get("Errors") or []
            if errors:
                e = errors[0]
                raise OSError(
                    f"could not delete {len(errors)} object(s) under {self.path(rel_prefix)}; "
                    f"first: {e.get('Key')}: {e.get('Code')} {e.get('Message')}"
                )


def open_location(uri: str) -> Location:
    return S3Location(uri) if is_s3(uri) else LocalLocation(uri)


def inside(child: Location, parent: Location) -> bool:
    """True when ``child`` is ``parent`` or a folder below it."""
    if isinstance(child, LocalLocation) and isinstance(parent, LocalLocation):
        a, b = os.path.realpath(child.path()), os.path.realpath(parent.path())
        return a == b or a.startswith(b.rstrip(os.sep) + os.sep)
    if isinstance(child, S3Location) and isinstance(parent, S3Location):
        if child.bucket != parent.bucket:
            return False
        a, b = child.prefix, parent.prefix
        return not b or a == b or a.startswith(b + "/")
    return False  # one local, one on S3
