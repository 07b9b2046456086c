"""The allocator transforms run with: mimalloc preloaded by `prepline run` where it is installed
(scripts/setup.sh installs Debian's libmimalloc2.0), the system allocator when asked or missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.errors import ConfigError
from prepline.runtime import allocator


def test_the_library_is_found_and_the_choice_is_the_users(tmp_path):
    lib = allocator.library({})
    assert lib is not None and os.path.isfile(lib) and "libmimalloc" in lib, "scripts/setup.sh installs libmimalloc2.0"
    assert allocator.preload_env({}) == {"LD_PRELOAD": lib}
    assert allocator.library({allocator.ENV: "system"}) is None and allocator.preload_env({allocator.ENV: "system"}) == {}
    own = tmp_path / "libother.so"
    own.write_bytes(b"")
    assert allocator.preload_env({allocator.ENV: str(own)}) == {"LD_PRELOAD": str(own)}
    # a preload the user set is theirs: nothing is added
    assert allocator.preload_env({"LD_PRELOAD": "/opt/libjemalloc.so"}) == {}
    with pytest.raises(ConfigError, match="no such file") as e:
        allocator.library({allocator.ENV: str(tmp_path / "missing.so")})
    assert "mimalloc, system" in e.value.fix


def _run(tmp_path, env_extra: dict, *global_opts: str) -> dict:
    src = tmp_path / "in"
    src.mkdir(exist_ok=True)
    pq.write_table(pa.table({"contents": [f"document {i} " * 20 for i in range(50)]}), src / "a.parquet")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.ENV, allocator._DONE)} | env_extra
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "prepline.cli", *global_opts, "run", "doc_id", "--input", str(src), "--output", str(out), "--workers", "2", "--overwrite"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "metadata.json").read_text())


@pytest.mark.slow
def test_prepline_run_starts_again_on_mimalloc_once_and_records_it(tmp_path):
    meta = _run(tmp_path, {}, "--log-format", "json")
    assert meta["versions"]["allocator"] == "mimalloc" and meta["status"] == "success"
    assert meta["totals"]["docs_out"] == 50
    assert _run(tmp_path, {allocator.ENV: "system"})["versions"]["allocator"] == "system"
    # a command already started with it is not started again (the marker), and a user's own preload stays
    assert _run(tmp_path, {"LD_PRELOAD": allocator.library({})})["versions"]["allocator"] == "mimalloc"


def test_the_current_allocator_is_read_from_the_process(tmp_path):
    code = "from prepline.runtime.allocator import current; print(current())"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()
    pre = subprocess.run([sys.executable, "-c", code], env=env | {"LD_PRELOAD": allocator.library({})}, capture_output=True, text=True, check=True).stdout.strip()
    assert (plain, pre) == ("system", "mimalloc")


def test_processes_started_for_ray_do_not_inherit_the_preload(monkeypatch):
    """Ray's own processes keep the system allocator: a local Ray started by a preloaded run does
    not inherit the preload the run added; a user's own LD_PRELOAD is theirs and stays."""
    lib = allocator.library({})
    monkeypatch.setenv("LD_PRELOAD", lib)
    monkeypatch.setenv(allocator._DONE, "1")
    with allocator.not_inherited():
        assert "LD_PRELOAD" not in os.environ
    assert os.environ["LD_PRELOAD"] == lib
    monkeypatch.delenv(allocator._DONE)
    with allocator.not_inherited():
        assert os.environ["LD_PRELOAD"] == lib
