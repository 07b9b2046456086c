#!/usr/bin/env python
"""Generate docs/parameters.md from the transforms' config dataclasses (--check: fail if stale)."""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "parameters.md"


def render() -> str:
    from prepline import registry
    from prepline.cli import describe_markdown

    head = ("# Transform parameters\n\nGenerated from the config dataclasses by `scripts/gen_docs.py`; "
            "a test keeps it in sync. `prepline describe <transform>` prints the same table.\n\n")
    return head + "\n".join(describe_markdown(n) for n in registry.names())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    text = render()
    if a.check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print("docs/parameters.md is stale: run scripts/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
