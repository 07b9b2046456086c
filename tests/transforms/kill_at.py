"""Run ``prepline run ...`` and SIGKILL the process at a chosen point (for the contract's resume test).

    python kill_at.py PHASE N -- run <transform> --input ... --output ... --workers 1

After the N-th completion marker of PHASE is written, the run's next write (the next task's work or
output file, or the next phase's) still happens, then the process kills itself with SIGKILL: no
handler, no cleanup, like an OOM kill. With one worker every task runs in this process, so the kill
point does not depend on timing. Exits 3 if the run ended before that point.
"""

from __future__ import annotations

import os
import signal
import sys


def arm(phase: str, n: int) -> None:
    from prepline.context import MARKERS
    from prepline.data_access import LocalLocation

    prefix = f"{MARKERS}/{phase}/"
    state = {"markers": 0}

    def wrap(method):
        def write(self, rel, data):
            result = method(self, rel, data)
            if state["markers"] >= n:
                os.kill(os.getpid(), signal.SIGKILL)
            if rel.startswith(prefix):
                state["markers"] += 1
            return result

        return write

    LocalLocation.write_bytes = wrap(LocalLocation.write_bytes)
    LocalLocation.write_parquet = wrap(LocalLocation.write_parquet)


if __name__ == "__main__":
    phase, n, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: kill_at.py PHASE N -- <prepline arguments>"
    arm(phase, int(n))
    from prepline.cli import main

    main(argv)
    sys.exit(3)
