"""ingest: raw data in, Parquet out: JSONL (.gz, .zst), CSV/TSV, WARC and WET (Common Crawl, HTML to
text), and Hugging Face dataset folders (the ``.arrow`` shards ``datasets.save_to_disk`` writes,
or ``.parquet`` shards).

Every record becomes one row: the text (``text_column``), a stable ``source_id`` (``<file>:<line>``
for JSONL/CSV, ``<file>:<row>`` for dataset shards, the WARC-Record-ID for WARC/WET), ``url`` and
``date`` where the format has them, and ``metadata`` (JSON: the record's other fields, or the
extractor's findings such as the title and the detected encoding). A record that cannot be used is
counted by reason (``removed.invalid_json``, ``no_text``, ``not_html``, ``no_text_extracted``, ...)
and never dropped silently. A file that cannot be read at all (truncated gzip, not a WARC) fails
with its name, unless tolerated with ``--max-failed-files``.

Files are read as streams (remote ones with range reads), in batches of ``batch_records``.
HTML is turned into text by Resiliparse (``extractor='resiliparse'``, chosen by measurement:
docs/transforms/ingest.md) or trafilatura.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from dataclasses import dataclass
from typing import IO, Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from prepline.config import TransformConfig, param
from prepline.context import short_error
from prepline.errors import ConfigError, InputError
from prepline.registry import register
from prepline.transform import FileTask, Output, PhaseContext, Transform

JSONL = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".ndjson", ".ndjson.gz", ".ndjson.zst")
CSV = (".csv", ".tsv", ".csv.gz", ".tsv.gz")
WARC = (".warc", ".warc.gz", ".wet", ".wet.gz")
SHARDS = (".arrow", ".parquet")
ERROR = "_error"  # reason a record is not usable (dropped and counted by the transform)
_FIX = "fix or remove the file, or pass --max-failed-files N to skip up to N bad files"


@dataclass(frozen=True)
class IngestConfig(TransformConfig):
    text_column: str = param("contents", "output column for the text")
    text_field: str = param("text", "field (JSONL, CSV, dataset shards) holding the text")
    id_field: str = param("", "field with the record's own id for source_id (empty: source_id is <file>:<line or row>)")
    url_field: str = param("url", "field with the URL, if any (WARC/WET: the record's target URI)")
    date_field: str = param("date", "field with the date, if any (WARC/WET: WARC-Date)")
    extractor: str = param("resiliparse", "HTML to text for WARC response records", choices=("resiliparse", "trafilatura"))
    batch_records: int = param(10000, "records per batch (memory does not follow the file size)", min=1)

    def validate(self) -> None:
        if not self.text_column or not self.text_field:
            raise ConfigError("text_column and text_field must not be empty", "name the columns, e.g. --text-column contents")


#: one encoder for every record (json.dumps with options builds a new one per call)
_JSON = json.JSONEncoder(ensure_ascii=False, default=str, sort_keys=True)


class _Batch:
    """Rows of one batch, column by column: every ``CHUNK`` rows become Arrow arrays, so the Python
    strings of a page are freed while their memory is still in the cache (rather than a whole
    batch of them kept until its table is built)."""

    CHUNK = 256
    NAMES = ("text", "source_id", "url", "date", "metadata", ERROR)

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in self.NAMES}
        self._chunks: list[pa.RecordBatch] = []
        self._done = 0

    def add(self, source_id: str, text: str | None = None, url: Any = None, date: Any = None, meta: dict | str | None = None, error: str | None = None) -> None:
        """One record; ``meta`` is a dict, or its JSON text already written (WARC pages)."""
        c = self.cols
        c["text"].append(text if error is None else None)
        c["source_id"].append(source_id)
        c["url"].append(None if url is None else str(url))
        c["date"].append(None if date is None else str(date))
        c["metadata"].append(meta if meta is None or isinstance(meta, str) else _JSON.encode(meta) if meta else None)
        c[ERROR].append(error)
        if len(c[ERROR]) >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        n = len(self.cols[ERROR])
        if n:
            self._chunks.append(pa.record_batch([pa.array(v, pa.string()) for v in self.cols.values()], names=list(self.NAMES)))
            self._done += n
            for v in self.cols.values():
                v.clear()

    def __len__(self) -> int:
        return self._done + len(self.cols[ERROR])

    def clear(self) -> None:
        for v in self.cols.values():
            v.clear()
        self._chunks, self._done = [], 0

    def table(self, text_column: str) -> pa.Table:
        self._flush()
        names = [text_column if k == "text" else k for k in self.NAMES]
        if not self._chunks:
            return pa.table({k: pa.array([], pa.string()) for k in names})
        return pa.Table.from_batches(self._chunks).rename_columns(names)


@register
class Ingest(Transform):
    name = "ingest"
    Config = IngestConfig
    summary = "JSONL(.gz/.zst), CSV/TSV, WARC/WET (HTML to text) and HF dataset shards to Parquet"
    headline = ("removed.*",)
    input_suffixes = JSONL + CSV + WARC + SHARDS

    def output_rel(self, rel: str) -> str:
        return rel if rel.endswith(".parquet") else rel + ".parquet"

    def setup(self, ctx: PhaseContext) -> None:
        from prepline.transforms.ingest_html import make_extractor

        self._extract = make_extractor(self.config.extractor)

    # -- reading ---------------------------------------------------------------------------------
    def read_batches(self, task: FileTask, ctx: PhaseContext) -> Iterator[pa.Table]:
        rel = task.rel
        if task.size == 0:
            raise InputError(f"{task.path}: file is empty (0 bytes)", _FIX)
        if rel.endswith(SHARDS):
            yield from _file_errors(task, self._read_shards(task, ctx))
            return
        reader = self._read_warc if rel.endswith(WARC) else self._read_csv if rel.endswith(CSV) else self._read_jsonl
        batch = _Batch()
        f = ctx.input.open_input(rel, task.size)
        try:
            for _ in _file_errors(task, reader(task, f, batch)):
                if len(batch) >= self.config.batch_records:
                    yield batch.table(self.config.text_column)
                    batch.clear()  # the same object: the reader appends to the batch it was given
        finally:
            f.close()
        yield batch.table(self.config.text_column)

    def _fields(self, rec: dict, sid: str, batch: _Batch) -> None:
        c = self.config
        text = rec.get(c.text_field)
        if not isinstance(text, str):
            batch.add(sid, error="no_text" if text is None else "text_not_a_string")
            return
        if c.id_field and rec.get(c.id_field) not in (None, ""):
            sid = str(rec[c.id_field])
        others = {k: v for k, v in rec.items() if k not in (c.text_field, c.id_field, c.url_field, c.date_field)}
        batch.add(sid, text, rec.get(c.url_field), rec.get(c.date_field), others)

    def _read_jsonl(self, task: FileTask, f: IO[bytes], batch: _Batch) -> Iterator[None]:
        found, checked, fields = False, 0, {}  # the text field in any record yet; records without it; their fields
        for line_no, line in enumerate(_decompressed(task.rel, f), 1):
            if not line.strip():
                continue  # blank lines are not records
            sid = f"{task.rel}:{line_no}"
            try:
                rec = json.loads(line)
            except (ValueError, UnicodeDecodeError) as e:
                batch.add(sid, error="bad_encoding" if isinstance(e, UnicodeDecodeError) else "invalid_json")
                yield
                continue
            if isinstance(rec, dict):
                if not found:
                    found = self.config.text_field in rec
                    if not found:
                        checked += 1
                        fields.update(rec)
                        if checked >= _PROBE:
                            raise _no_text_field(task, self.config.text_field, checked, fields)
                self._fields(rec, sid, batch)
            else:
                batch.add(sid, error="not_an_object")
            yield
        if checked and not found:
            raise _no_text_field(task, self.config.text_field, checked, fields)

    def _read_csv(self, task: FileTask, f: IO[bytes], batch: _Batch) -> Iterator[None]:
        text = io.TextIOWrapper(_decompressed(task.rel, f), encoding="utf-8", newline="")
        delimiter = "\t" if ".tsv" in task.rel else ","
        reader = csv.DictReader(text, delimiter=delimiter)
        if reader.fieldnames is None or self.config.text_field not in reader.fieldnames:
            raise InputError(
                f"{task.path}: no column '{self.config.text_field}' in the header ({', '.join(reader.fieldnames or []) or 'empty'})",
                "set text_field to the column holding the text",
            )
        for rec in reader:
            sid = f"{task.rel}:{reader.line_num}"
            if None in rec:  # more cells than header names
                batch.add(sid, error="extra_cells")
            else:
                self._fields(rec, sid, batch)
            yield

    def _read_warc(self, task: FileTask, f: IO[bytes], batch: _Batch) -> Iterator[None]:
        from prepline.transforms.ingest_html import warc_records

        add = batch.add
        for row in warc_records(f, self._extract):
            add(*row)
            yield

    def _read_shards(self, task: FileTask, ctx: PhaseContext) -> Iterator[pa.Table]:
        from prepline.transforms.ingest_html import shard_batches

        c = self.config
        row = 0
        for rb in shard_batches(ctx.input, task, c.batch_records):
            if c.text_field not in rb.schema.names:
                raise InputError(f"{task.path}: no column '{c.text_field}' (columns: {', '.join(rb.schema.names)})", "set text_field to the column holding the text")
            batch = _Batch()
            for i, rec in enumerate(rb.to_pylist()):
                self._fields(rec, f"{task.rel}:{row + i}", batch)
            row += rb.num_rows
            yield batch.table(c.text_column)
        if row == 0:
            yield _Batch().table(c.text_column)

    def empty_output_fix(self, reason: str) -> str:
        if reason in ("no_text", "text_not_a_string"):
            return "set text_field to the field holding the text (prepline run ingest --text-field NAME; a pipeline: its text_field parameter)"
        return super().empty_output_fix(reason)

    # -- the map ---------------------------------------------------------------------------------
    def transform(self, table: pa.Table, task: FileTask) -> Output:
        err = table.column(ERROR)
        removed = {k["values"]: int(k["counts"]) for k in pc.value_counts(err.drop_null()).to_pylist()} if err.null_count < len(err) else {}
        keep = table.filter(pc.is_null(err)) if removed else table
        return Output.of(keep.drop_columns([ERROR]), removed=removed)


#: JSONL records read before a text field that none of them has is called wrong
_PROBE = 1000
#: field names that usually hold a document's text, in the order a fix suggests them
TEXT_NAMES = ("text", "content", "contents", "body", "document", "raw_content", "article", "markdown")


def likely_text_field(fields: dict) -> str | None:
    """The field of ``fields`` (name -> a value) that most likely holds the text: a usual name, else
    the longest string value."""
    for n in TEXT_NAMES:
        if isinstance(fields.get(n), str):
            return n
    strings = {k: len(v) for k, v in fields.items() if isinstance(v, str)}
    return max(strings, key=strings.get) if strings else None


def _no_text_field(task: FileTask, field: str, n: int, fields: dict) -> InputError:
    """A JSONL file none of whose first records has the text field: the field is wrong, say which exist."""
    guess = likely_text_field(fields)
    names = ", ".join(sorted(fields)[:30]) or "none"
    return InputError(f"{task.path}: no field '{field}' in {'any of its' if n < _PROBE else 'its first'} {n:,} records (fields: {names})",
                      f"set text_field to the field holding the text, e.g. --text-field {guess or 'NAME'} "
                      f"(a pipeline: --param text_field={guess or 'NAME'})")


def _decompressed(rel: str, f: IO[bytes]) -> IO[bytes]:
    if rel.endswith(".gz"):
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    if rel.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True))  # type: ignore[arg-type]
    return io.BufferedReader(f, 1 << 20)  # type: ignore[arg-type] # lines of a plain file (an Arrow file cannot be iterated by line)


def _file_errors(task: FileTask, records: Iterator) -> Iterator:
    """Pass records on; a broken file (truncated gzip, bad zstd frame, not a WARC) fails with its name."""
    try:
        yield from records
    except (OSError, EOFError, ValueError, UnicodeDecodeError, csv.Error) as e:
        from prepline.data_access import is_transient

        if is_transient(e):
            raise
        raise InputError(f"{task.path}: cannot be read as {_kind(task.rel)} ({type(e).__name__}: {short_error(e)})", _FIX) from None


def _kind(rel: str) -> str:
    for kinds, name in ((JSONL, "JSONL"), (CSV, "CSV/TSV"), (WARC, "WARC/WET")):
        if rel.endswith(kinds):
            return name + (" (compressed)" if rel.endswith((".gz", ".zst")) else "")
    return "a dataset shard"
