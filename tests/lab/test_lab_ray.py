"""exact_dedup and fuzzy_dedup on a real 3-node Ray cluster in the lab (docs/lab.md): the job is
submitted from the launcher host to the head's job API as the execute step submits it, input and
output on the lab's S3 host, credentials only in the Ray nodes' and launcher's environment; the
output is the local run's, and Ray's own records show the tasks on more than one host."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from labkit import ROOT, Lab, job_task_hosts, lab_name, require_lab

pytestmark = [pytest.mark.lab, pytest.mark.ray, pytest.mark.slow]

HOSTS = ["launcher", "ray-0", "ray-1", "ray-2", "s3"]
PRE = str(ROOT / ".venv" / "bin" / "prepline")


def local_env() -> dict:
    import os

    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("AWS_", "PREPLINE_S3")):
            env.pop(k)
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A lab with S3 and a 3-node Ray cluster, the sample (with doc ids) uploaded: (lab, endpoint, local input)."""
    require_lab()
    lab = Lab(lab_name("ray"))
    try:
        t0 = time.time()
        lab.up(HOSTS)
        endpoint = lab.start_s3()
        lab.start_ray("ray-0", ["ray-1", "ray-2"], num_cpus=1, env=Lab.s3_env(endpoint))
        lab.state["figures"] = {"lab_up_with_ray_s": round(time.time() - t0, 1)}
        d = tmp_path_factory.mktemp("labray")
        subprocess.run([PRE, "sample", "--output", str(d / "raw")], check=True, capture_output=True, env=local_env())
        subprocess.run([PRE, "run", "doc_id", "--input", str(d / "raw"), "--output", str(d / "in")], check=True,
                       capture_output=True, env=local_env())
        s3 = s3_of(endpoint)
        s3.create_bucket(Bucket="lab")
        for p in sorted((d / "in").glob("*.parquet")):
            s3.upload_file(str(p), "lab", f"in/{p.name}")
        yield lab, endpoint, d
    finally:
        lab.down()


def s3_of(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1")


def rows(files: dict[str, bytes]) -> dict[str, list]:
    import io

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


@pytest.mark.parametrize("transform", ["exact_dedup", "fuzzy_dedup"])
def test_stage_on_three_ray_hosts_matches_local(cluster, transform, tmp_path):
    lab, endpoint, d = cluster
    # the Ray hosts cannot see the launcher's (or this test's) disk
    assert lab.run("ray-1", ["ls", str(d / "in")]).returncode != 0
    result, seconds = run_on_lab(lab, endpoint, transform, transform)
    local = tmp_path / "local"
    subprocess.run([PRE, "run", transform, "--input", str(d / "in"), "--output", str(local)], check=True,
                   capture_output=True, env=local_env())
    want = {str(p.relative_to(local)): p.read_bytes() for p in sorted(local.rglob("*.parquet")) if "_prepline" not in p.parts}
    got = s3_tree(endpoint, transform)
    assert sorted(got) == sorted(want)
    assert rows(got) == rows(want)
    assert got == want  # the same bytes, not only the same rows
    where = job_task_hosts(lab, result["submission_id"])
    print(f"{transform}: lab up with Ray {lab.state['figures']['lab_up_with_ray_s']}s; {seconds:.1f}s on the lab, tasks per host {where}, bytes identical: {got == want}")
    assert len([ip for ip in where if ip in {lab.ip(h) for h in ('ray-0', 'ray-1', 'ray-2')}]) >= 2, where
