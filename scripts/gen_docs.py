#!/usr/bin/env python
"""Generate docs/parameters.md from the transforms' config dataclasses.

    .venv/bin/python scripts/gen_docs.py          # rewrite docs/parameters.md
    .venv/bin/python scripts/gen_docs.py --check  # exit 1 if it differs from the sources
"""

import sys
from pathlib import Path

from prepline.gentree import script_main, sync_tree, write_files

ROOT = Path(__file__).resolve().parents[1]


def render() -> str:
    from prepline import registry
    from prepline.cli import describe_markdown

    head = ("# Transform parameters\n\nGenerated from the config dataclasses by `scripts/gen_docs.py`; "
            "a test keeps it in sync. `prepline describe <transform>` prints the same table.\n\n")
    return head + "\n".join(describe_markdown(n) for n in registry.names())


def sync(check: bool) -> list[str]:
    return sync_tree(write_files({"parameters.md": render()}), ROOT / "docs", ["parameters.md"], check=check)


if __name__ == "__main__":
    sys.exit(script_main(__doc__, "docs/parameters.md", "scripts/gen_docs.py", sync))
