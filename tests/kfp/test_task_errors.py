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
