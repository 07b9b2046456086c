"""The engine: metadata, conservation, bad input, tolerance (per transform, worker counts, runtimes and
resume: tests/transforms/test_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import make_corpus, tree_bytes, write_parquet
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError, OutputError, RunFailed

def chain(src: Path, dst: Path, **opts) -> dict:
    """doc_id -> exact_dedup -> filter; returns the last metadata."""
    run_transform("doc_id", {}, RunOptions(str(src), str(dst / "ids"), **opts))
    run_transform("exact_dedup", {"num_shards": 3}, RunOptions(str(dst / "ids"), str(dst / "dedup"), **opts))
    return run_transform(
        "filter", {"criteria": ["len > 20", "contents NOT LIKE 'alpha%'"]}, RunOptions(str(dst / "dedup"), str(dst / "final"), **opts)
    ).metadata


def test_metadata_conserves_and_describes(tmp_path):
    src = make_corpus(tmp_path / "in")
    meta = chain(src, tmp_path / "o", workers=1)
    on_disk = json.loads((tmp_path / "o" / "final" / "metadata.json").read_text())
    assert on_disk["status"] == "success" and on_disk["transform"] == "filter"
    t = on_disk["totals"]
    assert t["docs_in"] == t["docs_out"] + sum(t["removed"].values()) > 0
    assert set(t["removed"]) <= {"criterion_1", "criterion_2"}
    for rel, f in on_disk["files"].items():
        assert f["docs_in"] == f["docs_out"] + sum(f["removed"].values()), rel
    assert {"python", "pyarrow", "duckdb", "prepline"} <= set(on_disk["versions"])
    assert on_disk["parameters"]["criteria"] == ["len > 20", "contents NOT LIKE 'alpha%'"]
    assert meta["started"] <= meta["ended"]
    assert not (tmp_path / "o" / "final" / "_prepline").exists()  # work state removed on success


# -- bad input ----------------------------------------------------------------------------------


def _untouched(before: dict, root: Path) -> None:
    assert tree_bytes(root) == before


def _no_output(out: Path) -> None:
    assert not out.exists() or not tree_bytes(out), "half-written output left behind"


def test_missing_input_folder(tmp_path):
    with pytest.raises(InputError, match="does not exist") as e:
        run_transform("doc_id", {}, RunOptions(str(tmp_path / "nope"), str(tmp_path / "o")))
    assert "--input" in e.value.fix


def test_empty_folder_and_no_parquet(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="is empty"):
        run_transform("doc_id", {}, RunOptions(str(tmp_path / "empty"), str(tmp_path / "o")))
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "data.csv").write_text("a,b\n")
    with pytest.raises(InputError, match=r"no \.parquet files \(found e\.g\. data\.csv\)"):
        run_transform("doc_id", {}, RunOptions(str(tmp_path / "csv"), str(tmp_path / "o")))
    _no_output(tmp_path / "o")


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"PAR1" + b"\x00garbage" * 50, "empty": b""}[how])


@pytest.mark.parametrize("how, match", [("truncated", "not a readable Parquet"), ("garbage", "not a readable Parquet"), ("empty", "empty \\(0 bytes\\)")])
def test_bad_file_fails_the_run_and_names_it(tmp_path, corpus, how, match):
    _corrupt(corpus / "c.parquet", how)
    before = tree_bytes(corpus)
    out = tmp_path / "o"
    with pytest.raises(RunFailed, match=match) as e:
        run_transform("doc_id", {}, RunOptions(str(corpus), str(out), workers=1))
    assert "c.parquet" in e.value.message and "--max-failed-files" in e.value.fix
    _untouched(before, corpus)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "failed" and "c.parquet" in meta["failures"]


def test_tolerated_failure_is_listed(tmp_path, corpus):
    _corrupt(corpus / "c.parquet", "truncated")
    m = run_transform("doc_id", {}, RunOptions(str(corpus), str(tmp_path / "o"), workers=1, max_failed_files=1)).metadata
    assert m["status"] == "success" and list(m["failures"]) == ["c.parquet"]
    assert m["totals"]["files_failed"] == 1 and m["totals"]["docs_in"] == 8
    assert not (tmp_path / "o" / "c.parquet").exists()


def test_missing_and_mistyped_column(tmp_path):
    write_parquet(tmp_path / "a", "x.parquet", {"text": ["a"]})
    with pytest.raises(InputError, match="column 'contents' is missing \\(columns: text\\)") as e:
        run_transform("doc_id", {}, RunOptions(str(tmp_path / "a"), str(tmp_path / "o")))
    assert "content_column" in e.value.fix
    write_parquet(tmp_path / "b", "x.parquet", {"contents": [1, 2]})
    with pytest.raises(InputError, match="has type int64, expected string"):
        run_transform("doc_id", {}, RunOptions(str(tmp_path / "b"), str(tmp_path / "o")))
    with pytest.raises(InputError, match="column 'doc_id' is missing") as e:
        run_transform("exact_dedup", {}, RunOptions(str(tmp_path / "a"), str(tmp_path / "o"), ), ) if False else run_transform(
            "exact_dedup", {"content_column": "text"}, RunOptions(str(tmp_path / "a"), str(tmp_path / "o")))
    assert "run doc_id first" in e.value.fix
    _no_output(tmp_path / "o")


def test_null_text_is_reported_with_its_row(tmp_path):
    write_parquet(tmp_path / "a", "ok.parquet", {"contents": ["fine"]})
    write_parquet(tmp_path / "a", "z.parquet", {"contents": ["a", None, "c"]})
    with pytest.raises(RunFailed, match=r"z\.parquet: column 'contents' has 1 null value\(s\) \(first at row 1\)") as e:
        run_transform("doc_id", {}, RunOptions(str(tmp_path / "a"), str(tmp_path / "o"), workers=1))
    assert "IS NOT NULL" in e.value.fix


def test_non_utf8_text(tmp_path):
    bad = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(b"\x00\x00\x00\x00\x02\x00\x00\x00\x04\x00\x00\x00"), pa.py_buffer(b"ok\xff\xfe")])
    (tmp_path / "a").mkdir()
    pq.write_table(pa.table({"contents": bad}), tmp_path / "a" / "bad.parquet")
    with pytest.raises(RunFailed, match="bad.parquet: column 'contents' holds text that is not valid UTF-8"):
        run_transform("doc_id", {}, RunOptions(str(tmp_path / "a"), str(tmp_path / "o"), workers=1))


def test_bad_parameters_fail_before_any_output(tmp_path, corpus):
    with pytest.raises(ConfigError, match="unknown parameter"):
        run_transform("doc_id", {"colour": "red"}, RunOptions(str(corpus), str(tmp_path / "o")))
    with pytest.raises(ConfigError, match="not valid SQL"):
        run_transform("filter", {"criteria": ["no_such_col > 1"]}, RunOptions(str(corpus), str(tmp_path / "o")))
    with pytest.raises(ConfigError, match="calls table function read_csv"):
        run_transform("filter", {"criteria": ["(SELECT count(*) FROM read_csv('/etc/passwd')) > 0"]}, RunOptions(str(corpus), str(tmp_path / "o")))
    with pytest.raises(ConfigError, match="one SQL expression only"):
        run_transform("filter", {"criteria": ["1=1; DROP TABLE docs"]}, RunOptions(str(corpus), str(tmp_path / "o")))
    with pytest.raises(ConfigError, match="not a boolean"):
        run_transform("filter", {"criteria": ["n + 1"]}, RunOptions(str(corpus), str(tmp_path / "o")))
    _no_output(tmp_path / "o")


def test_output_inside_input_is_refused(corpus):
    with pytest.raises(ConfigError, match="inside input"):
        run_transform("doc_id", {}, RunOptions(str(corpus), str(corpus / "out")))
    assert not (corpus / "out").exists()


def test_non_empty_output_refused_and_overwrite_deletes_only_a_prepline_output(tmp_path, corpus):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputError, match="not empty") as e:
        run_transform("doc_id", {}, RunOptions(str(corpus), str(out)))
    assert "--overwrite" in e.value.fix and (out / "keep.txt").exists()
    # issue 30 finding 3: --overwrite deleted whatever was there; a folder of other files is refused, listed
    with pytest.raises(OutputError, match="not a prepline output") as e:
        run_transform("doc_id", {}, RunOptions(str(corpus), str(out), overwrite=True))
    assert "keep.txt" in e.value.message and (out / "keep.txt").read_text() == "mine"
    # an earlier prepline output (its metadata.json, even with other parameters) is overwritten, files of it and all
    run_transform("doc_id", {"start_id": 7}, RunOptions(str(corpus), str(tmp_path / "p")))
    (tmp_path / "p" / "stray.txt").write_text("x")
    run_transform("doc_id", {}, RunOptions(str(corpus), str(tmp_path / "p"), overwrite=True))
    assert not (tmp_path / "p" / "stray.txt").exists() and json.loads((tmp_path / "p" / "metadata.json").read_text())["parameters"]["start_id"] == 0
    # a metadata.json that prepline did not write is no licence
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "metadata.json").write_text('{"title": "my dataset"}')
    with pytest.raises(OutputError, match="not a prepline output"):
        run_transform("doc_id", {}, RunOptions(str(corpus), str(tmp_path / "q"), overwrite=True))
    assert (tmp_path / "q" / "metadata.json").read_text() == '{"title": "my dataset"}'
    # an unfinished run (its _prepline/run.json, no metadata.json yet) and an empty folder are fine
    (tmp_path / "u" / "_prepline").mkdir(parents=True)
    (tmp_path / "u" / "_prepline" / "run.json").write_text('{"fingerprint": "x"}')
    (tmp_path / "u" / "part.parquet").write_text("half")
    (tmp_path / "e").mkdir()
    for d in ("u", "e"):
        assert run_transform("doc_id", {}, RunOptions(str(corpus), str(tmp_path / d), overwrite=True)).metadata["status"] == "success"
    assert not (tmp_path / "u" / "part.parquet").exists()


def test_output_that_can_only_be_a_mistake_is_refused_before_anything_is_written(tmp_path, corpus, monkeypatch):
    """Issue 30 finding 3: `--output ""` was the current folder and --overwrite emptied it; "$OUT/" with OUT unset is /."""
    here = tmp_path / "cwd"
    here.mkdir()
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    for empty in ("", "  "):
        with pytest.raises(ConfigError, match="--output is empty") as e:
            run_transform("doc_id", {}, RunOptions(str(corpus), empty, overwrite=True))
        assert e.value.fix
    with pytest.raises(ConfigError, match="--input is empty"):
        run_transform("doc_id", {}, RunOptions("", str(tmp_path / "o"), overwrite=True))
    assert sorted(p.name for p in here.iterdir()) == ["notes.txt"]
    with pytest.raises(ConfigError, match="root of the file system"):  # (no --overwrite here: today's code would try it)
        run_transform("doc_id", {}, RunOptions(str(corpus), "/"))
    assert not Path("/_prepline").exists()
    for same in (str(corpus), str(corpus / "lang=en"), str(tmp_path)):  # the input, inside it, or holding it
        with pytest.raises(ConfigError, match="inside"):
            run_transform("doc_id", {}, RunOptions(str(corpus), same, overwrite=True))
    assert (corpus / "a.parquet").exists()


def test_s3_output_at_a_bucket_root_or_over_other_objects_is_refused(s3_bucket, corpus):
    from prepline.data_access import s3_client

    c = s3_client()
    c.put_object(Bucket=s3_bucket, Key="theirs/data.csv", Body=b"1,2")
    c.put_object(Bucket=s3_bucket, Key="out/report.pdf", Body=b"%PDF")
    for root in (f"s3://{s3_bucket}", f"s3://{s3_bucket}/"):
        with pytest.raises(ConfigError, match="root of a bucket"):
            run_transform("doc_id", {}, RunOptions(str(corpus), root, overwrite=True))
    with pytest.raises(OutputError, match="not a prepline output") as e:
        run_transform("doc_id", {}, RunOptions(str(corpus), f"s3://{s3_bucket}/out", overwrite=True))
    assert "report.pdf" in e.value.message
    keys = sorted(o["Key"] for o in c.list_objects_v2(Bucket=s3_bucket).get("Contents", []))
    assert keys == ["out/report.pdf", "theirs/data.csv"]  # nothing deleted, and the lease released


def test_complete_output_is_not_recomputed(tmp_path, corpus):
    out = tmp_path / "o"
    run_transform("doc_id", {}, RunOptions(str(corpus), str(out)))
    stamp = (out / "a.parquet").stat().st_mtime_ns
    r = run_transform("doc_id", {}, RunOptions(str(corpus), str(out)))
    assert r.resumed and (out / "a.parquet").stat().st_mtime_ns == stamp
    with pytest.raises(OutputError, match="not empty"):  # different parameters: refuse to mix
        run_transform("doc_id", {"start_id": 5}, RunOptions(str(corpus), str(out)))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", "ray"])
def test_a_file_failing_while_others_run_still_writes_metadata_and_a_clear_error(tmp_path, runtime, request):
    """The failure of a small file arrives while a big one is still being processed by another
    worker: the run stops those tasks, writes metadata.json (status failed) and raises RunFailed
    naming the file (Ray refuses force-cancelling actor tasks: that used to escape as ValueError)."""
    if runtime == "ray":
        request.getfixturevalue("ray_session")
    n = 300_000
    write_parquet(tmp_path / "in", "big.parquet", {"contents": [f"document {i} " * 8 for i in range(n)], "doc_id": list(range(n))})
    (tmp_path / "in" / "small.parquet").write_bytes(b"PAR1 not parquet at all")
    out = tmp_path / "out"
    with pytest.raises(RunFailed, match="small.parquet"):
        run_transform("exact_dedup", {}, RunOptions(str(tmp_path / "in"), str(out), runtime=runtime, workers=2))
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "failed" and list(meta["failures"]) == ["small.parquet"]


def test_unfinished_run_with_other_parameters_is_not_mixed(tmp_path, corpus):
    ids = tmp_path / "ids"
    run_transform("doc_id", {}, RunOptions(str(corpus), str(ids)))
    out = tmp_path / "out"
    (out / "_prepline").mkdir(parents=True)
    (out / "_prepline" / "run.json").write_text(json.dumps({"fingerprint": "something-else"}))
    with pytest.raises(OutputError, match="unfinished run with other input or parameters"):
        run_transform("exact_dedup", {}, RunOptions(str(ids), str(out)))


def test_metadata_records_peak_memory_and_the_work_folder_without_touching_markers(tmp_path):
    """The driver's and the workers' peak RSS and the temporary files of a global stage are in the
    totals (and per phase); the markers a resume reads and the per-file results stay as they were."""
    from prepline.api import read_metadata

    src = make_corpus(tmp_path / "in", files=4)
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "ids"), workers=1))
    meta = run_transform("exact_dedup", {"num_shards": 3}, RunOptions(str(tmp_path / "ids"), str(tmp_path / "d"), workers=2)).metadata
    t = meta["totals"]
    assert 30 < t["driver_peak_rss_mib"] < 4096 and 30 < t["worker_peak_rss_mib"] < 4096
    assert {p: "worker_peak_rss_mib" in ph for p, ph in meta["phases"].items()} == {"hash": True, "reduce": True, "final": True}
    assert t["worker_peak_rss_mib"] == max(ph["worker_peak_rss_mib"] for ph in meta["phases"].values())
    # the hash phase's shard files and every phase's markers: counted, then deleted with the work folder
    assert t["work_files"] >= 4 + 3 + 4 and t["work_bytes"] > 1000 and not (tmp_path / "d" / "_prepline").exists()
    assert not any("_peak_rss" in json.dumps(f) for f in meta["files"].values())
    m = read_metadata(str(tmp_path / "d"))
    assert m.totals.worker_peak_rss_mib == t["worker_peak_rss_mib"] and m.totals.work_bytes == t["work_bytes"]

