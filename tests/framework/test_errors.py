"""One error hierarchy, one exit-code mapping (documented in docs/reliability.md)."""

from __future__ import annotations

import errno
import re
from pathlib import Path

from prepline import errors
from prepline.errors import EXIT_CODES, exit_code


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
