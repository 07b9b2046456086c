"""What the lab tests share: making a lab or skipping (failing with PREPLINE_LAB=required), and
reading Ray's own records of where a job's tasks ran."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from lab import Lab, LabError, can_make_namespaces, http_get  # noqa: E402


HOSTS = ["launcher", "ray-0", "ray-1", "ray-2", "s3"]
PRE = str(ROOT / ".venv" / "bin" / "prepline")


def local_env() -> dict:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("AWS_", "PREPLINE_S3")):
            env.pop(k)
    return env


def ray_lab(tag: str, d: Path):
    """(For a module-scoped fixture.) A lab with S3 and a 3-node Ray cluster (credentials in the
    nodes' env only), the sample with doc ids uploaded to s3://lab/in: yields (lab, endpoint, d)
    where d/in is the same input on this machine's disk for the local reference runs."""
    lab = Lab(lab_name(tag))
    try:
        t0 = time.time()
        lab.up(HOSTS)
        endpoint = lab.start_s3()
        lab.start_ray("ray-0", ["ray-1", "ray-2"], num_cpus=1, env=Lab.s3_env(endpoint))
        lab.state["figures"] = {"lab_up_with_ray_s": round(time.time() - t0, 1)}
        upload_sample(endpoint, d)
        yield lab, endpoint, d
    finally:
        lab.down()


def upload_sample(endpoint: str, d: Path) -> None:
    """The bundled sample with doc ids at d/in (for local reference runs) and at s3://lab/in."""
    subprocess.run([PRE, "sample", "--output", str(d / "raw")], check=True, capture_output=True, env=local_env())
    subprocess.run([PRE, "run", "doc_id", "--input", str(d / "raw"), "--output", str(d / "in")], check=True,
                   capture_output=True, env=local_env())
    s3 = s3_of(endpoint)
    s3.create_bucket(Bucket="lab")
    for p in sorted((d / "in").glob("*.parquet")):
        s3.upload_file(str(p), "lab", f"in/{p.name}")


def local_tree(out: Path) -> dict[str, bytes]:
    """The Parquet files of a local stage output (the framework's own files left out), as s3_tree gives them."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.parquet")) if "_prepline" not in p.parts}


def s3_of(endpoint: str):
    import boto3

    from botocore.config import Config

    # no proxy of the caller's environment between this machine and the lab's S3 host
    return boto3.client("s3", endpoint_url=endpoint, config=Config(proxies={}), aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


def rows(files: dict[str, bytes]) -> dict[str, list]:
    out = {}
    for name, data in files.items():
        t = pq.read_table(io.BytesIO(data))
        out[name] = sorted(json.dumps(r, sort_keys=True, default=str) for r in t.to_pylist())
    return out


def s3_tree(endpoint: str, prefix: str) -> dict[str, bytes]:
    s3 = s3_of(endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="lab", Prefix=prefix + "/").get("Contents", [])]
    return {k[len(prefix) + 1:]: s3.get_object(Bucket="lab", Key=k)["Body"].read()
            for k in keys if k.endswith(".parquet") and "_prepline" not in k}


def run_on_lab(lab: Lab, endpoint: str, transform: str, out: str, timeout: float = 600) -> tuple[dict, float]:
    t0 = time.time()
    r = lab.run("launcher", ["python", str(ROOT / "tests" / "lab" / "submit_stage.py"), "http://ray-0:8265", transform,
                             "s3://lab/in", f"s3://lab/{out}", "3"], env=Lab.s3_env(endpoint), timeout=timeout)
    assert r.stdout.strip(), r.stderr[-4000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and result["status"] == "SUCCEEDED", (result, r.stderr[-4000:])
    return result, time.time() - t0


def require_lab() -> None:
    """Skip with the reason when namespaces cannot be made here; fail instead under PREPLINE_LAB=required."""
    why = can_make_namespaces()
    if why:
        if os.environ.get("PREPLINE_LAB") == "required":
            pytest.fail(f"PREPLINE_LAB=required but the lab cannot run: {why}")
        pytest.skip(f"lab: {why}")


def lab_name(tag: str) -> str:
    """A lab name (<= 8 chars) unique to this test process and tag (xdist workers run at once)."""
    return "t" + hashlib.sha256(f"{os.getpid()}-{tag}".encode()).hexdigest()[:7]


def _get(url: str) -> dict:
    with http_get(url, timeout=30) as r:
        return json.loads(r.read())


def job_task_hosts(lab: Lab, submission_id: str) -> dict[str, int]:
    """From the head's own records (job API, state API): node IP -> number of the job's tasks that
    ran there (the driver excluded)."""
    dash = lab.state["ray"]["dashboard"]
    job_id = _get(f"{dash}/api/jobs/{submission_id}")["job_id"]
    nodes = {n["node_id"]: n["node_ip"] for n in lab.ray_nodes()}
    tasks = _get(f"{dash}/api/v0/tasks?limit=10000&filter_keys=job_id&filter_predicates=%3D&filter_values={job_id}"
                 "&detail=1")["data"]["result"]["result"]
    where: dict[str, int] = {}
    for t in tasks:
        if t.get("type") == "DRIVER_TASK" or not t.get("node_id"):
            continue
        ip = nodes.get(t["node_id"], t["node_id"])
        where[ip] = where.get(ip, 0) + 1
    return where
