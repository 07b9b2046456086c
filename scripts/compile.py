#!/usr/bin/env python
"""Compile every component and pipeline from the registry into compiled/ (deleting stale files).

    .venv/bin/python scripts/compile.py          # rewrite compiled/
    .venv/bin/python scripts/compile.py --check  # exit 1 if compiled/ differs from the sources
"""

import sys
from pathlib import Path

from prepline.gentree import script_main
from prepline.kfp.compile import sync_compiled

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    sys.exit(script_main(__doc__, "compiled/", "scripts/compile.py", lambda check: sync_compiled(ROOT / "compiled", check=check)))
