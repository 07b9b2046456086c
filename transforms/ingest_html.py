"""The format readers behind ``ingest`` that need libraries: WARC/WET records (FastWARC), HTML to
text (Resiliparse or trafilatura), and Hugging Face dataset shards (Arrow IPC streams / Parquet).

Not a transform (no ``@register``): imported by :mod:`prepline.transforms.ingest` on the workers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
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


@dataclass
class Record:
    record_id: str
    text: str | None = None
    url: str | None = None
    date: str | None = None
    meta: dict = field(default_factory=dict)
    error: str | None = None


@functools.lru_cache(maxsize=256)
def _declared_charset(content_type: str) -> str:
    """The charset a Content-Type header names ('' for none); a crawl repeats a few of them."""
    if "charset" in content_type.lower():
        for part in content_type.split(";"):
            k, _, v = part.strip().partition("=")
            if k.lower() == "charset":
                return v.strip().strip('"').lower()
    return ""


def _decode(body: bytes, content_type: str) -> tuple[str | None, str]:
    """HTML bytes to str: the declared charset if it decodes, else Resiliparse's detection."""
    declared = _declared_charset(content_type)
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


def warc_records(f: IO[bytes], extract: Extractor) -> Iterator[Record]:
    """One :class:`Record` per WARC response or WET conversion record (gzip detected by FastWARC).
    Other record types (request, metadata, warcinfo) are not documents and are skipped."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    wanted = WarcRecordType.response | WarcRecordType.conversion | WarcRecordType.resource
    for rec in ArchiveIterator(f, record_types=wanted, parse_http=True):
        h = rec.headers
        r = Record(h.get("WARC-Record-ID", "").strip("<>"), url=h.get("WARC-Target-URI") or None, date=h.get("WARC-Date") or None)
        body = rec.reader.read()
        if rec.record_type == WarcRecordType.conversion:  # WET: already plain text
            r.text = body.decode("utf-8", errors="replace")
            r.meta = {"warc_type": "conversion"}
        else:
            http = rec.http_headers
            ctype = (http.get("Content-Type", "") if http else h.get("Content-Type", "")) or ""
            if http is not None and http.status_code and http.status_code >= 300:
                r.error = "http_status"
            elif "html" not in ctype.lower():
                r.error = "not_html"
            else:
                html, enc = _decode(body, ctype)
                if html is None:
                    r.error = "bad_encoding"
                else:
                    text, meta = extract(html)
                    r.text, r.meta = text, {"encoding": enc, "html_bytes": len(body), **meta}
                    if not text.strip():
                        r.error = "no_text_extracted"
        yield r


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
