"""Run ``prepline run synthesize ...`` and SIGKILL the process right after its N-th partition is
checkpointed (synthesize's work folder, ``synthesize/<file>/<row>.json``): no handler, no cleanup.

    python kill_at_partition.py N -- run synthesize --input ... --output ... --workers 1

Exits 3 if the run ended before that point.
"""

from __future__ import annotations

import os
import signal
import sys


def arm(n: int) -> None:
    from prepline.data_access import LocalLocation

    state = {"parts": 0}
    write_bytes = LocalLocation.write_bytes

    def write(self, rel, data):
        result = write_bytes(self, rel, data)
        if rel.startswith("synthesize/") and rel.endswith(".json"):
            state["parts"] += 1
            if state["parts"] >= n:
                os.kill(os.getpid(), signal.SIGKILL)
        return result

    LocalLocation.write_bytes = write


if __name__ == "__main__":
    n, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: kill_at_partition.py N -- <prepline arguments>"
    arm(int(n))
    from prepline.cli import main

    main(argv)
    sys.exit(3)
