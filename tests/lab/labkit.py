"""What the lab tests share: making a lab or skipping (failing with PREPLINE_LAB=required), and
reading Ray's own records of where a job's tasks ran."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from lab import Lab, LabError, can_make_namespaces  # noqa: E402

__all__ = ["Lab", "LabError", "lab_name", "require_lab", "job_task_hosts", "ROOT"]


def require_lab() -> None:
    """Skip with the reason when namespaces cannot be made here; fail instead under PREPLINE_LAB=required."""
    why = can_make_namespaces()
    if why:
        if os.environ.get("PREPLINE_LAB") == "required":
            pytest.fail(f"PREPLINE_LAB=required but the lab cannot run: {why}")
        pytest.skip(f"lab: {why}")


def lab_name(tag: str) -> str:
    """A lab name (<= 8 chars) unique to this test process and tag (xdist workers run at once)."""
    return "t" + hashlib.sha256(f"{os.getpid()}-{tag}".encode()).hexdigest()[:7]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def job_task_hosts(lab: Lab, submission_id: str) -> dict[str, int]:
    """From the head's own records (job API, state API): node IP -> number of the job's tasks that
    ran there (the driver excluded)."""
    dash = lab.state["ray"]["dashboard"]
    job_id = _get(f"{dash}/api/jobs/{submission_id}")["job_id"]
    nodes = {n["node_id"]: n["node_ip"] for n in lab.ray_nodes()}
    tasks = _get(f"{dash}/api/v0/tasks?limit=10000&filter_keys=job_id&filter_predicates=%3D&filter_values={job_id}"
                 "&detail=1")["data"]["result"]["result"]
    where: dict[str, int] = {}
    for t in tasks:
        if t.get("type") == "DRIVER_TASK" or not t.get("node_id"):
            continue
        ip = nodes.get(t["node_id"], t["node_id"])
        where[ip] = where.get(ip, 0) + 1
    return where
