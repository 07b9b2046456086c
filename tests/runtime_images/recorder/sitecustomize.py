"""Put on PYTHONPATH by tests/runtime_images/test_image_contents.py: every Python process of a step
(and its subprocesses, which inherit the environment) appends the top-level modules it imported, with
the file each was loaded from, to $PREPLINE_IMPORT_LOG when it exits."""

import atexit
import os
import sys

_LOG = os.environ.get("PREPLINE_IMPORT_LOG")


def _dump() -> None:
    lines = set()
    for name, mod in list(sys.modules.items()):
        if name and "." not in name:
            lines.add(f"{name}\t{getattr(mod, '__file__', None) or ''}")
    with open(_LOG, "a") as f:
        f.write("\n".join(sorted(lines)) + "\n")


if _LOG:
    atexit.register(_dump)
