"""Docs that cannot rot: every shell block of README.md and docs/ either runs here or says why not.

A shell block is a fenced block labelled ``bash``/``sh``/``shell``/``console``, or an unlabelled one
with a ``$ `` prompt line or that starts with a command (``prepline``, ``python``, ...). The line(s) just before a block may hold one marker, an HTML comment that
renders as nothing:

- ``<!-- docs-test: not run: <reason> -->``: not run (needs a cluster, a server, minutes of work...);
- ``<!-- docs-test: covered by tests/<file>.py::<test> -->``: another test runs what it shows (the
  test must exist);
- ``<!-- docs-test: expect error -->``: it runs and must fail with the ``error:`` line it shows.

Any other block runs. A page's runnable blocks run in order, in one temporary folder per page that
looks like a checkout (the repository's folders linked in: ``tests/``, ``scripts/``, ``.venv``...),
with ``bash -eo pipefail`` and ``prepline`` of this checkout on ``PATH``. A page may say what its
blocks expect to exist first, in a comment the reader does not see::

    <!-- docs-test: setup
    prepline sample --output data/sample --docs 300
    -->

Placeholders are ``<name>`` in angle brackets; a block that has one runs only when the page binds
it, ``<!-- docs-test: let <run id> = $(ls runs/pipeline/stages) -->`` (a shell word, evaluated in
the page's folder just before the block runs). In a ``$ `` block only the prompt lines (and their
``\\`` continuation lines) are commands; the rest is the output it shows.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
SHELL_LANGS = {"bash", "sh", "shell", "console"}
#: pages another branch rewrites (issue 24: docs/cluster.md, docs/compatibility.md); their blocks
#: get markers when the branches meet. Remove a page from here once its blocks are marked.
PENDING_PAGES: set[str] = set()

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->", re.S)
_PLACEHOLDER = re.compile(r"<[A-Za-z][\w .-]*>")


@dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str
    marker: str = ""  # the docs-test marker just before the block, if any
    lets: dict[str, str] = field(default_factory=dict)  # placeholders bound before this block

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def commands(self) -> str:
        """The shell text to run: the whole block, or a $-block's prompt lines and their continuations."""
        lines = self.text.splitlines()
        if not any(ln.startswith("$ ") for ln in lines):
            return self.text
        out, more = [], False
        for ln in lines:
            if ln.startswith("$ ") or more:
                out.append(ln[2:] if ln.startswith("$ ") and not more else ln)
                more = ln.rstrip().endswith("\\")
        return "\n".join(out) + "\n"

    def shown_error(self) -> str:
        return next((ln.strip() for ln in self.text.splitlines() if ln.startswith("error:")), "")


#: the first word of a command line in an unlabelled block
_COMMANDS = ("prepline", "python", ".venv/bin/", "bash", "pip", "for", "cd", "export", "mkdir")


def is_shell(lang: str, text: str) -> bool:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lang in SHELL_LANGS or (not lang and bool(lines) and (any(ln.startswith("$ ") for ln in lines)
                                                                 or lines[0].startswith(_COMMANDS)))


def page_blocks(page: str) -> tuple[list[Block], str]:
    """The page's shell blocks (with their markers and the placeholders bound before them) and its setup."""
    text = (ROOT / page).read_text()
    setup = "\n".join(m.group(1)[len("setup"):] for m in _MARK.finditer(text) if m.group(1).startswith("setup"))
    blocks, lets, pos = [], {}, 0
    for m in _FENCE.finditer(text):
        before = text[pos:m.start()]
        pos = m.end()
        for mark in _MARK.finditer(before):
            if mark.group(1).startswith("let "):
                name, _, expr = mark.group(1)[4:].partition("=")
                lets[name.strip()] = expr.strip()
        lang, body = m.group(1), m.group(2)
        if not is_shell(lang, body):
            continue
        tail = before.rstrip().rsplit("\n", 1)[-1].strip()  # the line just before the fence
        marker = _MARK.fullmatch(tail).group(1) if _MARK.fullmatch(tail) else ""
        blocks.append(Block(page, text[:m.start()].count("\n") + 1, lang, body, marker, dict(lets)))
    return blocks, setup


def _kind(b: Block) -> str:
    if b.marker.startswith("not run:"):
        return "not run"
    if b.marker.startswith("covered by "):
        return "covered"
    if b.marker == "expect error":
        return "error"
    return "run"


ALL = [b for p in PAGES for b in page_blocks(p)[0]]


@pytest.mark.parametrize("block", [b for b in ALL if b.page not in PENDING_PAGES], ids=lambda b: b.where)
def test_every_shell_block_is_run_or_says_why_not(block):
    assert block.marker == "" or _kind(block) != "run", f"{block.where}: unknown docs-test marker {block.marker!r}"
    if _kind(block) == "not run":
        assert len(block.marker[len("not run:"):].strip()) >= 8, f"{block.where}: say why it is not run"
    if _kind(block) == "covered":
        target = block.marker[len("covered by "):].strip()
        path, _, test = target.partition("::")
        assert (ROOT / path).is_file() and re.search(rf"^def {re.escape(test)}\(", (ROOT / path).read_text(), re.M), \
            f"{block.where}: {target} does not exist"
    if _kind(block) in ("run", "error"):
        missing = sorted(set(_PLACEHOLDER.findall(block.commands())) - set(block.lets))
        assert not missing, f"{block.where}: placeholder(s) {missing} not bound by a docs-test let marker (or mark the block)"


def _env(folder: Path) -> dict:
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", HF_HUB_OFFLINE="1",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PREPLINE_LOCAL_CLUSTERS=str(folder / ".clusters"), COLUMNS="160",
               PREPLINE_PROGRESS_INTERVAL="60")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _bash(script: str, folder: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _bind(b: Block) -> str:
    """The block's commands with its placeholders replaced by shell variables set just before."""
    cmds, head = b.commands(), []
    for i, (name, expr) in enumerate(b.lets.items()):
        if name in cmds:
            head.append(f"__ph{i}={expr}")
            cmds = cmds.replace(name, f"${{__ph{i}}}")
    return "\n".join(head + [cmds])


#: what a page's folder links from the repository, so that commands run as from a checkout
CHECKOUT = (".venv", "src", "tests", "scripts", "compiled", "elyra_templates", "pipelines", "transforms", "components",
            "runtime_images", "deploy", "benchmarks", "pyproject.toml")

RUN_PAGES = [p for p in PAGES if p not in PENDING_PAGES and any(_kind(b) in ("run", "error") for b in page_blocks(p)[0])]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_commands_of_a_page_run_as_written(page, tmp_path):
    blocks, setup = page_blocks(page)
    env = _env(tmp_path)
    for name in CHECKOUT:
        if (ROOT / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    if setup.strip():
        r = _bash(setup, tmp_path, env)
        assert r.returncode == 0, f"{page}: its docs-test setup failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    for b in blocks:
        kind = _kind(b)
        if kind not in ("run", "error"):
            continue
        r = _bash(_bind(b), tmp_path, env)
        out = r.stdout + r.stderr
        if kind == "error":
            assert r.returncode != 0, f"{b.where}: was shown failing, but succeeded:\n{out[-2000:]}"
            shown = b.shown_error()
            got = next((ln.strip() for ln in out.splitlines() if ln.startswith("error:")), "")
            assert shown and got.startswith(shown[:60]), f"{b.where}: shows {shown!r}, printed {got!r}"
            assert "Traceback" not in out
        else:
            assert r.returncode == 0, f"{b.where} failed (exit {r.returncode}):\n{b.commands()}\n{out[-3000:]}"
            assert "Traceback" not in out, f"{b.where}:\n{out[-3000:]}"


def test_the_markers_setup_and_placeholders_are_understood(tmp_path):
    """The page format above, on a page written here: markers, a setup, a bound placeholder, a
    $-block's prompt and continuation lines, an unlabelled command block."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: setup\nmkdir -p runs/stages/abc\n-->\n"
        "```bash\necho one > a.txt\n```\n\n"
        "<!-- docs-test: not run: needs a cluster somewhere -->\n```bash\nkubectl apply -f x\n```\n"
        "<!-- docs-test: let <run id> = $(ls runs/stages) -->\n"
        "```\n$ cat a.txt \\\n    > runs/stages/<run id>/copy.txt\nthe output\n$ ls runs/stages/<run id>\ncopy.txt\n```\n"
        "```\nprepline list\n```\n```\nnot a command\n```\n")
    blocks, setup = page_blocks(str(page))
    assert [(_kind(b), b.lang) for b in blocks] == [("run", "bash"), ("not run", "bash"), ("run", ""), ("run", "")]
    assert setup.strip() == "mkdir -p runs/stages/abc"
    assert blocks[2].commands() == "cat a.txt \\\n    > runs/stages/<run id>/copy.txt\nls runs/stages/<run id>\n"
    env = _env(tmp_path)
    assert _bash(setup, tmp_path, env).returncode == 0
    for b in (blocks[0], blocks[2]):
        r = _bash(_bind(b), tmp_path, env)
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "runs" / "stages" / "abc" / "copy.txt").read_text() == "one\n" and r.stdout == "copy.txt\n"
