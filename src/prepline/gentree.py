"""Generated, committed trees (compiled/, elyra_templates/, docs/parameters.md): regenerate into a
temporary folder, compare with what is committed, and (unless only checking) bring it up to date.

One home for the "sync or --check" logic that ``scripts/compile.py``, ``scripts/gen_elyra.py``,
``scripts/gen_docs.py`` and ``prepline compile`` share.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

#: writes every generated file under the folder it is given
Generator = Callable[[Path], object]


def _files(root: Path, patterns: Iterable[str]) -> set[str]:
    if not root.exists():
        return set()
    return {p.relative_to(root).as_posix() for pat in patterns for p in root.glob(pat) if p.is_file()}


def sync_tree(generate: Generator, target: Path, patterns: Iterable[str], check: bool = False) -> list[str]:
    """Generate into a temporary folder and compare the files matching ``patterns`` with ``target``
    (other files there, e.g. a hand-written README, are left alone). Unless ``check``, write the
    missing and changed files and delete the stale ones. Returns the differences, sorted within
    each kind: ``missing: <rel>``, ``stale: <rel>``, ``changed: <rel>``."""
    patterns = list(patterns)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        new, old = _files(fresh, patterns), _files(target, patterns)
        diffs = [f"missing: {n}" for n in sorted(new - old)] + [f"stale: {n}" for n in sorted(old - new)]
        diffs += [f"changed: {n}" for n in sorted(new & old) if not filecmp.cmp(fresh / n, target / n, shallow=False)]
        if not check and diffs:
            for n in old - new:
                (target / n).unlink()
            for n in new:
                (target / n).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(fresh / n, target / n)
    return diffs


#: what a difference became once the files are written
_WRITTEN = {"missing": "written", "changed": "updated", "stale": "removed"}


def as_written(diffs: list[str]) -> list[str]:
    """:func:`sync_tree`'s differences as what writing did (``missing: a`` -> ``written: a``)."""
    out = []
    for d in diffs:
        kind, sep, rest = d.partition(": ")
        out.append(f"{_WRITTEN.get(kind, kind)}{sep}{rest}")
    return out


def write_files(files: dict[str, str]) -> Generator:
    """A generator for :func:`sync_tree` from ``{relative path: text}``."""

    def gen(root: Path) -> None:
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)

    return gen


def script_main(doc: str, label: str, script: str, sync: Callable[[bool], list[str]], argv: list[str] | None = None) -> int:
    """The command line of a generator script: rewrite ``label`` (or, with --check, exit 1 if stale)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on any difference")
    a = ap.parse_args(argv)
    diffs = sync(a.check)
    for d in (diffs if a.check else as_written(diffs)):
        print(d)
    if a.check and diffs:
        print(f"{label} is stale: run {script}", file=sys.stderr)
        return 1
    print(f"{label} is up to date" if not diffs else f"{label}: {len(diffs)} file(s) written or removed")
    return 0
