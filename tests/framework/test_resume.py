"""A run killed at a random moment (mid-write too) resumes and ends with the same bytes as an uninterrupted run.

Every transform is also killed at a chosen point in each of its phases by the contract test
(tests/transforms/test_contract.py); this one kills by the clock, with two worker processes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import kill_when, make_corpus, tree_bytes
from prepline.engine import RunOptions, run_transform


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "prepline.cli", *args, "--no-progress", "--workers", "2"]


@pytest.mark.slow
def test_killed_run_resumes_to_identical_output(tmp_path):
    src = make_corpus(tmp_path / "in", files=30, seed=11)
    ids = tmp_path / "ids"
    run_transform("doc_id", {}, RunOptions(str(src), str(ids), workers=2))
    ref = tmp_path / "ref"
    run_transform("exact_dedup", {"num_shards": 8}, RunOptions(str(ids), str(ref), workers=1))

    out = tmp_path / "out"
    args = _cli("run", "exact_dedup", "--input", str(ids), "--output", str(out), "--num-shards", "8")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    killed_at = kill_when(proc, out / "_prepline" / "markers" / "hash", 3)  # while other tasks are running
    assert not (out / "metadata.json").exists()

    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["phases"]["hash"]["resumed"] >= killed_at  # the finished work was not redone
    assert tree_bytes(out) == tree_bytes(ref)
    assert meta["totals"]["removed"] == json.loads((ref / "metadata.json").read_text())["totals"]["removed"]
    assert not list(out.rglob(".*.tmp-*"))  # no temp litter


def test_unfinished_run_with_other_parameters_is_not_mixed(tmp_path, corpus):
    ids = tmp_path / "ids"
    run_transform("doc_id", {}, RunOptions(str(corpus), str(ids)))
    out = tmp_path / "out"
    (out / "_prepline").mkdir(parents=True)
    (out / "_prepline" / "run.json").write_text(json.dumps({"fingerprint": "something-else"}))
    from prepline.errors import ConfigError

    with pytest.raises(ConfigError, match="unfinished run with other input or parameters"):
        run_transform("exact_dedup", {}, RunOptions(str(ids), str(out)))
