"""A local pipeline task that fails with prepline's error prints that error and its fix, not kfp's
executor dump and traceback (issue 25); its whole output stays in task.log."""

from __future__ import annotations

import json
import sys

from prepline.kfp import local_tasks


def _command(tmp_path, code: str) -> list[str]:
    out = tmp_path / "plan-run" / "executor_output.json"
    return [sys.executable, "-c", code, "--executor_input", json.dumps({"outputs": {"outputFile": str(out)}})]


def test_a_prepline_error_is_printed_as_error_and_fix(tmp_path, capsys):
    local_tasks.FAILURES.clear()
    code = ("print('executor_input: {...}'); from prepline.errors import InputError; "
            "raise InputError('input /x does not exist', 'pass input_path: a folder that exists')")
    assert local_tasks.run_task(_command(tmp_path, code)) != 0
    out = capsys.readouterr().out
    assert "error in task plan-run: input /x does not exist\n  fix: pass input_path: a folder that exists" in out
    assert "Traceback" not in out and "executor_input" not in out
    log = (tmp_path / "plan-run" / "task.log").read_text()
    assert "Traceback" in log and "executor_input" in log
    (f,) = local_tasks.FAILURES
    assert (f.task, f.kind, f.message, f.fix) == ("plan-run", "InputError", "input /x does not exist", "pass input_path: a folder that exists")
    local_tasks.FAILURES.clear()


def test_any_other_failure_shows_the_end_of_its_log(tmp_path, capsys):
    local_tasks.FAILURES.clear()
    assert local_tasks.run_task(_command(tmp_path, "raise ValueError('boom')")) != 0
    out = capsys.readouterr().out
    assert "the last lines of the task's log" in out and "ValueError: boom" in out
    assert local_tasks.FAILURES == []


def test_an_error_of_any_prepline_module_is_printed_as_error_and_fix(tmp_path, capsys):
    """The cluster errors live in prepline.clusters.* (a head lost mid-job: ClusterError): before, only
    prepline.errors.* was recognised and such a task ended in its traceback and kfp's generic FAILURE."""
    local_tasks.FAILURES.clear()
    code = ("from prepline.clusters.base import ClusterError; "
            "raise ClusterError('exact_dedup: the Ray head of cluster c stopped answering', 'rerun: it resumes')")
    assert local_tasks.run_task(_command(tmp_path, code)) != 0
    out = capsys.readouterr().out
    assert "error in task plan-run: exact_dedup: the Ray head of cluster c stopped answering\n  fix: rerun: it resumes" in out
    (f,) = local_tasks.FAILURES
    assert (f.kind, f.fix) == ("ClusterError", "rerun: it resumes")
    local_tasks.FAILURES.clear()


def test_a_task_runs_with_the_variables_given_for_its_image(tmp_path, monkeypatch, capsys):
    """PREPLINE_TASK_ENV_BY_IMAGE (the lab's per-image package sets): by the image's name, any registry
    and tag; an image the file does not name is refused rather than run with an undeclared set."""
    (tmp_path / "by_image.json").write_text(json.dumps({"prepline-launcher": {"PL_SEEN": "launcher"}}))
    monkeypatch.setenv(local_tasks.ENV_TASK_ENV_BY_IMAGE, str(tmp_path / "by_image.json"))
    assert local_tasks.image_env("registry.example:5000/team/prepline-launcher:1.2") == {"PL_SEEN": "launcher"}
    # the image a pipeline parameter: kfp.local leaves the placeholder, the executor input has the value
    local_tasks._TASK.image = "{{$.inputs.parameters['pipelinechannel--launcher_image']}}"
    try:
        code = "import os, sys; sys.exit(0 if os.environ.get('PL_SEEN') == 'launcher' else 3)"
        cmd = _command(tmp_path, code)
        executor_input = json.loads(cmd[-1])
        executor_input["inputs"] = {"parameterValues": {"pipelinechannel--launcher_image": "ghcr.io/prepline/prepline-launcher:0.1.0"}}
        cmd[-1] = json.dumps(executor_input)
        assert local_tasks.run_task(cmd) == 0
    finally:
        local_tasks._TASK.image = ""
    import pytest

    with pytest.raises(RuntimeError, match="no environment for image ghcr.io/prepline/prepline-trainer"):
        local_tasks.image_env("ghcr.io/prepline/prepline-trainer:0.1.0")
    monkeypatch.delenv(local_tasks.ENV_TASK_ENV_BY_IMAGE)
    assert local_tasks.image_env("ghcr.io/prepline/prepline-trainer:0.1.0") == {}
