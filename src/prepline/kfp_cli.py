"""Compiling the catalog into compiled/, and running pipelines locally with kfp.local."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from prepline.errors import ConfigError
from prepline.gentree import sync_tree

ROOT = Path(__file__).resolve().parents[2]


def _require_kfp() -> None:
    try:
        import kfp  # noqa: F401
    except ImportError:
        raise ConfigError("this command needs Kubeflow Pipelines", "pip install 'prepline[kfp]'") from None


def compile_all(out_dir: Path) -> list[Path]:
    """Compile every component and pipeline from the registry into out_dir; returns the files."""
    _require_kfp()
    from kfp import compiler

    from prepline.components import catalog
    from prepline.pipelines.factory import pipelines

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for sub, items in (("components", catalog()), ("pipelines", pipelines())):
        (out_dir / sub).mkdir(exist_ok=True)
        for name, obj in sorted(items.items()):
            path = out_dir / sub / f"{name}.yaml"
            compiler.Compiler().compile(obj, str(path))
            written.append(path)
    return written


def sync_compiled(target: Path, check: bool = False) -> list[str]:
    """Compile into a temp dir and compare with ``target``; unless ``check``, replace it.
    Returns the differences (added, changed, stale files)."""
    return sync_tree(compile_all, target, ["**/*.yaml"], check=check)


def run_local(name: str, args: dict, pipeline_root: str) -> float:
    """Run a pipeline with kfp.local's SubprocessRunner in this Python (the local cluster provider
    starts a Ray head per stage). Returns the wall time; raises when the pipeline fails."""
    _require_kfp()
    import kfp.local

    from prepline.pipelines.factory import pipelines

    table = pipelines()
    if name not in table:
        raise ConfigError(f"unknown pipeline '{name}'", f"one of: {', '.join(sorted(table))}")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # the components run as subprocesses of this interpreter: put it first on PATH
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=pipeline_root, raise_on_error=True)
    t0 = time.perf_counter()
    table[name](**args)
    return time.perf_counter() - t0
