#!/usr/bin/env python
"""Generate the Elyra catalog and .pipeline templates (elyra_templates/) from the registry.

    .venv/bin/python scripts/gen_elyra.py          # rewrite the generated files of elyra_templates/
    .venv/bin/python scripts/gen_elyra.py --check  # exit 1 if they differ from the sources
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on any difference")
    a = ap.parse_args()
    from prepline.elyra import sync

    diffs = sync(ROOT / "elyra_templates", check=a.check)
    for d in diffs:
        print(d)
    if a.check and diffs:
        print("elyra_templates/ is stale: run scripts/gen_elyra.py", file=sys.stderr)
        return 1
    print("elyra_templates/ is up to date" if not diffs else f"elyra_templates/: {len(diffs)} file(s) written or removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
