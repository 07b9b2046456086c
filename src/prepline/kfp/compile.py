"""Compiling the catalog (every component and pipeline of the registry) into a folder: ``prepline
compile`` and ``scripts/compile.py`` write the repository's ``compiled/`` with it.

The repository's ``compiled/`` holds the built-in transforms only (``plugins=False``, the default
here): plug-ins installed in a developer's environment never reach it. ``prepline compile``
includes them (a user's own catalog) unless told ``--builtins-only``."""

from __future__ import annotations

from pathlib import Path

from prepline.gentree import sync_tree
from prepline.kfp import require_kfp


def compile_all(out_dir: Path, images=None, plugins: bool = False) -> list[Path]:
    """Compile every component and pipeline from the registry into out_dir, their images from
    ``images`` (a :class:`prepline.images.ImageSet`; default: the repository's), a simple pipeline
    for each installed plug-in transform too when ``plugins``; returns the files."""
    require_kfp()
    from prepline import registry

    with registry.scope(plugins):
        return _compile_all(out_dir, images)


def _compile_all(out_dir: Path, images) -> list[Path]:
    from kfp import compiler

    from prepline.components import catalog
    from prepline.images import DEFAULT
    from prepline.pipelines.factory import pipelines

    images = images or DEFAULT
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for sub, items in (("components", catalog(images)), ("pipelines", pipelines(images))):
        (out_dir / sub).mkdir(exist_ok=True)
        for name, obj in sorted(items.items()):
            path = out_dir / sub / f"{name}.yaml"
            compiler.Compiler().compile(obj, str(path))
            written.append(path)
    return written


def sync_compiled(target: Path, check: bool = False, images=None, plugins: bool = False) -> list[str]:
    """Compile into a temp dir and compare with ``target``; unless ``check``, replace it.
    Returns the differences (added, changed, stale files)."""
    return sync_tree(lambda d: compile_all(d, images, plugins), target, ["**/*.yaml"], check=check)
