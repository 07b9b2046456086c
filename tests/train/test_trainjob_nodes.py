"""The realised TrainJob run for real on this machine: numNodes=2 torchrun processes with the PET_* env
Trainer's torch runtime gives, data-parallel (gloo on CPU), tokens from S3 and checkpoints to S3; the
loss falls as in one node's run, both ranks train; killing node 1 fails the job with a reason and a
rerun resumes from the last checkpoint on S3 (the same run in the lab: tests/lab/test_trainjob_lab.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))
import trainjob_drill as d  # noqa: E402

from prepline.train.nodes import descendants, kill_tree, local_spawn  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.s3]


def _secrets(s3_server) -> dict:
    return {d.SECRET: {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "PREPLINE_S3_ENDPOINT": s3_server}}


def test_two_local_nodes_train_data_parallel_and_resume_after_a_node_is_killed(s3_server, s3_bucket, tmp_path):
    tokens = d.make_tokens(s3_bucket, tmp_path)
    secrets = _secrets(s3_server)
    one, two = f"s3://{s3_bucket}/ft-1", f"s3://{s3_bucket}/ft-2"
    r1 = d.run(d.body(tokens, one, 1, "one"), local_spawn(), tmp_path / "logs-1", secrets, timeout=600)
    r2 = d.run(d.body(tokens, two, 2, "two"), local_spawn(), tmp_path / "logs-2", secrets, timeout=600)
    assert r1.condition == "Complete" and r2.condition == "Complete", (r1, r2)
    s1, s2 = d.summary(one), d.summary(two)
    assert s2["world_size"] == 2 and [(r["rank"], r["node_rank"], r["steps"]) for r in s2["ranks"]] == [(0, 0, 200), (1, 1, 200)]
    assert {r["host"] for r in s2["ranks"]} == set(r2.exit_codes)  # each rank in its own node (HOSTNAME = pod name)
    assert s2["initial_loss"] == pytest.approx(s1["initial_loss"], abs=1e-4)  # the same global batch, the same initial weights
    assert s2["final_loss"] <= 0.85 * s2["initial_loss"] and s1["final_loss"] <= 0.85 * s1["initial_loss"]
    assert abs(s2["final_loss"] - s1["final_loss"]) <= 0.05 * s1["final_loss"], (s1["final_loss"], s2["final_loss"])
    print(f"\n1 node: loss {s1['initial_loss']:.4f} -> {s1['final_loss']:.4f} in {r1.seconds:.1f} s; "
          f"2 nodes: {s2['initial_loss']:.4f} -> {s2['final_loss']:.4f} in {r2.seconds:.1f} s")

    # the drill: node 1 (its torchrun and its worker) killed once the step-20 checkpoint is on S3
    cut = f"s3://{s3_bucket}/ft-cut"

    killed: list[int] = []

    def kill(procs: dict) -> None:  # the host's processes: torchrun and its worker (in a session of its own)
        pid = procs[sorted(procs)[1]].pid
        killed.extend([pid, *descendants(pid)])
        kill_tree(pid)

    res, last = d.drill(tokens, cut, local_spawn(), tmp_path / "logs-cut", secrets, kill, timeout=600)
    assert res.condition == "Failed" and res.reason == "NodeFailed", res
    assert "node-0-1 was killed by signal 9" in res.message and res.exit_codes[sorted(res.exit_codes)[0]] != 0
    assert len(killed) >= 2 and 20 <= last < 200
    assert d.summary_or_none(cut) is None  # killed mid-training: no metrics.json
    assert not [p for p in killed if _alive(p)]
    again = d.run(d.body(tokens, cut, 2, "drill"), local_spawn(), tmp_path / "logs-again", secrets, timeout=600)
    assert again.condition == "Complete", again
    s = d.summary(cut)
    assert s["resumed_from"] == last and s["ranks"][1]["steps"] == 200 - last
    log0 = Path(again.logs[sorted(again.logs)[0]]).read_text()
    assert f"resuming from the checkpoint at step {last}" in log0
    assert d.losses(cut) == d.losses(two)  # the resumed run's curve is the uninterrupted 2-node run's
    print(f"drill: {res.message} after {res.seconds:.1f} s; resumed from step {last}, final loss {s['final_loss']:.4f}")


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
