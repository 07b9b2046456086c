"""Docs generated from the code stay in sync with it; the map pages name what exists."""

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_parameter_docs_are_generated_from_the_configs():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_readme_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```")]
    assert [l.split("#")[0].strip() for l in block] == ["bash scripts/main.sh", "bash scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci


MAP_PAGES = ["docs/architecture.md", "docs/adding_a_transform.md"]
_PATH_LIKE = re.compile(r"^[\w.\-]+(/[\w.\-<>*]*)+$|^[\w\-]+\.(py|md|toml|yaml|sh)$")


@pytest.mark.parametrize("page", MAP_PAGES)
def test_the_files_and_names_a_map_page_mentions_exist(page):
    """Every file or folder of the repository in `backticks` exists (`<name>` parts match at least one
    file; what a run writes is named from `<output>/`) and every dotted prepline name (module, or
    module attribute) resolves."""
    text = (ROOT / page).read_text()
    paths = [t for t in re.findall(r"`([^`\s]+)`", text)
             if _PATH_LIKE.match(t) and not t.startswith(("prepline.", "<output>"))]
    assert len(paths) >= 10, paths
    for t in paths:
        pattern = re.sub(r"<[^>]+>", "*", t).rstrip("/")
        assert list(ROOT.glob(pattern)), f"{page} names {t}, which does not exist"
    names = sorted(set(re.findall(r"\bprepline(?:\.\w+)+", text)))
    assert len(names) >= 5, names
    for name in names:
        assert _resolves(name), f"{page} names {name}, which does not resolve"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_example_transform_of_adding_a_transform_runs(tmp_path):
    """The page's example, as written, registers and runs through the engine with its counts."""
    text = (ROOT / "docs" / "adding_a_transform.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    code = example + (
        "\nimport sys, json\nimport pyarrow as pa, pyarrow.parquet as pq\n"
        "from prepline.engine import RunOptions, run_transform\n"
        "src, out = sys.argv[1], sys.argv[2]\n"
        "pq.write_table(pa.table({'contents': ['one two three', 'one', '', 'a b']}), src + '/a.parquet')\n"
        "m = run_transform('word_count', {'min_words': 2}, RunOptions(src, out, workers=1, progress=False)).metadata\n"
        "print(json.dumps([m['totals'], pq.read_table(out + '/a.parquet').to_pydict()]))\n"
    )
    (tmp_path / "in").mkdir()
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "in"), str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    totals, table = json.loads(r.stdout.strip().splitlines()[-1])
    assert table == {"contents": ["one two three", "a b"], "n_words": [3, 2]}
    assert totals["docs_in"] == 4 and totals["docs_out"] == 2 and totals["removed"] == {"too_short": 2}


def test_the_compatibility_table_is_the_code():
    from prepline.compat import table_markdown

    assert table_markdown() in (ROOT / "docs" / "compatibility.md").read_text()


def _blocks(text: str) -> list[tuple[str, str]]:
    """The fenced blocks of a page, in order: (language, body)."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M)


def test_the_python_api_page_runs_as_written(tmp_path):
    """docs/python_api.md: its python blocks, run in order in one interpreter, print what the plain
    block after each says."""
    blocks = _blocks((ROOT / "docs" / "python_api.md").read_text())
    pairs = [(code, out) for (lang, code), (nxt, out) in zip(blocks, blocks[1:]) if lang == "python" and nxt == ""]
    assert len(pairs) == len([b for b in blocks if b[0] == "python"]) >= 5
    marker = "print('@@block')\n"
    r = subprocess.run([sys.executable, "-c", "".join(marker + code for code, _ in pairs)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    printed = r.stdout.split("@@block\n")[1:]
    assert printed == [out for _, out in pairs]


def test_the_plugins_page_shows_the_tested_plugin():
    """docs/plugins.md shows tests/plugins/char_count_plugin's files as they are (tests/framework/test_plugins.py runs it)."""
    blocks = dict((lang, body) for lang, body in _blocks((ROOT / "docs" / "plugins.md").read_text()) if lang in ("toml", "python"))
    plugin = ROOT / "tests" / "plugins" / "char_count_plugin"
    assert blocks["toml"] == (plugin / "pyproject.toml").read_text()
    assert blocks["python"] == (plugin / "prepline_char_count.py").read_text()


def test_the_cluster_path_starts_with_building_and_pushing_the_images():
    """Issue 25 item 10: README's cluster section and docs/kfp.md say first that the images must be
    built and pushed, then compiled for that registry, before anything is uploaded."""
    for page, section in (("README.md", "## On Kubernetes"), ("docs/kfp.md", "## Step 1")):
        text = (ROOT / page).read_text()
        body = text[text.index(section):]
        push = body.index("scripts/build_images.sh --registry")
        assert "--push" in body[push:push + 200]
        assert push < body.index("prepline compile --registry") < re.search(r"upload `?compiled/", body, re.I).start()
        assert "cluster-ready" not in text


def test_pipeline_parameters_say_what_input_path_takes_and_which_are_internal():
    from prepline.stage_params import PARAMS

    assert "JSONL" in PARAMS["input_path"].help and "WARC" in PARAMS["input_path"].help
    for name in ("branch", "input_stage", "input_from_split", "from_plan", "run_id"):
        assert PARAMS[name].help.startswith("Internal"), name
    compiled = (ROOT / "compiled" / "pipelines" / "ingest.yaml").read_text()
    assert "JSONL" in compiled and "Internal (set by the super pipeline)" in compiled
