"""The Elyra catalog and templates: generated from the registry, in the format Elyra parses, valid
and exportable with the real Elyra CLI, with the same stage structure as the compiled pipelines;
and the one-step stage entrypoint the components run, against a real local Ray head."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from prepline import registry
from prepline.elyra import CATALOG_SUBDIR, RUN_ID_PLACEHOLDER, STAGE_INPUTS, STAGE_OUTPUTS, _cli, _parse_list, component_id, typed_params
from prepline.elyra_pipeline import generate, sync
from prepline.images import LAUNCHER_IMAGE, TRAINER_IMAGE

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "elyra_templates"
COMPILED = ROOT / "compiled" / "pipelines"
CATALOG = TEMPLATES / CATALOG_SUBDIR


def _component(transform: str) -> dict:
    return yaml.safe_load((CATALOG / f"{transform}.yaml").read_text())


def _pipeline_docs() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(TEMPLATES.glob("*.pipeline"))}


# ---------------------------------------------------------------------------------------------
# generated files (no Elyra needed)


def test_generated_files_are_up_to_date():
    assert sync(TEMPLATES, check=True) == [], "run scripts/gen_elyra.py and commit elyra_templates/"


@pytest.mark.slow
def test_check_reports_and_sync_fixes_a_stale_tree(tmp_path):
    t = tmp_path / "elyra_templates"
    shutil.copytree(TEMPLATES, t)
    (t / CATALOG_SUBDIR / "doc_id.yaml").write_text((t / CATALOG_SUBDIR / "doc_id.yaml").read_text().replace("contents", "text"))
    (t / CATALOG_SUBDIR / "old_transform.yaml").write_text("name: gone\n")
    (t / "super.pipeline").unlink()
    assert sync(t, check=True) == ["missing: super.pipeline", f"stale: {CATALOG_SUBDIR}/old_transform.yaml",
                                   f"changed: {CATALOG_SUBDIR}/doc_id.yaml"]
    assert not (t / "super.pipeline").exists()  # --check writes nothing
    assert len(sync(t)) == 3 and sync(t, check=True) == []
    assert (t / "README.md").read_text() == (TEMPLATES / "README.md").read_text()  # hand-written files are left alone
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_elyra.py"), "--check"], capture_output=True, text=True)
    assert out.returncode == 0 and "up to date" in out.stdout, out.stdout + out.stderr


def test_one_catalog_entry_per_transform_in_v1_format():
    from prepline.elyra_pipeline import STEPS

    assert sorted(p.stem for p in CATALOG.glob("*.yaml")) == sorted(registry.names() + list(STEPS))
    for t in registry.names():
        c = _component(t)
        assert set(c) == {"name", "description", "inputs", "outputs", "implementation"}  # v1, not compiled v2 IR
        assert "pipelineSpec" not in c and "deploymentSpec" not in c
        ctr = c["implementation"]["container"]
        assert ctr["image"] == LAUNCHER_IMAGE
        assert ctr["command"] == ["python", "-m", "prepline.elyra"] and ctr["args"][:2] == ["run", t]
        infos = {p.name: p for p in registry.get(t).Config.params()}
        inputs = {i["name"]: i for i in c["inputs"]}
        assert list(inputs) == list(infos) + [n for n, *_ in STAGE_INPUTS]
        required = {n for n, _, v, *_ in STAGE_INPUTS if v is None}
        assert required == {"input_path", "work_root"}  # no /tmp defaults: a cluster run names them
        for i in c["inputs"]:
            # only the types that survive Elyra's export; defaults as strings (Elyra calls .replace on them)
            assert i["type"] in ("String", "Integer", "Float") and i["description"], i
            if i["name"] in required:
                assert "default" not in i and "optional" not in i, i
            else:
                assert i["optional"] is True and isinstance(i["default"], str), i
        for name, p in infos.items():
            assert inputs[name]["description"].startswith(p.help.rstrip(".")), name
            assert inputs[name]["type"] == {str: "String", int: "Integer", float: "Float", bool: "String", list: "String"}[p.type]
        assert [o["name"] for o in c["outputs"]] == [n for n, *_ in STAGE_OUTPUTS]
        assert not any("output_" in o["name"] for o in c["outputs"])
        # every input is passed exactly once, by value; the outputs by path
        refs = [a for a in ctr["args"] if isinstance(a, dict)]
        assert sorted(r["inputValue"] for r in refs if "inputValue" in r) == sorted(inputs)
        assert sorted(r["outputPath"] for r in refs if "outputPath" in r) == sorted(o["name"] for o in c["outputs"])


@pytest.mark.parametrize("transform", registry.names())
def test_component_defaults_round_trip_to_the_config_defaults(transform):
    """The command line the container gets with every default parses back to the config's defaults,
    also with the single-quoted list defaults Elyra's editor shows (it turns " into ')."""
    c = _component(transform)
    infos = {p.name: p for p in registry.get(transform).Config.params()}
    raw = {i["name"]: i["default"] for i in c["inputs"] if i["name"] in infos}
    want = {k: (list(p.default) if p.type is list else p.default) for k, p in infos.items()}
    got = typed_params(transform, raw)
    got = {k: (float(v) if infos[k].type is float else int(v) if infos[k].type is int else v) for k, v in got.items()}
    assert got == want
    mangled = {k: v.replace('"', "'") for k, v in raw.items()}
    assert typed_params(transform, mangled) == typed_params(transform, raw)


def test_list_and_bad_values_fail_with_the_parameter_named():
    from prepline.errors import ConfigError

    assert _parse_list("criteria", "['a > 1', \"b = 'x'\"]") == ["a > 1", "b = 'x'"]
    assert _parse_list("criteria", "") == []
    with pytest.raises(ConfigError, match="criteria"):
        _parse_list("criteria", "[1, 2]")
    with pytest.raises(ConfigError, match="split"):
        typed_params("lang_id", {"split": "maybe"})
    with pytest.raises(ConfigError, match="unknown parameter"):
        typed_params("doc_id", {"nope": "1"})


def test_templates_reference_the_catalog_and_mirror_the_stages():
    from prepline.elyra_pipeline import STEPS, step_id
    from prepline.pipelines import spec as specs

    docs = _pipeline_docs()
    assert set(docs) == {"doc_id", *specs.shipped_names()} >= {"super", "fineweb"}
    ids = {component_id(t): t for t in registry.names()} | {step_id(s): s for s in STEPS}
    defaults = {n: v for n, _, v, *_ in STAGE_INPUTS}
    assert defaults["input_path"] is None and defaults["work_root"] is None and defaults["provider"] == "kuberay"
    for name, d in docs.items():
        assert d["version"] == "3.0" and d["doc_type"] == "pipeline"
        (p,) = d["pipelines"]
        assert p["id"] == d["primary_pipeline"] and p["app_data"]["runtime_type"] == "KUBEFLOW_PIPELINES"
        for n in p["nodes"]:
            assert n["op"] in ids, f"{name}: node {n['app_data']['label']} references no catalog entry"
            params = n["app_data"]["component_parameters"]
            declared = {i["name"] for i in _component(ids[n["op"]])["inputs"]}
            assert declared <= set(params), declared - set(params)
    shipped = specs.shipped()
    nodes = [(ids[n["op"]], n["app_data"]["component_parameters"].get("branch", {}).get("value", ""))
             for n in docs["super"]["pipelines"][0]["nodes"]]
    cut = shipped.tokenizer_split()
    branch = [s.name for s in shipped.branch_stages]
    per_lang = [[(s, lg) for s in group if shipped.stage(s).runs_for(lg)] for group in (branch[:cut], branch[cut:])
                for lg in shipped.branches.languages]
    n = len(shipped.branches.languages)
    assert nodes == [("plan", ""), *[(s, "") for s in shipped.order()[:len(shipped.stages) + 1]], *sum(per_lang[:n], []),
                     ("train_tokenizer", ""), *sum(per_lang[n:], []), ("check_documents", ""), ("fine_tune", ""),
                     ("run_report", "")]
    assert ("hap", "ja") not in nodes and ("hap", "en") in nodes  # the spec's hap: English only
    assert [ids[n["op"]] for n in docs["doc_id"]["pipelines"][0]["nodes"]] == ["doc_id"]
    # a recipe's template: its stages in its order, once per branch language
    fw = specs.shipped("fineweb")
    stages = [ids[n["op"]] for n in docs["fineweb"]["pipelines"][0]["nodes"]]
    assert [s for s in stages if s in fw.order()] == fw.order()


def test_generation_is_deterministic():
    """Another interpreter (another hash seed than this one's random seed, so another set and dict
    iteration order) generates the same files."""
    code = "import json, sys; from prepline.elyra_pipeline import generate; json.dump(generate(), sys.stdout, sort_keys=True)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                       env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert json.loads(r.stdout) == generate()


# ---------------------------------------------------------------------------------------------
# the entrypoint, as the container runs it, against a real local Ray head


def _command(transform: str, values: dict[str, str], outdir: Path) -> list[str]:
    """The container's command line from the catalog entry, placeholders filled like KFP does."""
    c = _component(transform)
    vals = {i["name"]: i.get("default", "") for i in c["inputs"]} | values
    argv = []
    for a in c["implementation"]["container"]["args"]:
        if isinstance(a, dict) and "inputValue" in a:
            argv.append(vals[a["inputValue"]])
        elif isinstance(a, dict):
            argv.append(str(outdir / a["outputPath"]))
        else:
            argv.append(a)
    return [sys.executable, *c["implementation"]["container"]["command"][1:], *argv]


def test_bad_parameter_fails_before_any_cluster(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREPLINE_LOCAL_CLUSTERS", str(tmp_path / "clusters"))
    argv = _command("doc_id", {"start_id": "-1", "input_path": str(tmp_path), "work_root": str(tmp_path / "w"), "run_id": "r"},
                    tmp_path / "out")
    assert _cli(argv[3:]) == 2
    assert "start_id=-1 must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "clusters").exists() or not list((tmp_path / "clusters").glob("*.json"))
    assert _cli(_command("doc_id", {"input_path": str(tmp_path), "work_root": str(tmp_path / "w")}, tmp_path / "o")[3:]) == 2
    assert "unresolved placeholder" in capsys.readouterr().err  # the KFP run id must have been substituted


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_component_command_runs_the_whole_stage_and_always_stops(tmp_path, corpus, monkeypatch):
    """The exact container command of the doc_id entry: prepare → start a local Ray head → run the
    job → stop; outputs written; a failing job fails the step and the cluster is stopped anyway."""
    pytest.importorskip("ray", reason="the local provider needs the ray extra (the Elyra-only venv has none)")
    clusters = tmp_path / "clusters"
    monkeypatch.setenv("PREPLINE_LOCAL_CLUSTERS", str(clusters))
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    # one worker actor (the local head gets head + worker CPUs); a job that hangs fails the step in 5 minutes
    common = {"provider": "local", "work_root": str(tmp_path / "w"), "run_id": "elyra-run-1", "cluster_json": '{"workers": {"cpu": "1", "replicas": 1}}',
              "timeout_seconds": "300", "start_timeout_seconds": "300"}
    try:
        _run_stage_commands(tmp_path, corpus, env, common, clusters)
    finally:  # a step killed by the timeout cannot stop its cluster: never leave one behind
        from prepline.clusters.local import LocalProvider

        for f in clusters.glob("*.json"):
            LocalProvider().delete(f.stem)


def _run_stage_commands(tmp_path, corpus, env, common, clusters):
    out = tmp_path / "out"
    t0 = time.time()
    r = subprocess.run(_command("doc_id", {**common, "input_path": str(corpus), "start_id": "100"}, out), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    stage_dir = tmp_path / "w" / "elyra-run-1" / "doc_id"
    assert (out / "stage_dir").read_text() == str(stage_dir) and (out / "docs_written").read_text() == "10"
    meta = json.loads((stage_dir / "metadata.json").read_text())
    assert meta["status"] == "success" and meta["totals"]["docs_out"] == 10
    assert "| docs out | 10 |" in r.stdout  # the stage summary, in the step's log
    import pyarrow.dataset as ds

    ids = sorted(ds.dataset(stage_dir, format="parquet", exclude_invalid_files=True).to_table(columns=["doc_id"])["doc_id"].to_pylist())
    assert ids == list(range(100, 110))
    assert not list(clusters.glob("*.json")), "the cluster was not stopped"
    print(f"doc_id stage via the Elyra entrypoint: {time.time() - t0:.1f}s")

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.parquet").write_bytes(b"not parquet")
    r = subprocess.run(_command("doc_id", {**common, "run_id": "elyra-run-2", "input_path": str(bad)}, tmp_path / "out2"),
                       env=env, capture_output=True, text=True, timeout=600)
    # RunFailed (exit 1) with what `prepline run` said in the job: the file and the fix
    assert r.returncode == 1 and "input file(s) failed" in r.stderr and "fix: re-export or remove the file" in r.stderr, \
        r.stdout[-3000:] + r.stderr[-3000:]
    assert not list(clusters.glob("*.json")), "the cluster of a failed stage was not stopped"
    assert not (tmp_path / "out2" / "stage_dir").exists()


# ---------------------------------------------------------------------------------------------
# the real Elyra CLI: register the catalog headless, validate and export every template

# The Elyra CLI lives in a venv of its own (elyra 4.1.1 pins click==8.1.8, the pii extra's spaCy needs
# >= 8.2.1): scripts/setup_elyra.sh makes .venv-elyra, scripts/test.sh points PREPLINE_ELYRA_BIN at it
# and sets PREPLINE_REQUIRE_ELYRA=1, so in CI a missing CLI fails these tests instead of skipping them.
RUNTIME = "prepline-kfp"


def _elyra_bin_dir() -> Path | None:
    for d in (os.environ.get("PREPLINE_ELYRA_BIN"), Path(sys.executable).parent, ROOT / ".venv-elyra" / "bin"):
        if d and (Path(d) / "elyra-pipeline").exists() and (Path(d) / "elyra-metadata").exists():
            return Path(d)
    return None


ELYRA_BIN = _elyra_bin_dir()
ELYRA_REQUIRED = os.environ.get("PREPLINE_REQUIRE_ELYRA") == "1"


def _elyra_bin(name: str) -> str:
    if ELYRA_BIN is None and ELYRA_REQUIRED:
        pytest.fail("PREPLINE_REQUIRE_ELYRA=1 but no Elyra CLI was found: run scripts/setup_elyra.sh")
    if ELYRA_BIN is None:
        pytest.skip("the Elyra CLI is not installed: scripts/setup_elyra.sh makes .venv-elyra with it")
    return str(ELYRA_BIN / name)


@pytest.fixture(scope="module")
def elyra_runs(tmp_path_factory):
    """In a private Jupyter/Elyra home, the catalog (directory connector) and a KFP runtime config
    registered with the elyra-metadata CLI as elyra_templates/README.md says; then every
    elyra-pipeline command of this module, run once in one Elyra process (elyra_batch.py: the
    script's own entry point; Elyra's import paid once): for the shipped doc_id and super templates and for a
    user's spec: validate as shipped (refused: required parameters empty; not for the user's spec),
    validate with them filled in, export. Returns {(template, step): result}, result with "code",
    "stdout" and "file" (the export's)."""
    from prepline.elyra_pipeline import spec_template
    from prepline.pipelines import spec as specs

    home = tmp_path_factory.mktemp("elyra-home")
    env = {**os.environ, "HOME": str(home), "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(home / "data" / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"}
    (home / "data" / "runtime").mkdir(parents=True)
    for argv in (
        ["elyra-metadata", "create", "component-catalogs", "--schema_name=local-directory-catalog",
         "--display_name=prepline", "--runtime_type=KUBEFLOW_PIPELINES", f"--paths=['{CATALOG}']", "--categories=['prepline']"],
        ["elyra-metadata", "create", "runtimes", "--schema_name=kfp", f"--name={RUNTIME}", "--display_name=prepline KFP",
         "--api_endpoint=http://127.0.0.1:8888/pipeline", "--cos_endpoint=http://127.0.0.1:9000", "--cos_bucket=prepline-elyra",
         "--cos_auth_type=USER_CREDENTIALS", "--cos_username=minio", "--cos_password=minio123"],
    ):  # the README's commands, as they are typed
        r = subprocess.run([_elyra_bin(argv[0]), *argv[1:]], env=env, capture_output=True, text=True, timeout=300, cwd=home)
        assert r.returncode == 0, r.stdout + r.stderr
    steps, argvs = [], []
    d = tmp_path_factory.mktemp("elyra-runs")
    (d / "mine.pipeline").write_text(json.dumps(spec_template(specs.load(ROOT / "tests" / "pipelines" / "mine.yaml"))))
    for template, source in (("doc_id", TEMPLATES / "doc_id.pipeline"), ("super", TEMPLATES / "super.pipeline"), ("mine", d / "mine.pipeline")):
        filled = _fill(source, d / "filled" / f"{template}.pipeline")
        out = d / f"{template}.yaml"
        todo = [("validate", ["validate", "--runtime-config", RUNTIME, str(filled)]),
                ("export", ["export", "--runtime-config", RUNTIME, "--output", str(out), str(filled)])]
        if template != "mine":
            todo.insert(0, ("shipped", ["validate", "--runtime-config", RUNTIME, str(source)]))
        for step, argv in todo:
            steps.append((template, step, out))
            argvs.append(["elyra-pipeline", *argv])
    python = Path(_elyra_bin("elyra-pipeline")).parent / "python"
    r = subprocess.run([str(python), str(Path(__file__).parent / "elyra_batch.py"), json.dumps(argvs)], env=env, cwd=home,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(steps), r.stdout[-3000:] + r.stderr[-3000:]
    runs = {}
    for (template, step, out), res in zip(steps, results):
        print(f"{template} {step}: exit {res['code']} in {res['seconds']:.1f}s")
        runs[(template, step)] = {**res, "file": out}
    return runs


def _fill(source: Path, path: Path) -> Path:
    """The template with the required pipeline parameters filled in, as the editor's pipeline
    properties panel stores them."""
    doc = json.loads(source.read_text())
    filled = {"input_path": "s3://bucket/in", "work_root": "s3://bucket/work"}
    for pp in doc["pipelines"][0]["app_data"]["properties"]["pipeline_parameters"]:
        if pp["name"] in filled:
            pp["value"] = filled[pp["name"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _graph(tasks: dict, container, const) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """Each exported task as (stage or step, branch) -> the (stage or step, branch) it runs after."""
    def key(k):
        args = container(k)["args"]
        if args[0] == "run":  # a stage node: "run <transform> ..."
            return args[1], const(k, "branch")
        return args[0], ""  # a step: "<step> ..."

    keys = {k: key(k) for k in tasks}
    return {keys[k]: {keys[d] for d in t.get("dependentTasks", [])} for k, t in tasks.items()}


def _expected(template: str) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """The graph the compiled pipeline of the same name has: its stage order, ParallelFor bodies and
    steps, with the spec's languages as branches (a stage runs for the languages it runs for)."""
    from prepline.pipelines import spec as specs

    if template != "super":
        return {(template, ""): set()}
    spec = specs.shipped()
    compiled = next(d for d in yaml.safe_load_all((COMPILED / "super.yaml").read_text()) if d)
    tasks = compiled["root"]["dag"]["tasks"]
    by_dash = {t.replace("_", "-"): t for t in registry.names()}
    out, last = {}, {("plan", "")}
    chain = ["plan-run"]
    while True:
        nxt = [k for k, t in tasks.items() if t.get("dependentTasks") == [chain[-1]]]
        if not nxt:
            break
        chain.append(nxt[0])
    for k in chain[1:]:
        if "parameterIterator" in tasks[k]:
            body = compiled["components"][tasks[k]["componentRef"]["name"]]["dag"]["tasks"]
            names = [by_dash[n] for n in _order_names(body)]
            ends = set()
            for lang in spec.branches.languages:
                prev = last
                for n in names:
                    if spec.stage(n).runs_for(lang):
                        out[(n, lang)] = prev
                        prev = {(n, lang)}
                ends |= prev
            last = ends
        else:
            name = by_dash.get(k, k.replace("-run", "").replace("-", "_"))
            out[(name, "")] = last
            last = {(name, "")}
    out[("plan", "")] = set()
    return out


def _order_names(tasks: dict) -> list[str]:
    done, out = set(), []
    while len(out) < len(tasks):
        ready = sorted(n for n, t in tasks.items() if n not in done and set(t.get("dependentTasks", [])) <= done)
        done.add(ready[0])
        out.append(ready[0])
    return out


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("template", ["doc_id", "super"])
def test_elyra_validates_and_exports_with_our_stage_structure(template, elyra_runs):
    # input_path and work_root have no default (no /tmp): Elyra refuses the template until they are filled in
    r = elyra_runs[(template, "shipped")]
    assert r["code"] != 0 and "input_path" in r["stdout"] and "work_root" in r["stdout"] and "required" in r["stdout"], r["stdout"][-3000:]
    spec, tasks, container, const, out = _export(elyra_runs, template)
    assert _graph(tasks, container, const) == _expected(template)

    # the same run-id placeholder as the compiled pipelines, the launcher image (trainer image: fine_tune), no caching
    compiled_doc_id = (COMPILED / "doc_id.yaml").read_text()
    assert f"constant: '{RUN_ID_PLACEHOLDER}'" in compiled_doc_id
    ours = next(d for d in yaml.safe_load_all((COMPILED / f"{template}.yaml").read_text()) if d)
    for k, t in tasks.items():
        assert container(k)["image"] == (TRAINER_IMAGE if container(k)["args"][0] == "fine_tune" else LAUNCHER_IMAGE)
        assert const(k, "run_id") == RUN_ID_PLACEHOLDER
        assert not t.get("cachingOptions", {}).get("enableCache"), k
        assert tasks[k]["inputs"]["parameters"]["work_root"] == {"componentInputParameter": "work_root"}
        if container(k)["args"][0] == "run":
            for p in ("input_path", "provider", "provider_json", "cluster_json"):
                assert tasks[k]["inputs"]["parameters"][p] == {"componentInputParameter": p}
            # a super node takes its input, parameters and cluster from the run's plan (its branch: a constant)
            assert json.loads(const(k, "from_plan")) == (template == "super")
    # pipeline parameters: the compiled pipeline's names and defaults (the required ones: what was filled in)
    ours_params = ours["root"]["inputDefinitions"]["parameters"]
    filled = {"input_path": "s3://bucket/in", "work_root": "s3://bucket/work"}
    for p, d in spec["root"]["inputDefinitions"]["parameters"].items():
        if p == "s3_credentials":
            continue  # Elyra only: where the step reads its credentials file
        if p == "provider_json":  # Elyra writes defaults into Python source unescaped: '{}' (the provider's default server)
            assert d["defaultValue"] == "{}" and json.loads(ours_params[p]["defaultValue"])["server"]
            continue
        want = ours_params[p].get("defaultValue", filled.get(p))
        if isinstance(want, list):  # a list parameter is JSON in a String in Elyra (its List inputs do not survive export)
            assert json.loads(d["defaultValue"]) == want, p
            continue
        assert d["defaultValue"] == want, p
    # every custom node mounts the credentials claim (Elyra 4.1.1 applies Data Volumes to custom nodes, not secrets)
    platform = next(d for d in yaml.safe_load_all(out.read_text()) if d and "platforms" in d)
    k8s_execs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for k in tasks:
        label = spec["components"][tasks[k]["componentRef"]["name"]]["executorLabel"]
        mounts = k8s_execs[label]["pvcMount"]
        assert [(m["mountPath"], m.get("constant") or m.get("pvcNameParameter", {}).get("runtimeValue", {}).get("constant")) for m in mounts] \
            == [("/etc/prepline/s3", "prepline-s3-credentials")], mounts
        assert tasks[k]["inputs"]["parameters"]["s3_credentials"] == {"componentInputParameter": "s3_credentials"}


def _export(runs: dict, template: str):
    """The template (required parameters filled in) validated and exported by the real Elyra CLI;
    returns (KFP spec, root tasks, container-of-task, constant-of-task, the exported file)."""
    r = runs[(template, "validate")]
    assert r["code"] == 0 and "validation SUCCEEDED" in r["stdout"], r["stdout"][-4000:]
    r = runs[(template, "export")]
    out = r["file"]
    assert r["code"] == 0 and out.exists(), r["stdout"][-4000:]
    spec = next(d for d in yaml.safe_load_all(out.read_text()) if d)
    tasks = spec["root"]["dag"]["tasks"]
    execs = spec["deploymentSpec"]["executors"]

    def container(k):
        return execs[spec["components"][tasks[k]["componentRef"]["name"]]["executorLabel"]]["container"]

    def const(k, p):
        return tasks[k]["inputs"]["parameters"][p]["runtimeValue"]["constant"]

    return spec, tasks, container, const, out


@pytest.mark.slow
@pytest.mark.integration
def test_a_users_spec_compiles_to_a_template_elyra_validates(elyra_runs):
    """A spec with stages removed and one reordered (tests/pipelines/mine.yaml: test_local_run.py runs
    it end to end, test_spec.py compiles it with `prepline pipeline compile --elyra`): its template
    validates and exports with the real Elyra CLI, in the spec's order."""
    from prepline.pipelines import spec as specs

    mine = specs.load(ROOT / "tests" / "pipelines" / "mine.yaml")
    assert mine.order() == ["ingest", "lang_id", "filter", "doc_quality"]
    spec, tasks, container, const, _ = _export(elyra_runs, "mine")
    graph = _graph(tasks, container, const)
    assert graph[("doc_quality", "en")] == {("filter", "en")} and graph[("filter", "en")] == {("lang_id", "")}
    assert graph[("lang_id", "")] == {("ingest", "")} and graph[("ingest", "")] == {("plan", "")}
    assert graph[("check_documents", "")] == {("doc_quality", "en")} and graph[("run_report", "")] == {("check_documents", "")}
    assert len(graph) == 7  # no other stage, no fine_tune
