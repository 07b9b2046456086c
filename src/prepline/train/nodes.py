"""Run the nodes of a realised TrainJob (:func:`prepline.train.realise.realise_trainjob`) as real processes.

:func:`run_nodes` plays the part of JobSet + Trainer's status plugin for one TrainJob: it starts every
node's argv with its env (through a ``spawn`` function: on this machine, or on a lab host), and

- ``Complete`` when every node exits 0;
- ``Failed`` as soon as one node exits non-zero or is killed: the JobSet's default failure policy
  (``maxRestarts`` 0) fails the whole JobSet on the first failed child Job and deletes the others,
  so the other nodes are stopped at once instead of waiting in a collective (reason
  ``NodeFailed``, naming the pod and its exit code or signal);
- ``Failed`` with reason ``DeadlineExceeded`` when ``spec.activeDeadlineSeconds`` (or the caller's
  ``timeout``) passes first: every node is stopped.

So a killed trainer host ends the job within one poll interval of its processes dying, never by
waiting for gloo's own collective timeout (30 minutes by default).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from prepline.train.realise import PET_MASTER_ADDR, PET_MASTER_PORT, NodeProcess

#: spawn(node, argv, env, log_path) -> a started process (its own process group)
Spawn = Callable[[NodeProcess, list, dict, Path], subprocess.Popen]


@dataclass
class JobResult:
    condition: str  # Complete | Failed
    reason: str = ""
    message: str = ""
    seconds: float = 0.0
    exit_codes: dict = field(default_factory=dict)  # pod -> return code (negative: killed by that signal)
    logs: dict = field(default_factory=dict)  # pod -> log path


def local_spawn(bin_dir: str | None = None, master_port: int | None = None) -> Spawn:
    """Every node as a process on this machine: the master's service name becomes 127.0.0.1 and, since
    all nodes share this machine's ports, ``master_port`` (default: a free port) replaces 29500 —
    the only two changes from what the pods get. ``bin_dir`` (default: this Python's) comes first on
    PATH, so the TrainJob's ``torchrun`` / ``python`` are that environment's."""
    bin_dir = bin_dir or str(Path(sys.executable).parent)
    port = master_port or _free_port()

    def spawn(node: NodeProcess, argv: list, env: dict, log: Path) -> subprocess.Popen:
        env = {**env, PET_MASTER_ADDR: "127.0.0.1", PET_MASTER_PORT: str(port)}
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", os.environ.get("PATH", ""))
        exe = shutil.which(argv[0], path=env["PATH"]) or argv[0]
        with open(log, "ab") as fh:
            return subprocess.Popen([exe, *argv[1:]], env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)

    return spawn


def host_spawn(popen: Callable[..., subprocess.Popen], placement: dict[str, str]) -> Spawn:
    """Every node on a host of its own: ``placement`` maps a pod to a host, ``popen(host, argv, env=, stdout=,
    stderr=)`` starts a process there (the lab's ``Lab.popen``). As the kubelet does for a pod, the node runs
    in a UTS namespace whose hostname is the pod's name (the lab's /etc/hosts maps it to the host's address,
    which is what gloo binds to); its env is exactly the pod's (``base_env={}`` in :func:`run_nodes`)."""

    def spawn(node: NodeProcess, argv: list, env: dict, log: Path) -> subprocess.Popen:
        wrapped = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', node.pod, *argv]
        with open(log, "ab") as fh:
            return popen(placement[node.pod], wrapped, env=env, stdout=fh, stderr=subprocess.STDOUT)

    return spawn


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), parents before children."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(0), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it, as the end of a pod's container does. Not its process
    group alone: torchrun starts each worker in a session of its own (torch ``SubprocessHandler``,
    ``start_new_session=True``), so a worker would outlive its killed agent and go on training."""
    killed: set[int] = set()
    for _ in range(5):  # again, for a child started while the tree was read
        procs = [pid, *descendants(pid)]
        alive = False
        for p in procs:
            try:
                os.kill(p, signal.SIGKILL)
                killed.add(p)
                alive = alive or p != pid
            except (ProcessLookupError, PermissionError):
                pass
        if not alive:
            break
    # a SIGKILLed process still runs until the kernel schedules its exit (seconds on a loaded host):
    # return only once every one of them is gone or a zombie, as a pod's end is seen only then
    deadline = time.monotonic() + 30
    while killed and time.monotonic() < deadline:
        killed = {p for p in killed if _running(p)}
        if killed:
            time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _kill(proc: subprocess.Popen) -> None:
    kill_tree(proc.pid)


def run_nodes(nodes: list[NodeProcess], spawn: Spawn, log_dir: str | Path, *, base_env: dict | None = None,
              extra_env: dict | None = None, timeout: float = 600, poll: float = 0.5,
              on_start: Callable[[dict], None] | None = None) -> JobResult:
    """Start every node, wait for the job's end (see the module doc), stop whatever still runs; never raises
    for a node's failure (the result says it). ``base_env``: the process env the nodes start from (default
    this process's); ``extra_env``: per-job additions (e.g. resolved secrets), then the node's own env wins.
    ``on_start({pod: Popen})`` is called once all nodes run (a drill can kill one from there)."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    procs: dict[str, subprocess.Popen] = {}
    logs = {}
    result: JobResult | None = None
    try:
        for n in nodes:
            env = {**(os.environ if base_env is None else base_env), **(extra_env or {}), **n.plain_env(), "HOSTNAME": n.pod}
            logs[n.pod] = log_dir / f"{n.pod}.log"
            procs[n.pod] = spawn(n, n.argv, env, logs[n.pod])
        if on_start is not None:
            on_start(dict(procs))
        deadline = t0 + timeout
        while result is None:
            codes = {pod: p.poll() for pod, p in procs.items()}
            failed = [(pod, c) for pod, c in codes.items() if c not in (None, 0)]
            if failed:
                pod, c = failed[0]
                how = f"was killed by signal {-c} ({signal.Signals(-c).name})" if c < 0 else f"exited with code {c}"
                result = JobResult("Failed", "NodeFailed", f"trainer node {pod} {how}; the other nodes were stopped")
            elif all(c == 0 for c in codes.values()):
                result = JobResult("Complete")
            elif time.monotonic() > deadline:
                result = JobResult("Failed", "DeadlineExceeded", f"the job ran longer than {timeout:.0f} s and was stopped")
            else:
                time.sleep(poll)
    finally:
        for p in procs.values():
            if p.poll() is None:
                _kill(p)
        for p in procs.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                pass
    result.seconds = round(time.monotonic() - t0, 3)
    result.exit_codes = {pod: p.returncode for pod, p in procs.items()}
    result.logs = {pod: str(path) for pod, path in logs.items()}
    return result


__all__ = ["JobResult", "descendants", "host_spawn", "kill_tree", "local_spawn", "run_nodes"]
