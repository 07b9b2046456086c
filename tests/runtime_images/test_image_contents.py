"""Every step's imports are in its image.

For each component and mode, the step's real entry point runs (tests/runtime_images/steps.py) in a
subprocess against the fakes, with only the image's *declared* package set importable: the prepline
extras of its Dockerfile (prepline.images.EXTRAS), closed over their requirements as pip would
install them (read from the installed metadata), plus what the base image brings. Everything else in
the test venv is hidden from the step and its subprocesses (recorder/sitecustomize.py), so a guarded
optional import falls back as it would in the image, and an unguarded one fails the step. Every
process also records the modules it imported; each must be from the standard library or the
declared set. A step that imports torch in the launcher image, or Ray where there is none, fails here.

Which steps exist, and which image each runs in, is read from compiled/ and elyra_templates/
(generated.py): ``test_every_step_runs_in_the_image_it_declares`` runs every executor of every compiled
pipeline and component and every Elyra catalog component by its own command, so a step added to a
pipeline or a template is checked without being listed here (it fails until it gets input values).

The Ray image's own run (every transform, offline) is tests/runtime_images/test_images.py's smoke test;
here its Ray job entry (``prepline run <t> --runtime ray``) is checked on one transform.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prepline import images

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "clusters"))
sys.path.insert(0, str(HERE.parent / "kfp"))
sys.path.insert(0, str(HERE.parent / "train"))

from image_sets import BASE, NOT_PACKAGES, _norm, _owners, allowed_folders, declared  # noqa: E402,F401


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


def image_env(kind: str, tmp_path: Path, log: Path, extra_path: list[str] = ()) -> dict:
    allow = tmp_path / f"{kind}.allowed"
    allow.write_text("\n".join(sorted(allowed_folders(kind))))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE / "recorder"), str(HERE.parents[1] / "src"), *extra_path]), "PREPLINE_IMPORT_LOG": str(log),
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
    # torch is in the Ray image for synthesize's CPU engine (the train extra); kfp is not
    assert "ray" in declared("ray") and "torch" in declared("ray") and "kfp" not in declared("ray")
    assert {"torch", "ray", "kfp", "websocket-client"} <= declared("trainer")
    assert "websocket-client" in declared("launcher")  # the Ray log tail: brought by kubernetes, through kfp
    assert "tokenizers" in declared("launcher")  # train_tokenizer trains the run's BPE there
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


# ----------------------------------------------------------------------------------------------
# every step of compiled/ and elyra_templates/, generated from the files (tests/runtime_images/generated.py)

from generated import Step, all_steps, elyra_argv, kfp_argv  # noqa: E402
from steps import required_params  # noqa: E402

ROOT = HERE.parents[1]
STEPS = all_steps(ROOT)
LANGS = ["en", "ja", "fr"]
#: the order a run takes: plan first, the stages, the tokenizer, the accounting, training, the report
ORDER = ["kfp plan_run", "prepline.elyra_pipeline plan", "kfp prepare_args", "kfp start_ray_cluster", "kfp execute_ray_job",
         "kfp stop_ray_cluster", "prepline.elyra run", "kfp run_pipeline", "kfp train_tokenizer", "prepline.elyra_pipeline train_tokenizer",
         "kfp check_documents", "prepline.elyra_pipeline check_documents", "kfp fine_tune", "prepline.elyra_pipeline fine_tune",
         "kfp run_report", "prepline.elyra_pipeline run_report"]
#: steps that end in a domain error on this made-up run, after every import of their body ran
EXPECT_ERROR = {"kfp check_documents": "documents are not all accounted for",
                "prepline.elyra_pipeline check_documents": "documents are not all accounted for"}


def _run_folder(work: Path, inp: Path) -> None:
    """What a run's earlier steps leave: each branch's filter output (the tokenizer's input), every
    transform's metadata.json (the fake head runs no transform) and the training metrics a TrainJob writes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prepline import registry

    inp.mkdir(parents=True, exist_ok=True)
    texts = [f"document {i}: the quick brown fox jumps over the lazy dog number {i}" for i in range(64)]
    pq.write_table(pa.table({"contents": texts}), inp / "part-0.parquet")
    for lang in LANGS:
        (work / "r" / f"lang={lang}" / "filter").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"contents": texts}), work / "r" / f"lang={lang}" / "filter" / "part-0.parquet")
    for t in registry.names():
        _meta_at(work / "r" / t)
    model = work / "r" / "fine_tune" / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    (work / "r" / "fine_tune" / "metrics.json").write_text(json.dumps({
        "format": "prepline.train.metrics", "final_loss": 1.5, "steps": 3, "model": str(model), "model_kind": "gpt", "parameters": 1,
        "seq_len": 8, "vocab_size": 300, "languages": LANGS, "resumed_from": 0, "initial_loss": 2.0, "final_loss_mean10": 1.6,
        "tokens_seen": 48, "tokens_per_s": 10.0, "sequences_available": 6, "epochs": 1.0}))


def _meta_at(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    totals = {"docs_in": 2, "docs_out": 2, "removed": {}, "files": 1, "files_failed": 0, "seconds": 0.1, "bytes_in": 1, "bytes_out": 1}
    (folder / "metadata.json").write_text(json.dumps({"status": "success", "totals": totals}))


def _inputs(step: Step, ctx: dict) -> dict:
    """The values a run gives the step's inputs (the rest: the files' defaults). A step of the
    generated files that has no entry here fails the test: add one."""
    from prepline.pipelines.spec import shipped

    w, prov = ctx["work"], json.dumps(ctx["provider"])
    run = {"work_root": w, "run_id": "r"}
    train = {"work_root": w, "run_id": "r", "train_params_json": json.dumps({"steps": 2, "batch_size": 2, "model_dim": 16, "threads": 1}),
             "trainjob_json": json.dumps({"kubeconfig": ctx["kubeconfig"], "poll_seconds": 0.05}), "s3_secret_name": "prepline-s3"}
    stage = {"provider": "kuberay", "provider_json": prov, "timeout_seconds": 60}
    table = {
        "kfp plan_run": {**run, "spec_json": shipped().to_json(), "input_path": ctx["input"], "languages": LANGS, "input_format": "auto",
                         "text_column": "contents", "overrides_json": "{}", "cluster_json": "{}"},
        "kfp prepare_args": {**run, "transform": "doc_id", "params_json": "{}", "overrides_json": "{}", "stage": "doc_id", "branch": "",
                             "input_path": ctx["input"], "input_stage": "", "input_from_split": False, "cluster_json": "{}"},
        "kfp start_ray_cluster": {**stage, "prepared": ctx["prepared"], "s3_secret_name": "prepline-s3"},
        "kfp execute_ray_job": {**stage, "prepared": ctx["prepared"], "max_failed_files": 0},
        "kfp stop_ray_cluster": {**stage, "cluster_json": "{}", "overrides_json": "{}", "run_id": "r", "stage": "doc_id", "branch": ""},
        "kfp run_pipeline": {"pipeline_name": "doc_id", "parameters": {"input_path": "/i", "work_root": "/w"}, "host": ctx["kfp"],
                             "poll_seconds": 0},
        "kfp train_tokenizer": run, "kfp check_documents": run, "kfp run_report": run,
        "kfp fine_tune": {**train, "mode": "cluster", "languages": LANGS, "train_languages": [], "timeout_seconds": 600},
        "prepline.elyra run": {**run, **stage, "input_path": ctx["input"], "s3_credentials": ctx["creds"],
                               **{k: json.dumps(v) if isinstance(v, list) else v
                                  for k, v in required_params(w).get(Path(sorted(step.used_in)[0]).stem, {}).items()}},
        "prepline.elyra_pipeline plan": {**run, "spec_json": shipped().to_json(), "input_path": ctx["input"], "s3_credentials": ctx["creds"],
                                         "languages": json.dumps(LANGS)},
        **{f"prepline.elyra_pipeline {s}": {**run, "s3_credentials": ctx["creds"]} for s in ("train_tokenizer", "check_documents", "run_report")},
        "prepline.elyra_pipeline fine_tune": {**train, "s3_credentials": ctx["creds"], "train_mode": "cluster", "languages": json.dumps(LANGS),
                                              "train_languages": ""},
    }
    assert step.key in table, f"{step.key} ({', '.join(sorted(step.used_in))}): a step the harness has no inputs for: add it to _inputs"
    return table[step.key]


def test_the_generated_steps_cover_every_step_of_the_super_pipelines():
    keys = {s.key for s in STEPS}
    assert {"kfp plan_run", "kfp train_tokenizer", "kfp check_documents", "kfp run_report", "kfp fine_tune", "kfp prepare_args",
            "kfp start_ray_cluster", "kfp execute_ray_job", "kfp stop_ray_cluster", "kfp run_pipeline",
            "prepline.elyra run", "prepline.elyra_pipeline train_tokenizer"} <= keys
    assert set(ORDER) >= keys, keys - set(ORDER)
    used = {u.split(":")[0] for s in STEPS for u in s.used_in}
    for f in ("compiled/pipelines/super.yaml", "compiled/pipelines/super_chained.yaml", "elyra_templates/super.pipeline",
              "elyra_templates/doc_id.pipeline", "compiled/components/train_tokenizer.yaml"):
        assert f in used, f
    # every executor of super.yaml is a step of the list (the list is made from the files, not typed)
    import yaml as y

    first = next(y.safe_load_all((ROOT / "compiled" / "pipelines" / "super.yaml").read_text()))
    super_execs = {f"compiled/pipelines/super.yaml:{k}" for k in first["deploymentSpec"]["executors"]}
    assert super_execs <= {u for s in STEPS for u in s.used_in}


@pytest.mark.parametrize("kind", sorted({s.kind for s in STEPS}))
def test_every_step_runs_in_the_image_it_declares(kind, kuberay, tmp_path):
    """Each step of compiled/ and elyra_templates/ that declares image ``kind`` runs its command (one
    process for the image, tests/runtime_images/steps.py batch) with only that image's declared
    packages importable, against the fakes, on a made-up run folder: it must finish (or end in
    the domain error expected of that folder), and import nothing its image lacks."""
    from fake_k8s import FakeK8s
    from fake_kfp_server import FakeKfp

    from prepline.components.ray_stage import prepare_args
    from prepline.kfp_client import main as kfp_main

    mine = sorted((s for s in STEPS if s.kind == kind), key=lambda s: ORDER.index(s.key) if s.key in ORDER else -1)
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "AWS_ACCESS_KEY_ID").write_text("a")
    (creds / "AWS_SECRET_ACCESS_KEY").write_text("b")
    with FakeKfp() as kfp_fake, FakeK8s() as k8s:
        assert kfp_main(["upload", str(ROOT / "compiled" / "pipelines" / "doc_id.yaml"), "--name", "doc_id", "--host", kfp_fake.url]) == 0
        commands = []
        for flavour, argv_of in (("kfp", kfp_argv), ("elyra", elyra_argv)):
            work, inp = tmp_path / flavour / "w", tmp_path / flavour / "in"
            _run_folder(work, inp)
            ctx = {"work": str(work), "input": str(inp), "provider": _provider(kuberay), "kfp": kfp_fake.url, "creds": str(creds),
                   "kubeconfig": k8s.kubeconfig(tmp_path)}
            ctx["prepared"] = prepare_args.python_func(transform="doc_id", params_json="{}", overrides_json="{}", work_root=str(work),
                                                       run_id="r", stage="doc_id", branch="", input_path=str(inp), input_stage="",
                                                       input_from_split=False, cluster_json="{}")
            for i, s in enumerate(x for x in mine if (x.key.startswith("kfp ")) == (flavour == "kfp")):
                name = f"{s.key} [{sorted(s.used_in)[0]}]"
                commands.append({"name": name, "argv": argv_of(s, _inputs(s, ctx), tmp_path / "out" / flavour / str(i)),
                                 "expect": EXPECT_ERROR.get(s.key)})
        assert commands
        log = tmp_path / f"{kind}.imports"
        results = tmp_path / f"{kind}.results.json"
        env = image_env(kind, tmp_path, log, [str(HERE), str(HERE.parent / "clusters")])
        r = subprocess.run([sys.executable, str(HERE / "steps.py"), "batch", json.dumps({"commands": commands, "tmp": str(tmp_path),
                                                                                         "results": str(results)})],
                           env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert r.returncode == 0 and results.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    failed = []
    for c, res in zip(commands, json.loads(results.read_text())):
        said = res["exception"] + res["stderr"]
        if c["expect"]:
            ok = res["code"] != 0 and c["expect"] in said and "ModuleNotFoundError" not in said and "ImportError" not in said
        else:
            ok = res["code"] == 0 and not res["exception"]
        if not ok:
            failed.append(f"{res['name']} (exit {res['code']}): {said[-1500:]}")
    assert not failed, f"in the {kind} image:\n" + "\n\n".join(failed)
    mods = _read(log)
    assert missing(kind, mods) == {}
