"""Docs generated from the code stay in sync with it."""

import subprocess
import sys
from pathlib import Path

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


def test_the_compatibility_table_is_the_code():
    from prepline.compat import table_markdown

    assert table_markdown() in (ROOT / "docs" / "compatibility.md").read_text()
