"""One error hierarchy, one exit-code mapping (documented in docs/reliability.md)."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from prepline import errors
from prepline.errors import EXIT_CODES, ConfigError, exit_code, user_message


def test_every_family_has_its_documented_code():
    assert exit_code(errors.ConfigError("x")) == 2
    assert exit_code(errors.InputError("x")) == 6
    assert exit_code(errors.OutputLocked("x")) == 7
    assert exit_code(errors.ServiceUnavailable("x")) == 5 and errors.ServiceUnavailable("x").transient
    assert exit_code(errors.RunFailed("x")) == 1
    assert exit_code(errors.TimedOut("x")) == 4
    assert exit_code(errors.Interrupted("x")) == 130 and exit_code(KeyboardInterrupt()) == 130
    assert exit_code(errors.Terminated("x")) == 143
    assert exit_code(ValueError("bug")) == 70
    from prepline.clusters.base import ClusterError
    from prepline.kfp.client import KfpError, KfpTimeout

    assert exit_code(KfpError("x")) == exit_code(ClusterError("x")) == 5 and exit_code(KfpTimeout("x")) == 4


def test_the_docs_table_lists_every_exit_code():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    for code in EXIT_CODES:
        assert re.search(rf"^\| {code} \|", doc, re.M), f"exit code {code} is not in docs/reliability.md"


def test_os_errors_become_output_errors_with_the_fix():
    e = errors.os_error(OSError(errno.ENOSPC, "No space left on device", "/data/out/a.parquet"), "/data/out")
    assert isinstance(e, errors.OutputError) and "/data/out/a.parquet" in e.message and "rerun" in e.fix
    assert "a bug" in errors.user_message(ValueError("x")) and "error: unexpected ValueError" in errors.user_message(ValueError("x"))


@pytest.mark.s3
def test_s3_settings_a_user_gets_wrong_are_usage_errors_never_bugs(s3_server, tmp_path, corpus, monkeypatch):
    """Issue 30 finding 9: AWS_PROFILE=nope, an endpoint without http://, an invalid bucket name all
    ended as exit 70 "this is a bug"."""
    import subprocess
    import sys

    def run(*args: str, **env: str) -> tuple[int, str]:
        e = {**os.environ, "PREPLINE_S3_MAX_ATTEMPTS": "1", **env}
        r = subprocess.run([sys.executable, "-m", "prepline.cli", "run", "doc_id", *args, "--workers", "1", "--no-progress"],
                           env=e, capture_output=True, text=True, timeout=300)
        return r.returncode, r.stderr

    out = str(tmp_path / "o")
    cases = {
        "profile": (("--input", "s3://bucket/in", "--output", out), {"AWS_PROFILE": "nope"}, "AWS_PROFILE='nope'"),
        "endpoint": (("--input", "s3://bucket/in", "--output", out), {"PREPLINE_S3_ENDPOINT": s3_server.split("://")[1]}, "not a URL"),
        "bucket in": (("--input", "s3://bad!bucket/in", "--output", out), {}, "not a valid S3 bucket name"),
        "bucket out": (("--input", str(corpus), "--output", "s3://bad!bucket/o"), {}, "not a valid S3 bucket name"),
    }
    for name, (args, env, said) in cases.items():
        code, err = run(*args, **env)
        assert code == 2, (name, err)
        assert said in err and "fix:" in err and "this is a bug" not in err and "Traceback" not in err, (name, err)
    # without an endpoint (AWS itself), AWS's naming rules are checked before any request
    monkeypatch.delenv("PREPLINE_S3_ENDPOINT")
    from prepline.data_access import open_location

    for bad in ("Bad_Bucket", "ab", "a..b", "192.168.0.1"):
        with pytest.raises(ConfigError, match="not a valid S3 bucket name"):
            open_location(f"s3://{bad}/x")


def test_library_errors_that_users_cause_are_usage_errors():
    from botocore.exceptions import ParamValidationError, ProfileNotFound

    for e in (ProfileNotFound(profile="nope"), ParamValidationError(report="Invalid bucket name \"a!b\""), ValueError("Invalid endpoint: h:9")):
        assert exit_code(e) == 2 and "this is a bug" not in user_message(e) and "fix:" in user_message(e)
    assert exit_code(RuntimeError("boom")) == 70
