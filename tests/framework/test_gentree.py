"""The shared sync/--check logic of the generated trees (compiled/, elyra_templates/, docs)."""

from prepline.gentree import script_main, sync_tree, write_files


def test_check_reports_without_writing_and_sync_repairs(tmp_path, capsys):
    target = tmp_path / "t"
    (target / "sub").mkdir(parents=True)
    (target / "sub" / "a.yaml").write_text("old\n")
    (target / "sub" / "gone.yaml").write_text("x\n")
    (target / "README.md").write_text("hand-written\n")  # not matched by the patterns: left alone
    gen = write_files({"sub/a.yaml": "new\n", "sub/b.yaml": "b\n", "README.md": "generated\n"})
    pats = ["sub/*.yaml"]
    want = ["missing: sub/b.yaml", "stale: sub/gone.yaml", "changed: sub/a.yaml"]
    assert sync_tree(gen, target, pats, check=True) == want
    assert not (target / "sub" / "b.yaml").exists() and (target / "sub" / "a.yaml").read_text() == "old\n"
    assert sync_tree(gen, target, pats) == want
    assert sync_tree(gen, target, pats, check=True) == []
    assert sorted(p.name for p in (target / "sub").iterdir()) == ["a.yaml", "b.yaml"]
    assert (target / "README.md").read_text() == "hand-written\n"
    assert sync_tree(gen, tmp_path / "new", pats, check=True) == ["missing: sub/a.yaml", "missing: sub/b.yaml"]


def test_script_main_exit_codes(tmp_path, capsys):
    assert script_main("doc", "x/", "gen.py", lambda check: ["changed: a"], ["--check"]) == 1
    assert "x/ is stale: run gen.py" in capsys.readouterr().err
    assert script_main("doc", "x/", "gen.py", lambda check: ["changed: a"], []) == 0
    assert "1 file(s) written" in capsys.readouterr().out
    assert script_main("doc", "x/", "gen.py", lambda check: [], ["--check"]) == 0
