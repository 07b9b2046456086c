"""The super pipeline on the lab's hosts (docs/lab.md), run from its compiled YAML (compiled/pipelines/super.yaml, what users upload, parameters only): every stage's RayCluster created through the
KubeRay control plane and realised on the ray hosts, the job on at least two of them (Ray's own task
records), every cluster deleted by its exit handler, nothing left on any host, and every stage's
output files (Parquet, Megatron tokens) byte-identical to a local run of the same pipeline on the
same input; the fine-tune a TrainJob of 2 nodes realised on the trainer hosts (torch.distributed over
the lab's network), its loss falling. ``scripts/lab.py run super --compare DIR`` does the same from
the command line."""

from __future__ import annotations

import json
import subprocess

import pytest

from labkit import HOSTS, PRE, Lab, lab_name, local_env, require_lab

pytestmark = [pytest.mark.lab, pytest.mark.ray, pytest.mark.slow]


def test_super_pipeline_through_the_control_plane_matches_the_local_run(tmp_path):
    require_lab()
    import lab_pipeline

    subprocess.run([PRE, "sample", "--docs", "1000", "--output", str(tmp_path / "sample")], check=True, capture_output=True,
                   env=local_env())
    lab = Lab(lab_name("super"))
    try:
        lab.up([*HOSTS, "trainer-0", "trainer-1"])
        out = lab_pipeline.run(lab, "super", tmp_path / "sample", "super", ["languages=en"], compare_local=tmp_path / "local",
                               say=lambda line: None, trainer_hosts=2)
    finally:
        lab.down()
    print(f"lab super: {out['seconds']}s, local {out.get('local', {}).get('seconds')}s; clusters created {out['created']}, "
          f"deleted {out['deleted']}")
    for name, c in out["clusters"].items():
        print(f"  {name}: hosts {c['hosts']}, tasks per host {c['tasks_per_host']}, jobs {c['jobs']}")
    for folder, s in sorted((out.get("stages") or {}).items()):
        print(f"  {folder}: {s['files']} files, identical: {s['bytes_identical']}")
    print(f"  TrainJobs {out['trainjobs']}; fine-tune {out['fine_tune']}")
    assert out["exit_code"] == 0, out["tail"]
    assert out["ran"].endswith("compiled/pipelines/super.yaml"), out["ran"]  # the YAML users upload, unchanged
    assert not lab_pipeline.problems(out), (lab_pipeline.problems(out), out.get("local", {}).get("tail"))
    folders = set(out["stages"])
    for stage in ("doc_id", "exact_dedup", "fuzzy_dedup", "line_dedup", "lang_id"):
        assert any(f.split("/")[0] == stage for f in folders), (stage, sorted(folders))
    assert any("tokens" in f or f.endswith(".bin") or "tokenization" in f for f in folders), sorted(folders)
    assert len(out["clusters"]) >= 10 and out["created"] == out["deleted"] == len(out["clusters"])
    ft = out["fine_tune"]
    assert ft["world_size"] == 2 and ft["final_loss"] < ft["initial_loss"], ft
