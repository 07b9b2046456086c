"""A whole pipeline on the lab's hosts through its KubeRay control plane (``scripts/lab.py run``, and
tests/lab/test_lab_pipeline.py): the pipeline's real KFP components under kfp's local runner on the
launcher host, provider ``kuberay`` in namespace ``team-a``, every stage's RayCluster created through
the strict fake API server and realised on the ray hosts (tests/lab/lab_kuberay.py), input and work
folder on the S3 host, S3 credentials for the Ray pods from the secret ``prepline-s3`` of ``team-a``
(the pipeline's default ``s3_secret_name``). Optionally the same pipeline is run locally on the
same input (provider ``local``) and every stage's output is compared byte for byte."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "scripts", ROOT / "tests" / "clusters", ROOT / "tests" / "lab", ROOT / "tests" / "runtime_images"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from lab import Lab  # noqa: E402

PRE = str(ROOT / ".venv" / "bin" / "prepline")
NAMESPACE = "team-a"
SECRET = "prepline-s3"  # stage_params.DEFAULT_S3_SECRET
RAY_HOSTS = ("ray-0", "ray-1", "ray-2")
#: the data files of stage outputs (Parquet; the Megatron token files); not metadata.json or reports (timings)
COMPARED = (".parquet", ".bin", ".idx")


def _local_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PREPLINE_S3"))}


def _s3(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, config=Config(proxies={}), aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


def _tree_s3(endpoint: str, bucket: str, prefix: str) -> dict[str, bytes]:
    s3, out, token = _s3(endpoint), {}, None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/", **kw)
        for o in page.get("Contents", []):
            k = o["Key"]
            if k.endswith(COMPARED) and "/_prepline/" not in k:
                out[k[len(prefix) + 1:]] = s3.get_object(Bucket=bucket, Key=k)["Body"].read()
        token = page.get("NextContinuationToken")
        if not token:
            return out


def _tree_local(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.name.endswith(COMPARED) and "_prepline" not in p.parts}


def _fine_tune_summary(endpoint: str, tag: str) -> dict | None:
    """The trainer's own summary (metrics.json) of the fine-tune's output, from S3."""
    keys = [o["Key"] for o in _s3(endpoint).list_objects_v2(Bucket="lab", Prefix=f"{tag}-stages/").get("Contents", [])
            if o["Key"].endswith("/fine_tune/metrics.json")]
    if not keys:
        return None
    s = json.loads(_s3(endpoint).get_object(Bucket="lab", Key=keys[0])["Body"].read())
    return {k: s.get(k) for k in ("world_size", "initial_loss", "final_loss", "steps", "resumed_from")} | {
        "hosts": sorted({r.get("host") for r in s.get("ranks", [])})}


def _below_run(files: dict[str, bytes]) -> dict[str, bytes]:
    runs = {k.split("/", 1)[0] for k in files}
    assert len(runs) <= 1, f"more than one run in the work folder: {sorted(runs)}"
    return {k.split("/", 1)[1]: v for k, v in files.items()}


def _rows(data: bytes) -> list[str]:
    import pyarrow.parquet as pq

    return sorted(json.dumps(r, sort_keys=True, default=str) for r in pq.read_table(io.BytesIO(data)).to_pylist())


def compare(lab_files: dict[str, bytes], local_files: dict[str, bytes]) -> dict[str, dict]:
    """Per stage folder (the path up to the Parquet files): files, identical bytes, identical rows."""
    stages: dict[str, dict] = {}
    for name in sorted(set(lab_files) | set(local_files)):
        folder = str(Path(name).parent)
        s = stages.setdefault(folder, {"files": 0, "bytes_identical": True, "rows_identical": True, "missing": []})
        s["files"] += 1
        a, b = lab_files.get(name), local_files.get(name)
        if a is None or b is None:
            s["missing"].append(("lab" if a is None else "local") + ": " + Path(name).name)
            s["bytes_identical"] = s["rows_identical"] = False
        elif a != b:
            s["bytes_identical"] = False
            s["rows_identical"] = s["rows_identical"] and name.endswith(".parquet") and _rows(a) == _rows(b)
    return stages


def run(lab: Lab, pipeline: str, input_dir: Path, tag: str, params: list[str] = (), compare_local: Path | None = None,
        say=print, timeout: float = 3600, trainer_hosts: int = 0) -> dict:
    """Run ``pipeline`` in the lab on ``input_dir`` (uploaded to s3://lab/<tag>-input, work folder
    s3://lab/<tag>-stages): a shipped pipeline's compiled YAML (compiled/pipelines/<name>.yaml, as
    uploaded to KFP), else the pipeline or spec file given; the local comparison runs the pipeline by
    name, from the code, as scripts/main.sh does. Returns the
    outcome: exit code, seconds, per-cluster hosts and tasks per host (Ray's records), and with
    ``compare_local`` (a work folder) the local run's comparison. With ``trainer_hosts`` N, the
    fine-tune runs as a TrainJob of N nodes (``train_mode=cluster``) that the Kubernetes API stand-in
    (tests/train/fake_k8s.py, mode 'nodes') realises on hosts trainer-0..N-1, as torch.distributed
    over the lab's network."""
    from fake_kuberay import FakeKubeRay
    from lab_kuberay import LabKubeRay, trainer_spawn

    endpoint = lab.state.get("s3_endpoint") or lab.start_s3()
    s3 = _s3(endpoint)
    if "lab" not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
        s3.create_bucket(Bucket="lab")
    files = sorted(p for p in input_dir.rglob("*") if p.is_file() and "_truth" not in p.parts and not p.name.startswith("."))
    for p in files:
        s3.upload_file(str(p), "lab", f"{tag}-input/{p.relative_to(input_dir)}")
    from image_sets import image_vars, kind_of

    from prepline import images

    folder = lab.shared_dir("images")  # the allowed-package files, seen by every host at this path
    by_kind = {k: image_vars(k, folder) for k in images.NAMES}

    def ray_pod_image(image: str):
        return by_kind.get(kind_of(image) or "")  # None: not an image the lab has -> the pod never starts

    by_image = folder / "task_env_by_image.json"  # every KFP task on the launcher in its image's package set
    by_image.write_text(json.dumps({images.NAMES[k]: v for k, v in by_kind.items()}))
    realiser = LabKubeRay(lab, hosts=RAY_HOSTS, images=ray_pod_image)
    fake = FakeKubeRay(bind=lab.gateway, realise=realiser, dashboard_lag=0, secrets={(NAMESPACE, SECRET): Lab.s3_env(endpoint)}).start()
    provider = json.dumps({"server": fake.url, "namespace": NAMESPACE})
    # what a user uploads: a shipped pipeline runs from its compiled YAML, unchanged (parameters only)
    compiled = ROOT / "compiled" / "pipelines" / f"{pipeline}.yaml"
    argv = ["prepline", "pipeline", "run", str(compiled) if compiled.is_file() else pipeline, "--local", "--work-root", "/tmp/w", "--input", f"s3://lab/{tag}-input",
            "--param", "provider=kuberay", "--param", f"provider_json={provider}", "--param", f"work_root=s3://lab/{tag}-stages",
            "--param", "start_timeout_seconds=300"]
    k8s = None
    if trainer_hosts:
        sys.path.insert(0, str(ROOT / "tests" / "train"))
        from fake_k8s import FakeK8s

        k8s = FakeK8s(mode="nodes", bind=lab.gateway).__enter__()
        k8s.spawn_for, k8s.node_base_env = (lambda job: trainer_spawn(lab, job, NAMESPACE)), dict(by_kind["trainer"])
        k8s.log_dir = lab.scratch_root / "trainjob-logs"
        k8s.secrets[(NAMESPACE, SECRET)] = Lab.s3_env(endpoint)
        k8s.kubeconfig(lab.scratch("launcher"), NAMESPACE)  # the launcher's /tmp/kubeconfig.yaml
        trainjob = {"kubeconfig": "/tmp/kubeconfig.yaml", "namespace": NAMESPACE, "num_nodes": trainer_hosts, "s3_secret": SECRET,
                    "env": {"OMP_NUM_THREADS": "1"}, "poll_seconds": 1}
        argv += ["--param", "train_mode=cluster", "--param", f"trainjob_json={json.dumps(trainjob)}"]
    for p in params:
        argv += ["--param", p]
    say(f"lab: {pipeline} on the launcher host, provider kuberay (API server {fake.url}), namespace {NAMESPACE}, input s3://lab/{tag}-input")
    t0 = time.time()
    try:
        # the launcher's own process (kfp's local runner) has the launcher image's set; each task its own image's
        env = {**Lab.s3_env(endpoint), **by_kind["launcher"], "PREPLINE_TASK_ENV_BY_IMAGE": str(by_image)}
        proc = lab.popen("launcher", argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        for line in proc.stdout:
            say(line.rstrip("\n"))
            tail = (tail + [line])[-200:]
        code = proc.wait(timeout=timeout)
    finally:
        realiser.close()
        fake.stop()
        if k8s is not None:
            k8s.__exit__(None, None, None)
    seconds = time.time() - t0
    clusters = {}
    for (ns, name), rec in realiser.records.items():
        clusters[name] = {"namespace": ns, "hosts": sorted(rec["nodes"]), "tasks_per_host": rec["tasks"],
                          "jobs": [j["status"] for j in rec["jobs"]], **({"error": rec["error"]} if "error" in rec else {})}
    out = {"pipeline": pipeline, "ran": argv[3], "exit_code": code, "seconds": round(seconds, 1), "clusters": clusters,
           "created": len([c for c in fake.calls("POST", "/rayclusters") if c.status == 201]),
           "deleted": len([c for c in fake.calls("DELETE") if c.status == 200]),
           "left_on_hosts": {h: len(lab.pids(h)) for h in (*RAY_HOSTS, *(f"trainer-{i}" for i in range(trainer_hosts))) if lab.pids(h)},
           "tail": "".join(tail[-40:])}
    if k8s is not None:
        out["trainjobs"] = {"created": [j["metadata"]["name"] for j in k8s.created], "deleted": list(k8s.deleted),
                            "results": {n: getattr(r, "condition", str(r)) for n, r in k8s.results.items()}}
        out["fine_tune"] = _fine_tune_summary(endpoint, tag)
    if compare_local is not None and code == 0:
        t1 = time.time()
        r = subprocess.run([PRE, "pipeline", "run", pipeline, "--local", "--work-root", str(compare_local), "--input", str(input_dir),
                            *[x for p in params for x in ("--param", p)]],
                           capture_output=True, text=True, env=_local_env())
        out["local"] = {"exit_code": r.returncode, "seconds": round(time.time() - t1, 1), "tail": (r.stdout + r.stderr)[-3000:]}
        if r.returncode == 0:
            lab_files = _tree_s3(endpoint, "lab", f"{tag}-stages")
            local_files = _tree_local(compare_local / "stages")
            # one run under each work folder; its run id (kfp's) differs: compare below it
            out["stages"] = compare(_below_run(lab_files), _below_run(local_files))
    return out


def problems(out: dict) -> list[str]:
    """What is wrong with a lab run's outcome (empty: it ran through the control plane on >= 2 hosts
    per stage, deleted every cluster, left nothing behind and, when compared, matched the local run)."""
    bad = []
    if out["exit_code"] != 0:
        bad.append(f"the pipeline exited with {out['exit_code']}")
    for name, c in out["clusters"].items():
        used = [h for h, n in c["tasks_per_host"].items() if n > 0]
        if c["jobs"] and len(used) < 2:
            bad.append(f"cluster {name}: its job's tasks ran on {used} only")
        if "error" in c:
            bad.append(f"cluster {name}: Ray's records could not be read ({c['error']})")
    if out["created"] != out["deleted"]:
        bad.append(f"{out['created']} clusters created, {out['deleted']} deleted")
    if out["left_on_hosts"]:
        bad.append(f"processes left on {out['left_on_hosts']}")
    if "trainjobs" in out:
        t, ft = out["trainjobs"], out.get("fine_tune") or {}
        if not t["created"] or set(t["created"]) != set(t["deleted"]):
            bad.append(f"TrainJobs created {t['created']}, deleted {t['deleted']}")
        if any(v != "Complete" for v in t["results"].values()):
            bad.append(f"TrainJob results {t['results']}")
        if not ft or not ft.get("world_size") or ft["world_size"] < 2 or not ft["final_loss"] < ft["initial_loss"]:
            bad.append(f"the fine-tune's summary: {ft}")
    if "local" in out and out["local"]["exit_code"] != 0:
        bad.append("the local run failed")
    for folder, s in (out.get("stages") or {}).items():
        if not s["bytes_identical"]:
            bad.append(f"{folder}: differs from the local run (rows identical: {s['rows_identical']}; missing: {s['missing'][:3]})")
    return bad
