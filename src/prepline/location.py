"""The storage interface every stage uses: :class:`Location`, a folder on some filesystem.

A location is rooted at a folder; paths inside it are relative, '/'-separated. Implementations:
:class:`prepline.data_access.LocalLocation` (local disk) and :class:`prepline.objstore.RemoteLocation`
(``s3://``, ``gs://``, ``az://``, ``hf://`` through fsspec). Build one with
:func:`prepline.data_access.open_location`.

Storage errors come in three kinds, so that callers (and the S3 fault handling built on them) can
tell a flaky store from bad input:

- :class:`FileNotFoundError` for a missing file (callers rely on it, e.g. to resume);
- :class:`TransientStorageError` for what a retry may cure: timeouts, connection resets, 5xx,
  throttling (:func:`prepline.objstore.is_transient` says the same of a raw library exception);
- :class:`StorageDenied` (a ``ServiceError``, exit 5) for refused or missing credentials;
- :class:`StorageError` (an ``InputError``) for everything else: a missing bucket.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from typing import IO, Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prepline.errors import InputError, ServiceError, ServiceUnavailable

#: how every Parquet file prepline writes is encoded (data, work files, outputs); page checksums
#: (CRC32) are written, and verified on every read (PARQUET_READ_OPTIONS): a corrupted page fails its file
PARQUET_WRITE_OPTIONS = dict(compression="zstd", row_group_size=64 * 1024, write_statistics=True, write_page_checksum=True)
# pre_buffer=False: pyarrow's default pre-buffers the column chunks of every row group an
# iter_batches will read, i.e. the whole file, before the first batch (a 2 GB file peaked at ~2 GB)
PARQUET_READ_OPTIONS = dict(page_checksum_verification=True, pre_buffer=False)


@dataclass(frozen=True)
class FileInfo:
    rel: str  # relative to the location's root, '/'-separated
    size: int
    #: what identifies this version of the file beyond its size, from the listing itself ('' unknown):
    #: locally the modification time in ns, on S3 the ETag (another store: its etag, generation or
    #: mtime). A resume compares it, so a file edited in place (same size) is not taken for the old one.
    tag: str = field(default="", compare=False)


class StorageError(InputError):
    """A storage call failed for a reason a retry will not cure (missing bucket, access denied)."""


class StorageDenied(ServiceError):
    """The store refused the credentials or the request (403), or there are no credentials at all:
    nothing a retry or another input file cures (exit 5, never tolerated as a bad input file)."""


class TransientStorageError(ServiceUnavailable):
    """A storage call failed for a reason a retry may cure: timeout, reset, 5xx, throttling.

    Raised after the layer's own bounded retries (``PREPLINE_S3_MAX_ATTEMPTS``) ran out. Not an
    ``OSError`` on purpose: code that reports an unreadable file on ``OSError`` lets it through,
    so a flaky store is never reported as a corrupt input file. ``cause`` is the library's error.
    """

    def __init__(self, message: str, fix: str | None = None, cause: BaseException | None = None):
        super().__init__(message, fix)
        self.cause = cause


def hidden(rel: str) -> bool:
    """Files and folders whose name starts with ``_`` or ``.`` are not data (work, temp, truth)."""
    return any(part.startswith(("_", ".")) for part in rel.split("/"))


class Location:
    """A folder, local or remote. Use :func:`prepline.data_access.open_location`."""

    uri: str
    #: a run's fencing (:class:`prepline.runtime.lock.Fence`): called right before every write is
    #: committed and every delete; raises when the run no longer holds its output's lock, so a run
    #: that lost it (paused past its lease, taken over) never writes into the output again
    fence: Callable[[], None] | None = None

    def check_fence(self) -> None:
        if self.fence is not None:
            self.fence()

    def path(self, rel: str = "") -> str:
        raise NotImplementedError

    def list_all(self, rel_prefix: str = "") -> list[FileInfo]:
        """Every file under ``rel_prefix`` (hidden ones too), sorted by path."""
        raise NotImplementedError

    def list_files(self, suffix: str | tuple[str, ...] = ".parquet") -> list[FileInfo]:
        """Data files under the root: visible, ending with ``suffix`` (one or several), sorted."""
        return [f for f in self.list_all() if f.rel.endswith(suffix) and not hidden(f.rel)]

    def exists(self) -> bool:
        """True when the root is a folder holding something (a remote prefix has no folders)."""
        raise NotImplementedError

    def file_size(self, rel: str = "") -> int | None:
        """The size of the file at ``rel`` ('' the root itself), None when it is not a file."""
        raise NotImplementedError

    def file_info(self, rel: str = "") -> FileInfo | None:
        """The file at ``rel`` ('' the root itself) with its size and :attr:`FileInfo.tag`, None
        when it is not a file."""
        raise NotImplementedError

    def parent_and_name(self) -> tuple["Location", str]:
        """The folder holding the root and the root's own name (for a root that is one file)."""
        raise NotImplementedError

    def read_bytes(self, rel: str) -> bytes:
        raise NotImplementedError

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write atomically: readers see the old file or the whole new one, never a part."""
        raise NotImplementedError

    def delete(self, rel_prefix: str = "") -> None:
        """Delete everything under ``rel_prefix`` (the whole location for '')."""
        raise NotImplementedError

    def sub(self, rel: str) -> "Location":
        """The folder ``rel`` below this one, as a location of the same kind (and the same fence)."""
        loc = self.at(self.path(rel))
        loc.fence = self.fence
        return loc

    def at(self, uri: str) -> "Location":
        """A location of the same kind (and settings) rooted at ``uri``."""
        raise NotImplementedError

    # -- streams ------------------------------------------------------------------------------
    def open_input(self, rel: str, size: int | None = None) -> IO[bytes] | pa.NativeFile:
        """A seekable binary file for reading (remote: range reads, only what is read is fetched).
        ``size``, when the listing gave it, saves a metadata request."""
        raise NotImplementedError

    @contextlib.contextmanager
    def open_output(self, rel: str) -> Iterator[IO[bytes]]:
        """A binary file for writing, committed atomically when the block ends without error
        (local: temp name then rename; S3: multipart upload completed) and discarded otherwise."""
        raise NotImplementedError
        yield

    # -- Parquet ------------------------------------------------------------------------------
    def parquet_file(self, rel: str, size: int | None = None) -> pq.ParquetFile:
        """Open a Parquet file: the footer (schema, row counts) is read first, data on demand."""
        return pq.ParquetFile(self.open_input(rel, size), buffer_size=1 << 20, **PARQUET_READ_OPTIONS)  # pages streamed

    def parquet_footer(self, rel: str, size: int) -> pq.ParquetFile:
        """The same, for schema checks on the driver (kept for callers that name it)."""
        return self.parquet_file(rel, size)

    def read_parquet(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        return self.parquet_file(rel).read(columns=columns)

    @contextlib.contextmanager
    def parquet_writer(self, rel: str, schema: pa.Schema) -> Iterator["ParquetSink"]:
        """A Parquet writer whose row groups go out as they are written (bounded memory);
        the file appears atomically when the block ends without error."""
        with self.open_output(rel) as f:
            sink = ParquetSink(f, schema)
            try:
                yield sink
            except BaseException:
                sink.abandon()
                raise
            sink.close()

    def write_parquet(self, rel: str, table: pa.Table) -> int:
        """Write one table atomically; returns the size in bytes."""
        with self.parquet_writer(rel, table.schema) as w:
            w.write(table)
        return w.bytes_written

    def read_text(self, rel: str) -> str | None:
        try:
            return self.read_bytes(rel).decode("utf-8")
        except FileNotFoundError:
            return None


class ParquetSink:
    """A ``pq.ParquetWriter`` over an open output file that counts the bytes it wrote and casts
    later tables to the first one's schema (a column all-null in one batch is typed null)."""

    def __init__(self, f: IO[bytes], schema: pa.Schema):
        self._counting = _CountingFile(f)
        self._writer: pq.ParquetWriter | None = None  # opened by the first table: its values pick the encodings
        self.schema = schema
        self.rows = 0

    def _open(self, first: pa.Table | None) -> pq.ParquetWriter:
        plain = _long_value_columns(first) if first is not None else set()
        opts = _writer_options()
        if plain:  # the others keep the defaults (dictionary encoding, min/max statistics)
            rest = [n for n in self.schema.names if n not in plain]
            opts |= dict(use_dictionary=rest, write_statistics=rest)
        self._writer = pq.ParquetWriter(pa.PythonFile(self._counting, mode="w"), self.schema, **opts)
        return self._writer

    def write(self, table: pa.Table) -> None:
        if not table.schema.equals(self.schema, check_metadata=False):
            try:
                table = table.select(self.schema.names).cast(self.schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError) as e:
                raise InputError(
                    f"a batch's columns ({table.schema}) differ from the first batch's ({self.schema}): {e}",
                    "a transform must give every batch of a file the same columns and types",
                ) from None
        writer = self._writer or self._open(table)
        writer.write_table(table, row_group_size=PARQUET_WRITE_OPTIONS["row_group_size"])
        self.rows += table.num_rows

    def close(self) -> None:
        writer = self._writer or self._open(None)
        writer.close()
        # the rows the file holds, from its footer as written (a table without columns writes none
        # of its rows): counts are derived from what was written, not from what was handed over
        written = getattr(getattr(writer, "writer", None), "metadata", None)
        if written is not None:
            self.rows = written.num_rows

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            if self._writer is not None:
                self._writer.close()

    @property
    def bytes_written(self) -> int:
        return self._counting.count


def _writer_options() -> dict:
    return {k: v for k, v in PARQUET_WRITE_OPTIONS.items() if k != "row_group_size"}


#: a string or binary column whose values average this many bytes or more holds documents (text,
#: HTML), not labels
LONG_VALUE_BYTES = 256


def _long_value_columns(table: pa.Table) -> set[str]:
    """The columns of long values (documents' text), written without dictionary encoding or
    statistics: a dictionary of distinct documents outgrows its page (1 MiB) and is dropped after
    hashing that much of each column chunk, and the min and max of texts prune no query (they
    only fill the footer). Skipping both writes the same bytes of text ~7% faster (ingest's
    output, docs/performance.md)."""
    long = set()
    for name, col in zip(table.column_names, table.columns):
        t = col.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            continue
        values = len(col) - col.null_count
        if values and (pc.sum(pc.binary_length(col)).as_py() or 0) >= LONG_VALUE_BYTES * values:
            long.add(name)
    return long


class _CountingFile(io.RawIOBase):
    """Passes writes through and counts them (the written file's size without asking the store)."""

    def __init__(self, f: IO[bytes]):
        self._f, self.count = f, 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        n = self._f.write(b)
        n = len(memoryview(b)) if n is None else n
        self.count += n
        return n

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:  # the owner (open_output) closes the real file
        super().close()
