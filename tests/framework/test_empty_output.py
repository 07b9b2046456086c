"""A stage that removes every document of a non-empty input fails, naming the reasons, unless an empty
output is allowed (issue 25: a wrong JSONL text field once reported `1,002 in → 0 out` and exit 0)."""

import json

from prepline.cli import main
from prepline.engine import RunOptions, run_transform
from prepline.errors import RunFailed


def _jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_filter_removing_everything_fails_with_the_reason_and_exit_1(tmp_path, corpus, capsys):
    out = tmp_path / "o"
    rc = main(["run", "filter", "--input", str(corpus), "--output", str(out), "--criteria", "length(contents) > 100000", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "error: filter removed all 10 input documents (removed: length(contents) > 100000 10): the output is empty" in err
    assert "--allow-empty-output" in err and "Traceback" not in err
    assert json.loads((out / "metadata.json").read_text())["status"] == "failed"
    # the same command again fails the same way (it does not turn into "already complete")
    assert main(["run", "filter", "--input", str(corpus), "--output", str(out), "--criteria", "length(contents) > 100000", "--no-progress"]) == 1
    capsys.readouterr()
    # allowed: the rerun resumes and succeeds with an empty output
    assert main(["run", "filter", "--input", str(corpus), "--output", str(out), "--criteria", "length(contents) > 100000",
                 "--no-progress", "--allow-empty-output"]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "success" and meta["totals"]["docs_out"] == 0 and meta["options"]["allow_empty_output"] is True


def test_an_empty_input_and_a_partial_removal_are_not_refused(tmp_path, corpus):
    meta = run_transform("filter", {"criteria": ["length(contents) > 3"]}, RunOptions(str(corpus), str(tmp_path / "o"), progress=False)).metadata
    assert 0 < meta["totals"]["docs_out"] < meta["totals"]["docs_in"]


def test_ingest_where_the_text_field_is_only_sometimes_missing_fails_when_every_record_is_removed(tmp_path):
    """Records that have the field, but never as text: every one removed, the run fails naming text_field."""
    _jsonl(tmp_path / "in" / "a.jsonl", [{"text": None, "body": f"doc {i}"} for i in range(3)])
    try:
        run_transform("ingest", {}, RunOptions(str(tmp_path / "in"), str(tmp_path / "o"), progress=False))
    except RunFailed as e:
        assert "ingest removed all 3 input documents (removed: no_text 3)" in e.message
        assert "set text_field" in e.fix and "--allow-empty-output" in e.fix
    else:
        raise AssertionError("an ingest that removed every record succeeded")


def test_ingest_jsonl_with_a_wrong_text_field_fails_at_once_naming_the_fields(tmp_path, capsys):
    _jsonl(tmp_path / "in" / "a.jsonl", [{"content": f"document number {i} of the test", "id": i} for i in range(1002)])
    rc = main(["run", "ingest", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"), "--text-field", "body", "--no-progress"])
    err = capsys.readouterr().err
    assert rc != 0, err
    assert "no field 'body' in its first 1,000 records (fields: content, id)" in err
    assert "--text-field content" in err and "text_field=content" in err and "Traceback" not in err
    # a short file: every record checked
    _jsonl(tmp_path / "in2" / "a.jsonl", [{"content": "x y z"}] * 3)
    assert main(["run", "ingest", "--input", str(tmp_path / "in2"), "--output", str(tmp_path / "o2"), "--no-progress"]) != 0
    assert "no field 'text' in any of its 3 records (fields: content)" in capsys.readouterr().err


def test_the_python_api_takes_allow_empty_output(tmp_path, corpus):
    import prepline

    try:
        prepline.run("filter", str(corpus), str(tmp_path / "o"), criteria=["1=0"])
    except RunFailed as e:
        assert "filter removed all 10 input documents" in e.message
    else:
        raise AssertionError("an empty output passed")
    m = prepline.run("filter", str(corpus), str(tmp_path / "o"), criteria=["1=0"], allow_empty_output=True)
    assert m.totals.docs_out == 0 and m.totals.docs_in == 10
