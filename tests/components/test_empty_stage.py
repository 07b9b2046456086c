"""A pipeline stage that removes every document fails like `prepline run` does (its error and fix,
not "Ray job FAILED"), unless overrides_json allows it for that stage or branch (issue 25)."""

from __future__ import annotations

import json

import pytest

from prepline import stages
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, RunFailed
from prepline.pipelines import spec as specs
from prepline.pipelines.plan import make_plan
from prepline.stage_params import check_overrides


def test_overrides_allow_an_empty_output_per_stage_and_branch(tmp_path):
    o = json.dumps({"filter": {"allow_empty_output": True, "branches": {"ja": {"allow_empty_output": False}}}})
    check_overrides(o)
    args = dict(transform="filter", params_json='{"criteria": ["1=1"]}', work_root=str(tmp_path), run_id="r", stage="filter",
                input_path="/i", overrides_json=o)
    assert stages.prepare(**args)["allow_empty_output"] is True
    assert stages.prepare(**args, branch="ja")["allow_empty_output"] is False
    assert stages.prepare(**{**args, "overrides_json": "{}"})["allow_empty_output"] is False
    assert "--allow-empty-output" in stages.entrypoint("filter", "{}", "/i", "/o", 1, 0, allow_empty_output=True)
    assert "--allow-empty-output" not in stages.entrypoint("filter", "{}", "/i", "/o", 1, 0)
    with pytest.raises(ConfigError, match="'allow_empty_output' must be true or false"):
        check_overrides(json.dumps({"filter": {"allow_empty_output": "yes"}}))


def test_the_plan_carries_the_setting_to_the_stage(tmp_path):
    spec = specs.load({"name": "mini", "stages": ["doc_id", "filter"]})
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.parquet").write_bytes(b"")
    plan = make_plan(spec, input_path=str(tmp_path / "in"), work_root=str(tmp_path / "w"), run_id="r", input_format="parquet",
                     overrides={"filter": {"allow_empty_output": True, "params": {"criteria": ["1=1"]}}})
    by_stage = {e["stage"]: e for e in plan["entries"]}
    assert by_stage["filter"]["allow_empty_output"] is True and "allow_empty_output" not in by_stage["doc_id"]


def test_a_failed_job_reports_the_error_its_metadata_records(tmp_path, corpus):
    out = tmp_path / "o"
    with pytest.raises(RunFailed):
        run_transform("filter", {"criteria": ["1=0"]}, RunOptions(str(corpus), str(out), progress=False))
    e = stages.job_error(str(out), "filter", "Ray job x FAILED")
    assert isinstance(e, RunFailed) and e.message.startswith("filter removed all 10 input documents")
    assert 'overrides_json: {"filter": {"allow_empty_output": true}}' in e.fix and "--allow-empty-output" not in e.fix
    e = stages.job_error(str(tmp_path / "nothing"), "filter", "Ray job x FAILED: oom")
    assert e.message == "filter: Ray job x FAILED: oom"


def test_a_branch_whose_language_has_no_document_says_so_before_its_cluster_starts(tmp_path):
    from prepline.errors import InputError
    from prepline.pipelines.plan import write_plan

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.parquet").write_bytes(b"")
    spec = specs.load({"name": "mini", "stages": ["lang_id"], "branches": {"languages": ["en", "fr"], "stages": ["doc_id"]}})
    plan = make_plan(spec, input_path=str(tmp_path / "in"), work_root=str(tmp_path / "w"), run_id="r", input_format="parquet")
    write_plan(plan)
    en = tmp_path / "w" / "r" / "lang_id" / "lang=en"
    en.mkdir(parents=True)
    (en / "a.parquet").write_bytes(b"x")
    assert stages.prepare("doc_id", "{}", str(tmp_path / "w"), "r", "doc_id", "en", from_plan=True)["run"]
    with pytest.raises(InputError) as e:
        stages.prepare("doc_id", "{}", str(tmp_path / "w"), "r", "doc_id", "fr", from_plan=True)
    assert "doc_id (fr): lang_id found no document in language 'fr'" in e.value.message
    assert "leave fr out of the pipeline's languages parameter" in e.value.fix


def test_a_job_refused_before_its_metadata_reports_what_prepline_run_said(tmp_path, corpus):
    """A stage refused at its schema check (url_filter on input without `url`) writes no metadata.json:
    the step reported only Ray's 'Job entrypoint command failed with exit code 6' and an empty fix.
    Now the error and fix that `prepline run` printed, from the log tail Ray puts in the job's message."""
    import os
    import subprocess
    import sys

    from prepline.errors import InputError

    r = subprocess.run([sys.executable, "-m", "prepline.cli", "run", "url_filter", "--input", str(corpus), "--output",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 6
    # Ray's JobInfo.message of a failed entrypoint, as the installed Ray wrote it in a local pipeline run,
    # and as newer Ray's python/ray/dashboard/modules/job/job_supervisor.py words it
    for head in ("Job entrypoint command failed with exit code 6, last available logs (truncated to 20,000 chars):\n",
                 "Job entrypoint command failed with exit code 6. Last available logs (truncated to 20,000 chars):\n"):
        e = stages.job_error(str(tmp_path / "o"), "url_filter", "Ray job x FAILED: " + head + r.stdout + r.stderr)
        assert isinstance(e, InputError), e
        assert e.message.startswith("url_filter: ") and "column 'url' is missing" in e.message and "\n" not in e.message
        assert "url_column" in e.fix
