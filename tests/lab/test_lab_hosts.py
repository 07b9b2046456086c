"""The lab's host layer (scripts/lab.py): hosts that talk over real sockets, each with its own /tmp
and /etc/hosts, and a ``down`` that leaves nothing behind — also after the process that made the
lab crashed (docs/lab.md)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit import ROOT, Lab, lab_name, require_lab

pytestmark = [pytest.mark.lab]


def leftovers(name: str) -> list[str]:
    """Everything of lab ``name`` still on this machine."""
    found = []
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in ns.splitlines() if line.startswith(f"pl-{name}-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines()
              if line.split(":")[1].strip().split("@")[0] in (f"plbr{name}",) or f" pl{name}v" in line]
    found += [f"file {p}" for p in Path("/etc/netns").glob(f"pl-{name}-*")] if Path("/etc/netns").is_dir() else []
    found += [f"file {p}" for p in (Path(f"/tmp/pl-lab-{name}"), Path(f"/run/prepline-lab/{name}.json")) if p.exists()]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [f"mount {line}" for line in mounts.splitlines() if f"pl-lab-{name}" in line]
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_hosts_are_separate_and_down_leaves_nothing():
    require_lab()
    name = lab_name("hosts")
    lab = Lab(name)
    try:
        lab.up(["a", "b", "s3"])
        # own /tmp: a file in a's /tmp is not in b's, nor is the caller's /tmp visible
        lab.run("a", ["sh", "-c", "echo hi > /tmp/only-a"], check=True)
        assert (lab.scratch("a") / "only-a").exists()
        assert lab.run("b", ["ls", "/tmp/only-a"]).returncode != 0
        assert lab.run("b", ["ls", f"/tmp/pl-lab-{name}"]).returncode != 0
        # /etc/hosts names every host; a real TCP connection from a to b by name
        server = lab.popen("b", [sys.executable, "-c", "import socket; s=socket.create_server(('0.0.0.0', 7000))\n"
                                 "while True:\n c, _ = s.accept(); c.sendall(b'from-b'); c.close()"])
        lab.wait_port("b", 7000)
        r = lab.run("a", [sys.executable, "-c", "import socket; print(socket.create_connection(('b', 7000), 10).recv(16).decode())"],
                    check=True)
        assert r.stdout.strip() == "from-b"
        lab.add_alias("c1-head-svc.team-a.svc.cluster.local", "b")
        r = lab.run("a", ["getent", "hosts", "c1-head-svc.team-a.svc.cluster.local"], check=True)
        assert r.stdout.split()[0] == lab.ip("b")
        # a cut host is unreachable, a restored one answers again
        sleeper = lab.popen("b", ["sleep", "600"], stdout=subprocess.DEVNULL)
        lab.cut("b")
        probe = [sys.executable, "-c", "import socket; socket.create_connection(('b', 7000), 3).recv(16)"]
        assert lab.run("a", probe).returncode != 0
        lab.restore("b")
        deadline = time.time() + 60  # the bridge port forwards again once it is up
        while lab.run("a", probe).returncode != 0:
            assert time.time() < deadline, "b not reachable after restore"
            time.sleep(0.5)
        pids = lab.pids("b")
        assert pids and leftovers(name)
    finally:
        lab.down()
    assert leftovers(name) == []
    assert not any(alive(p) for p in pids)
    sleeper.wait(30)
    server.wait(30)
    lab.down()  # idempotent
    assert leftovers(name) == []


def test_down_after_a_crash_removes_everything():
    """The process that made the lab dies without down (SIGKILL): `scripts/lab.py down` from the state file."""
    require_lab()
    name = lab_name("crash")
    code = (f"import sys, os; sys.path.insert(0, {str(ROOT / 'scripts')!r}); from lab import Lab; "
            f"lab = Lab({name!r}).up(['x', 'y']); lab.popen('x', ['sleep', '600'], stdout=-3, stderr=-3); lab.popen('y', ['sleep', '600'], stdout=-3, stderr=-3); "
            "print('up', flush=True); os.kill(os.getpid(), 9)")
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert made.returncode == -9 and "up" in made.stdout, made.stderr
    try:
        left = leftovers(name)
        assert any(x.startswith("netns") for x in left) and Path(f"/run/prepline-lab/{name}.json").exists()
        pids = Lab(name).pids("x") + Lab(name).pids("y")
        assert len(pids) >= 2
    finally:
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "lab.py"), "--name", name, "down"],
                           capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert leftovers(name) == []
    deadline = time.time() + 60
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "lab.py"), "--name", name, "down"], capture_output=True, text=True)
    assert r.returncode == 0 and leftovers(name) == []


def test_a_checkout_or_python_under_tmp_is_refused_before_anything_is_made(monkeypatch):
    """Every host's /tmp is its own scratch folder: a clone in /tmp (its .venv with it) would be
    invisible inside the hosts, every process failing with 'python: not found'. Refused up front."""
    require_lab()
    import lab as labmod

    monkeypatch.setattr(sys, "executable", "/tmp/somewhere/.venv/bin/python")
    assert "clone the project" in labmod.hidden_by_private_tmp()
    name = lab_name("tmpcheck")
    with pytest.raises(labmod.LabError, match="under /tmp"):
        Lab(name).up(["a"])
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count(name) == 0
    monkeypatch.undo()
    assert labmod.hidden_by_private_tmp() is None
