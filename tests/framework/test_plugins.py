"""Plug-in transforms (prepline.registry, docs/plugins.md): a real distribution with an entry point in
``prepline.transforms`` (tests/plugins/char_count_plugin), installed with pip into a temporary folder
that the subprocesses see, shows up in `prepline list`, `prepline run`, a compiled simple pipeline,
the Elyra catalog and the docs; broken plug-ins fail loudly, naming the distribution; the
repository's generated trees stay built-in only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SRC = ROOT / "tests" / "plugins" / "char_count_plugin"
PREPLINE = str(Path(sys.executable).with_name("prepline"))


def _env(*site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(map(str, site))
    return env


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict:
    """The environment of a process that has the char_count plug-in installed (pip, --target)."""
    base = tmp_path_factory.mktemp("plugin")
    src = base / "src"
    shutil.copytree(PLUGIN_SRC, src)  # pip builds in place with --no-build-isolation: keep the tree clean
    site = base / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-build-isolation", "--no-index", "--target", str(site), str(src)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(site.glob("prepline_char_count-0.1.0.dist-info"))
    return _env(site)


def prepline(env: dict, *args: str, ok: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([PREPLINE, *args], capture_output=True, text=True, env=env, timeout=180, cwd=cwd)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_listed_and_described(plugin_env):
    out = " ".join(prepline(plugin_env, "list").stdout.replace("│", " ").split())  # the table's text, wrapping undone
    assert "char_count" in out and "doc_id" in out and "(a plug-in)" in out
    helptext = prepline(plugin_env, "run", "char_count", "--help").stdout
    assert "--min-chars" in helptext and "--count-column" in helptext
    described = json.loads(prepline(plugin_env, "describe", "char_count", "--json").stdout)
    assert [p["name"] for p in described["parameters"]] == ["content_column", "count_column", "min_chars"]


def test_runs_on_parquet(plugin_env, tmp_path):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"contents": ["héllo", "ab", "", "four"]}), tmp_path / "in" / "a.parquet")
    prepline(plugin_env, "run", "char_count", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
             "--min-chars", "4", "--workers", "2", "--no-progress")
    assert pq.read_table(tmp_path / "out" / "a.parquet").to_pydict() == {"contents": ["héllo", "four"], "n_chars": [5, 4]}
    totals = json.loads((tmp_path / "out" / "metadata.json").read_text())["totals"]
    assert (totals["docs_in"], totals["docs_out"], totals["removed"]) == (4, 2, {"too_short": 2})


def test_compiled_pipeline_elyra_component_and_docs(plugin_env, tmp_path):
    r = prepline(plugin_env, "compile", "--output", str(tmp_path / "compiled"), "--elyra-output", str(tmp_path / "elyra"))
    assert "plug-ins included: char_count (prepline-char-count)" in r.stdout
    spec = next(yaml.safe_load_all((tmp_path / "compiled" / "pipelines" / "char_count.yaml").read_text()))
    assert spec["pipelineInfo"]["name"] == "char-count"
    prepare = spec["root"]["dag"]["tasks"]["exit-handler-1"]["componentRef"]["name"]
    args = spec["components"][prepare]["dag"]["tasks"]["prepare-args"]["inputs"]["parameters"]
    assert args["transform"]["runtimeValue"]["constant"] == "char_count"
    component = yaml.safe_load((tmp_path / "elyra" / "components" / "char_count.yaml").read_text())
    assert "min_chars" in [i["name"] for i in component["inputs"]]
    # the same command, told to, leaves the plug-in out (what the repository's trees hold)
    prepline(plugin_env, "compile", "--builtins-only", "--output", str(tmp_path / "b"), "--elyra-output", str(tmp_path / "be"))
    assert not (tmp_path / "b" / "pipelines" / "char_count.yaml").exists()
    docs = tmp_path / "docs"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--plugins", "--docs", str(docs)],
                       capture_output=True, text=True, env=plugin_env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (docs / "transforms").iterdir()) == ["char_count.md"]
    assert "| `min_chars` | int | `0` |" in (docs / "transforms" / "char_count.md").read_text()


def test_the_repository_trees_ignore_installed_plugins(plugin_env):
    """compiled/, elyra_templates/ and docs/ stay generated from the built-ins with a plug-in installed."""
    for script in ("gen_docs.py", "gen_elyra.py"):
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--check"], capture_output=True, text=True,
                           env=plugin_env, timeout=120)
        assert r.returncode == 0, script + r.stdout + r.stderr
    code = ("from prepline import registry\nfrom prepline.pipelines.factory import pipelines\n"
            "from prepline.pipelines.spec import shipped_names\n"
            "with registry.scope(plugins=False):\n    print(sorted(pipelines()) == sorted(registry.names() + [n + t for n in shipped_names() for t in ('', '_chained')]),"
            " 'char_count' in registry.names())\nprint('char_count' in registry.names())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=plugin_env, timeout=120)
    assert r.stdout.split() == ["True", "False", "True"], r.stderr


def test_the_contract_runs_on_a_plugin(plugin_env):
    """tests/transforms/test_contract.py checks every registered transform, plug-ins included."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not ray",
                        str(ROOT / "tests" / "transforms" / "test_contract.py"), "-k", "char_count"],
                       capture_output=True, text=True, env=plugin_env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout


# ---------------------------------------------------------------------------------------------
# broken plug-ins: a distribution as pip leaves it (dist-info with entry_points.txt, a module)


def _broken(tmp_path: Path, module: str, entry: str) -> dict:
    site = tmp_path / "site"
    info = site / "broken_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[prepline.transforms]\n{entry}\n")
    (site / "broken_transform.py").write_text(module)
    return _env(site)


CLASH = ("from dataclasses import dataclass\nfrom prepline.config import TransformConfig\nfrom prepline.transform import Transform\n"
         "@dataclass(frozen=True)\nclass C(TransformConfig):\n    pass\n"
         "class DocId(Transform):\n    name = 'doc_id'\n    Config = C\n")


@pytest.mark.parametrize("module, entry, says", [
    ("import no_such_package\n", "broken = broken_transform", "does not import: ModuleNotFoundError"),
    (CLASH, "doc_id = broken_transform:DocId", "already registered as a built-in transform"),
    ("def f():\n    pass\n", "broken = broken_transform:f", "is a function, not a Transform class or a module"),
    ("X = 1\n", "broken = broken_transform", "defines no Transform class"),
])
def test_a_broken_plugin_is_a_clear_error(tmp_path, module, entry, says):
    env = _broken(tmp_path, module, entry)
    r = prepline(env, "list", ok=False)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "distribution 'broken-plugin' 1.0" in r.stderr and entry.split(" = ")[0] in r.stderr
    assert "pip uninstall broken-plugin" in r.stderr and "Traceback" not in r.stderr
    # a built-in is still usable by name: only listing every transform needs the plug-ins
    assert "--hash-column" in prepline(env, "run", "doc_id", "--help").stdout


def test_compile_says_what_it_wrote_and_check_with_a_plugin_points_at_builtins_only(plugin_env, tmp_path):
    """Issue 25 item 9: `compile --output` lists the files it wrote (never `missing:`); with a
    plug-in installed, `compile --check` of the repository's trees says the fix is --builtins-only,
    not to commit files."""
    env = dict(plugin_env)
    if os.environ.get("PYTHONPATH"):  # a checkout run from a worktree: its own sources, as the parent's
        env["PYTHONPATH"] = os.pathsep.join([plugin_env["PYTHONPATH"], os.environ["PYTHONPATH"]])
    r = prepline(env, "compile", "--builtins-only", "--output", str(tmp_path / "c"), "--elyra-output", str(tmp_path / "e"))
    assert "missing:" not in r.stdout and "written: pipelines/doc_id.yaml" in r.stdout
    r = prepline(env, "compile", "--check", ok=False, cwd=ROOT)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: ") and "char_count" in err[0], r.stderr
    assert err[1].startswith("  fix: prepline compile --check --builtins-only") and "commit" not in r.stderr
    assert prepline(env, "compile", "--check", "--builtins-only", cwd=ROOT).returncode == 0
