"""Flags as a new user types them (issue 25, item 8): a boolean takes the bare flag, --help lists the
choices, a list parameter and a wrong type say the syntax to use."""

import json

import pytest

from prepline.cli import main


def test_a_bare_boolean_flag_means_true_and_a_value_still_works(tmp_path, corpus, capsys):
    out = tmp_path / "o"
    assert main(["run", "lang_id", "--input", str(corpus), "--output", str(out), "--split", "--languages", "en", "--no-progress"]) == 0
    assert json.loads((out / "metadata.json").read_text())["parameters"]["split"] is True
    out2 = tmp_path / "o2"
    assert main(["run", "lang_id", "--input", str(corpus), "--output", str(out2), "--split", "false", "--no-progress"]) == 0
    assert json.loads((out2 / "metadata.json").read_text())["parameters"]["split"] is False


def test_run_help_lists_choices_and_the_list_syntax(capsys):
    with pytest.raises(SystemExit):
        main(["run", "ingest", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "one of: resiliparse, trafilatura" in out
    with pytest.raises(SystemExit):
        main(["run", "lang_id", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--split alone means true" in out
    assert "--languages a --languages b" in out and "--languages '[\"a\", \"b\"]'" in out


def test_one_json_list_for_a_list_option(tmp_path, corpus):
    out = tmp_path / "o"
    assert main(["run", "lang_id", "--input", str(corpus), "--output", str(out), "--languages", '["en", "ja"]', "--split", "--no-progress"]) == 0
    assert json.loads((out / "metadata.json").read_text())["parameters"]["languages"] == ["en", "ja"]


def test_a_wrong_type_says_what_to_pass_in_words(tmp_path, corpus, capsys):
    assert main(["run", "doc_id", "--input", str(corpus), "--output", str(tmp_path / "o"), "--start-id", "x"]) == 2
    err = capsys.readouterr().err
    assert "pass a int" not in err and "fix: pass start_id as a whole number" in err
