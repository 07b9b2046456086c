"""The compiled (numba) passes, compiled ahead of a run: ``python -m prepline.kernels``.

numba compiles a pass the first time a process calls it (3-4 s per stage) and keeps the machine
code in its cache (``__pycache__`` next to the source, or ``NUMBA_CACHE_DIR``); later processes
load it in ~0.2 s. ``scripts/setup.sh`` runs this after installing, and the runtime images compile
at build time (their smoke test runs every transform), so that a stage's workers do not each pay
for the compilation. The cache is checked against each module's source file only: after editing
:mod:`prepline.textscan`, clear the callers' caches (``find src transforms -name '*.nb[ic]' -delete``).
"""

from __future__ import annotations

import importlib
import time

#: the modules with compiled passes, each with a ``warm()`` that runs them on a tiny input
MODULES = ("prepline.fasttext_np", "prepline.transforms.decontaminate")


def warm() -> dict[str, float]:
    """Compile (or load) every pass; seconds per module."""
    out = {}
    for name in MODULES:
        t0 = time.perf_counter()
        importlib.import_module(name).warm()
        out[name] = round(time.perf_counter() - t0, 2)
    return out


if __name__ == "__main__":
    for module, secs in warm().items():
        print(f"{module}: {secs} s")
