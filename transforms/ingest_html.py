"""The format readers behind ``ingest`` that need libraries: WARC/WET records (FastWARC), HTML to
text (Resiliparse or trafilatura), and Hugging Face dataset shards (Arrow IPC streams / Parquet).

Not a transform (no ``@register``): imported by :mod:`prepline.transforms.ingest` on the workers.
"""

from __future__ import annotations

import functools
import json
from json.encoder import encode_basestring as _quote  # type: ignore[attr-defined]  # json's own (C) string quoting
from typing import IO, Callable, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

from prepline.errors import ConfigError

#: html (str) -> (text, metadata)
Extractor = Callable[[str], "tuple[str, dict]"]


def make_extractor(name: str) -> Extractor:
    """The HTML-to-text function ``name``; a clear error when its package is missing."""
    try:
        if name == "resiliparse":
            from resiliparse.extract.html2text import extract_plain_text
            from resiliparse.parse.html import HTMLTree

            def resiliparse(html: str) -> tuple[str, dict]:
                tree = HTMLTree.parse(html)
                title = tree.title or ""
                return extract_plain_text(tree, main_content=True, preserve_formatting=True), {"title": title} if title else {}

            return resiliparse
        import trafilatura

        def traf(html: str) -> tuple[str, dict]:
            return trafilatura.extract(html, include_comments=False, include_tables=True) or "", {}

        return traf
    except ImportError as e:
        raise ConfigError(f"extractor '{name}' needs {e.name}, which is not installed", "pip install 'prepline[ingest]'") from None


#: one WARC/WET record as ingest stores it: (source_id, text, url, date, metadata JSON, error)
Row = tuple[str, "str | None", "str | None", "str | None", "str | None", "str | None"]

#: the metadata of a WET conversion record (the same for all)
_WET_META = json.dumps({"warc_type": "conversion"})


def _charset(declared: str | None) -> str:
    """A charset as an HTTP header gives it (FastWARC keeps the quotes of ``charset="utf-8"``)."""
    return declared.strip().strip("\"'").lower() if declared else ""


@functools.lru_cache(maxsize=256)
def _declared_charset(content_type: str) -> str:
    """The charset a Content-Type header names ('' for none); a crawl repeats a few of them."""
    if "charset" in content_type.lower():
        for part in content_type.split(";"):
            k, _, v = part.strip().partition("=")
            if k.lower() == "charset":
                return _charset(v)
    return ""


def _decode(body: bytes, declared: str) -> tuple[str | None, str]:
    """HTML bytes to str: the declared charset if it decodes, else Resiliparse's detection."""
    if declared:
        try:
            return body.decode(declared), declared
        except (LookupError, UnicodeDecodeError):
            pass
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    enc = detect_encoding(body)
    try:
        return bytes_to_str(body, enc), enc
    except Exception:
        return None, enc


def meta_json(encoding: str, html_bytes: int, found: dict) -> str:
    """The metadata of an extracted page as JSON, the same text ``json.dumps(..., sort_keys=True,
    ensure_ascii=False)`` gives, written directly for the usual shape (the extractor found a title
    or nothing): this runs once per page."""
    title = found.get("title") if len(found) == 1 else None
    if found and not isinstance(title, str):
        return json.dumps({"encoding": encoding, "html_bytes": html_bytes, **found}, ensure_ascii=False, sort_keys=True, default=str)
    head = f'{{"encoding": {_quote(encoding)}, "html_bytes": {html_bytes:d}'
    return head + (f', "title": {_quote(title)}}}' if title is not None else "}")


def warc_records(f: IO[bytes], extract: Extractor) -> Iterator[Row]:
    """One row per WARC response or WET conversion record (gzip detected by FastWARC).
    Other record types (request, metadata, warcinfo) are not documents and are skipped.

    Headers are looked up by FastWARC's own header keys and its parsed HTTP content type: a lookup
    by a ``str`` name costs ~1.4 µs (FastWARC first tries the name as a ``WarcHeader`` and raises),
    against ~0.4 µs."""
    from fastwarc.warc import ArchiveIterator, WarcHeader, WarcRecordType

    record_id, target, warc_date, content_type = WarcHeader.WARC_RECORD_ID, WarcHeader.WARC_TARGET_URI, WarcHeader.WARC_DATE, WarcHeader.CONTENT_TYPE
    conversion = WarcRecordType.conversion
    wanted = WarcRecordType.response | conversion | WarcRecordType.resource
    for rec in ArchiveIterator(f, record_types=wanted, parse_http=True):
        h = rec.headers
        sid, url, date = (h.get(record_id) or "").strip("<>"), h.get(target) or None, h.get(warc_date) or None
        body = rec.reader.read()
        if rec.record_type == conversion:  # WET: already plain text
            yield sid, body.decode("utf-8", errors="replace"), url, date, _WET_META, None
            continue
        http = rec.http_headers
        if http is not None:
            ctype, declared = rec.http_content_type or "", _charset(rec.http_charset)
        else:  # a resource record: the payload's own type is the WARC Content-Type
            ctype = h.get(content_type) or ""
            declared = _declared_charset(ctype)
        if http is not None and http.status_code and http.status_code >= 300:
            yield sid, None, url, date, None, "http_status"
        elif "html" not in ctype.lower():
            yield sid, None, url, date, None, "not_html"
        else:
            html, enc = _decode(body, declared)
            if html is None:
                yield sid, None, url, date, None, "bad_encoding"
                continue
            text, found = extract(html)
            meta = meta_json(enc, len(body), found)
            yield sid, text, url, date, meta, None if text.strip() else "no_text_extracted"


def shard_batches(loc, task, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of a dataset shard: Parquet, or the Arrow IPC *stream* files that
    ``datasets.save_to_disk`` writes (``data-00000-of-00001.arrow``; the IPC file format is read too)."""
    import pyarrow.parquet as pq

    f = loc.open_input(task.rel, task.size)
    try:
        if task.rel.endswith(".parquet"):
            yield from pq.ParquetFile(f).iter_batches(batch_size=batch_rows)
            return
        try:
            reader = ipc.open_stream(f)
            batches = iter(reader)
        except pa.ArrowInvalid:
            f.seek(0)
            r = ipc.open_file(f)
            batches = (r.get_batch(i) for i in range(r.num_record_batches))
        for b in batches:
            for start in range(0, b.num_rows, batch_rows):
                yield b.slice(start, batch_rows)
    finally:
        f.close()
