"""exact_dedup and fuzzy_dedup on a real 3-node Ray cluster in the lab (docs/lab.md): the job is
submitted from the launcher host to the head's job API as the execute step submits it, input and
output on the lab's S3 host, credentials only in the Ray nodes' and launcher's environment; the
output is the local run's, and Ray's own records show the tasks on more than one host."""

from __future__ import annotations

import subprocess

import pytest

from labkit import PRE, job_task_hosts, local_env, ray_lab, require_lab, rows, run_on_lab, s3_tree

pytestmark = [pytest.mark.lab, pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A lab with S3 and a 3-node Ray cluster, the sample (with doc ids) uploaded: (lab, endpoint, local input)."""
    require_lab()
    yield from ray_lab("ray", tmp_path_factory.mktemp("labray"))


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
