#!/usr/bin/env python
"""Generate the Elyra catalog and .pipeline templates (elyra_templates/) from the registry.

    .venv/bin/python scripts/gen_elyra.py          # rewrite the generated files of elyra_templates/
    .venv/bin/python scripts/gen_elyra.py --check  # exit 1 if they differ from the sources
"""

import sys
from pathlib import Path

from prepline.elyra_pipeline import sync
from prepline.gentree import script_main

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    sys.exit(script_main(__doc__, "elyra_templates/", "scripts/gen_elyra.py", lambda check: sync(ROOT / "elyra_templates", check=check)))
