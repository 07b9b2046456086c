#!/usr/bin/env python
"""Generate the parameter tables in the docs from the transforms' config dataclasses, and docs/scale.md's
sizing table from prepline.sizing (what `prepline plan` prints).

docs/parameters.md holds every transform's table; each transform's page docs/transforms/<name>.md
holds its own under "## Parameters" (the rest of the page is written by hand; a transform without
a page gets a short one to fill in).

    .venv/bin/python scripts/gen_docs.py          # rewrite the tables
    .venv/bin/python scripts/gen_docs.py --check  # exit 1 if any differs from the sources

The repository's docs cover the built-in transforms only: installed plug-ins never reach them.
A plug-in's tables go to another folder (docs/plugins.md)::

    .venv/bin/python scripts/gen_docs.py --plugins --docs my_plugin/docs
"""

import sys
from pathlib import Path

from prepline.gentree import script_main, sync_tree, write_files

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Parameters\n"


def render(names: list[str]) -> str:
    from prepline.cli import describe_markdown

    head = ("# Transform parameters\n\nGenerated from the config dataclasses by `scripts/gen_docs.py`; "
            "a test keeps it in sync. `prepline describe <transform>` prints the same table.\n\n")
    return head + "\n".join(describe_markdown(n) for n in names)


def render_page(name: str, text: str | None) -> str:
    """The page with its parameter section's first table (and the table's '### name' heading and
    summary line) replaced by the current one; text after the table is kept."""
    from prepline import registry
    from prepline.cli import describe_markdown

    table = describe_markdown(name)
    if text is None:
        text = f"# {name}\n\n{registry.get(name).summary}.\n\n"
    if HEADING not in text:
        return text.rstrip("\n") + f"\n\n{HEADING}\n{table}"
    head, _, section = text.partition(HEADING)
    lines = section.splitlines(keepends=True)
    first = next((i for i, ln in enumerate(lines) if ln.startswith("|")), None)
    if first is None or any(ln.startswith("## ") for ln in lines[:first]):
        return f"{head}{HEADING}\n{table}\n{section.lstrip(chr(10))}"
    end = first
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    rest = "".join(lines[end:]).lstrip("\n")
    return f"{head}{HEADING}\n{table}" + (f"\n{rest}" if rest else "")


def files(names: list[str], docs: Path = ROOT / "docs") -> dict[str, str]:
    out = {"parameters.md": render(names)}
    for name in names:
        page = docs / "transforms" / f"{name}.md"
        out[f"transforms/{name}.md"] = render_page(name, page.read_text() if page.is_file() else None)
    return out


def render_tables(docs: Path, check: bool = False, plugins: bool = False) -> list[str]:
    """Bring ``docs``'s parameters.md and transforms/<name>.md up to date: the built-in transforms'
    tables, or with ``plugins`` the installed plug-ins' instead; returns the differences."""
    from prepline import registry

    builtins = registry.builtin_names()
    names = sorted(set(registry.names()) - set(builtins)) if plugins else builtins
    generated = files(names, docs)
    patterns = ["parameters.md", "transforms/*.md"]
    if not plugins:  # docs/scale.md's sizing table, from prepline.sizing (`prepline plan`)
        from prepline.sizing import render_scale_doc

        page = docs / "scale.md"
        generated["scale.md"] = render_scale_doc(page.read_text() if page.is_file() else "# Scale\n")
        patterns.append("scale.md")
    return sync_tree(write_files(generated), docs, patterns, check=check)


def sync(check: bool) -> list[str]:
    return render_tables(ROOT / "docs", check=check)


if __name__ == "__main__":
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--docs", type=Path, default=None, help="write into this folder instead of the repository's docs/")
    extra.add_argument("--plugins", action="store_true", help="the installed plug-in transforms' tables (never into docs/)")
    opts, rest = extra.parse_known_args()
    if opts.docs is None and opts.plugins:
        sys.exit("error: --plugins needs --docs <folder>: the repository's docs/ cover the built-in transforms only")
    target = opts.docs or ROOT / "docs"
    sys.exit(script_main(__doc__, f"the parameter tables in {target}", "scripts/gen_docs.py",
                         lambda check: render_tables(target, check=check, plugins=opts.plugins), rest))
