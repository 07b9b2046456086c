#!/usr/bin/env python
"""Compile every component and pipeline from the registry into compiled/ (deleting stale files).

    .venv/bin/python scripts/compile.py          # rewrite compiled/
    .venv/bin/python scripts/compile.py --check  # exit 1 if compiled/ differs from the sources
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on any difference")
    a = ap.parse_args()
    from prepline.kfp_cli import sync_compiled

    diffs = sync_compiled(ROOT / "compiled", check=a.check)
    for d in diffs:
        print(d)
    if a.check and diffs:
        print("compiled/ is stale: run scripts/compile.py", file=sys.stderr)
        return 1
    print("compiled/ is up to date" if not diffs else f"compiled/: {len(diffs)} file(s) written or removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
