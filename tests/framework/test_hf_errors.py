"""hf:// errors a user can act on are input errors with a fix (exit 6), not "unexpected ... (this is a
bug)", exit 70 (issue 25, item 5). Real huggingface_hub: offline mode, and a Hub endpoint on a local
port nobody listens on (connection refused; no traffic leaves the machine)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the test uses it: connection refused


def _ingest(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prepline.cli", "run", "ingest", "--input", "hf://datasets/someone/corpus",
                           "--output", str(tmp_path / "o"), "--no-progress"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def _one_error(p: subprocess.CompletedProcess) -> tuple[str, str]:
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), p.stderr
    assert "this is a bug" not in p.stderr and "unexpected" not in p.stderr
    return lines[0], lines[1]


def test_offline_mode_is_an_input_error_with_its_fix(tmp_path):
    p = _ingest(tmp_path, HF_HUB_OFFLINE="1")
    error, fix = _one_error(p)
    assert p.returncode == 6 and "HF_HUB_OFFLINE is set" in error
    assert "unset HF_HUB_OFFLINE" in fix and "--local-dir" in fix


def test_an_unreachable_hub_is_an_input_error_with_its_fix(tmp_path):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    p = _ingest(tmp_path, HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0", HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
    error, fix = _one_error(p)
    assert p.returncode == 6 and f"cannot reach the Hugging Face Hub at {endpoint}" in error
    assert "check the network" in fix and "--local-dir" in fix
