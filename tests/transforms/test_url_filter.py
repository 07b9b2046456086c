"""url_filter: block lists (local and s3://), banned and soft-banned words, subdomains, missing URLs,
flag and remove with counts conserved, on real text from the bundled sample."""

from __future__ import annotations

import glob

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError

# (url, reason the filter must give, None: passes)
CASES = [
    ("https://www.spam-farm.com/article/1", "blocked_domain"),
    ("http://news.eu.spam-farm.com:8080/x?y=1", "blocked_domain"),
    ("HTTPS://User@SPAM-FARM.COM./", "blocked_domain"),
    ("https://not-spam-farm.com/page", None),  # a suffix that is not a parent domain
    ("https://spam-farm.com.example.org/a", None),  # the listed domain as a subdomain of another
    ("https://blog.example.org/2024/01/bad-post.html", "blocked_url"),
    ("https://blog.example.org/2024/01/good-post.html", None),
    ("https://videos.example.net/watch/porn-clip-12", "banned_word"),
    ("https://example.net/PORN/", "banned_word"),
    ("https://example.net/pornography-history", None),  # a token, not a substring
    ("https://example.net/free-sexy-pics", "soft_banned_words"),
    ("https://example.net/sex-education", None),  # one soft word only
    ("https://example.net/sex/sex/sex", None),  # distinct soft words are counted
    ("https://casinoroyale.example.com/", "banned_subword"),
    (None, None),
    ("", None),
    ("https://en.wikipedia.org/wiki/Parliament", None),
]


@pytest.fixture
def with_urls(tmp_path):
    """The sample's real documents, with URLs of every case (the sample has no url column)."""
    from prepline.sample import build_sample

    build_sample(tmp_path / "sample", docs=120, files=2)
    out = tmp_path / "in"
    out.mkdir()
    expected = []
    for i, f in enumerate(sorted(glob.glob(str(tmp_path / "sample" / "part-*.parquet")))):
        t = pq.read_table(f)
        urls = [CASES[(j + 7 * i) % len(CASES)] for j in range(t.num_rows)]
        expected += [r for _, r in urls]
        pq.write_table(t.append_column("url", pa.array([u for u, _ in urls], pa.string())), out / f"part-{i}.parquet")
    (tmp_path / "domains.txt").write_text("# blocked\nspam-farm.com\n\nWWW.Other-Bad.org\n")
    (tmp_path / "urls.txt").write_text("https://blog.example.org/2024/01/bad-post.html\n")
    return out, expected


def _read(folder):
    return pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(str(folder / "part-*.parquet"))))


def _params(tmp_path, **kw):
    return {"domain_lists": [str(tmp_path / "domains.txt")], "url_lists": [str(tmp_path / "urls.txt")],
            "banned_subwords": ["casino"], **kw}


def test_flag_gives_each_document_its_reason(tmp_path, with_urls):
    src, expected = with_urls
    m = run_transform("url_filter", _params(tmp_path), RunOptions(str(src), str(tmp_path / "o"), progress=False)).metadata
    got = _read(tmp_path / "o").column("url_filter_reason").to_pylist()
    assert got == expected
    counters = m["totals"]["counters"]
    for reason in ("blocked_domain", "blocked_url", "banned_word", "soft_banned_words", "banned_subword"):
        assert counters[f"url_{reason}"] == expected.count(reason) > 0
    urls = _read(tmp_path / "o").column("url").to_pylist()
    assert counters["url_missing"] == sum(1 for u in urls if not u) > 0
    assert m["totals"]["docs_out"] == m["totals"]["docs_in"] == len(expected)


def test_remove_conserves_counts_and_keeps_the_passing_documents(tmp_path, with_urls):
    src, expected = with_urls
    m = run_transform("url_filter", _params(tmp_path, action="remove", removed_sample=2),
                      RunOptions(str(src), str(tmp_path / "o"), progress=False)).metadata
    tot = m["totals"]
    assert tot["docs_in"] == tot["docs_out"] + sum(tot["removed"].values())
    assert tot["removed"] == {r: expected.count(r) for r in set(expected) - {None}}
    out = _read(tmp_path / "o")
    assert out.num_rows == expected.count(None) and "url_filter_reason" not in out.column_names
    assert glob.glob(str(tmp_path / "o" / "_removed" / "blocked_domain" / "*"))


def test_lists_from_s3(tmp_path, with_urls, s3_bucket):
    from prepline.data_access import s3_client

    src, expected = with_urls
    s3_client().put_object(Bucket=s3_bucket, Key="lists/domains.txt", Body=(tmp_path / "domains.txt").read_bytes())
    params = _params(tmp_path, domain_lists=[f"s3://{s3_bucket}/lists/domains.txt"])
    run_transform("url_filter", params, RunOptions(str(src), str(tmp_path / "o"), progress=False))
    assert _read(tmp_path / "o").column("url_filter_reason").to_pylist() == expected
    with pytest.raises(ConfigError, match=f"s3://{s3_bucket}/lists/missing.txt does not exist"):
        run_transform("url_filter", _params(tmp_path, url_lists=[f"s3://{s3_bucket}/lists/missing.txt"]),
                      RunOptions(str(src), str(tmp_path / "o2"), progress=False))


def test_default_words_can_be_turned_off(tmp_path, with_urls):
    src, expected = with_urls
    run_transform("url_filter", {"use_default_words": False}, RunOptions(str(src), str(tmp_path / "o"), progress=False))
    assert set(_read(tmp_path / "o").column("url_filter_reason").to_pylist()) == {None}


@pytest.mark.parametrize("params, says", [
    ({"domain_lists": ["/nonexistent/domains.txt"]}, "domain_lists: /nonexistent/domains.txt is not a file"),
    ({"banned_words": ["--"]}, "banned_words has '--', which has no letter or digit"),
    ({"action": "drop"}, "action"),
    ({"reason_column": "url"}, "reason_column and url_column are both 'url'"),
    ({"soft_word_threshold": 0}, "soft_word_threshold"),
])
def test_bad_parameters_are_clear_errors(tmp_path, with_urls, params, says):
    src, _ = with_urls
    with pytest.raises(ConfigError, match=says) as e:
        run_transform("url_filter", params, RunOptions(str(src), str(tmp_path / "o"), progress=False))
    assert e.value.fix
