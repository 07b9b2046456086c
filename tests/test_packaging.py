"""The wheel built from the repo installs into a fresh venv and every module in it imports."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_sub_package_is_listed():
    """setuptools takes only the packages listed: a new sub-package must be added to pyproject.toml."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for pkg, folder in tool["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([pkg, *rel.parts]))
    assert found == set(tool["packages"])


@pytest.mark.slow
def test_wheel_installs_and_imports_every_module(tmp_path):
    dist = tmp_path / "dist"
    # built from a copy: a checkout's own build/ folder keeps modules that no longer exist, and setuptools packs them
    tree = shutil.copytree(ROOT, tmp_path / "tree", ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(tree)],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = dist.glob("prepline-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = sorted(n[:-3].replace("/", ".").removesuffix(".__init__") for n in names if n.endswith(".py"))
    # the design card's folders are sub-packages of the one import package
    for pkg in ("prepline.transforms", "prepline.components", "prepline.pipelines", "prepline.runtime"):
        assert pkg in modules, pkg
    assert "prepline.transforms.exact_dedup" in modules
    # every .py of the source folders is in the wheel
    src = {p for d in ("src/prepline", "transforms", "components", "pipelines") for p in (ROOT / d).rglob("*.py")}
    assert len(src) == len(modules), "a sub-package is missing from [tool.setuptools] packages"

    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    py = env / "bin" / "python"
    # dependencies come from the test environment (a path entry, so its editable prepline is NOT active)
    site = next((env / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)], check=True)
    code = (
        "import importlib, sys, prepline\n"
        f"assert prepline.__file__.startswith({str(env)!r}), prepline.__file__\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "from prepline import registry; print(','.join(registry.names()))\n"
    )
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "doc_id" in out.stdout and "exact_dedup" in out.stdout and "filter" in out.stdout
    # nothing is looked up in a source checkout: the installed package compiles the catalog where asked
    out = subprocess.run([str(py), "-m", "prepline.cli", "compile", "--output", str(tmp_path / "c")], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    want = sorted(p.relative_to(ROOT / "compiled").as_posix() for p in (ROOT / "compiled").rglob("*.yaml"))
    assert sorted(p.relative_to(tmp_path / "c").as_posix() for p in (tmp_path / "c").rglob("*.yaml")) == want
