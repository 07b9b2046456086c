"""The local provider: a real Ray head on this machine, one per stage, isolated from any other Ray.

Each head runs ``ray start --head --block`` in its own process session, with its own temp dir and
its own free ports (every Ray listener, on 127.0.0.1), so several heads (parallel language branches)
coexist. A small state file per cluster (``$PREPLINE_LOCAL_CLUSTERS`` or
``~/.cache/prepline/clusters/<name>.json``) lets the start, execute and stop steps — separate
processes under KFP — find it. Stopping kills exactly that session's processes (SIGTERM, then
SIGKILL): never ``ray stop``, which would kill every Ray of the user.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from prepline.clusters.base import TERMINAL, ClusterError, ClusterInfo, ClusterProvider, ClusterSpec
from prepline.clusters.ray_jobs import RayJobClient
from prepline.metadata import now_iso

_log = logging.getLogger("prepline")


#: seconds a local head's processes get to exit on SIGTERM before SIGKILL
STOP_GRACE_S = 0.5
#: seconds between readiness probes of a starting head
READY_POLL_S = 0.1


def state_dir() -> Path:
    d = Path(os.environ.get("PREPLINE_LOCAL_CLUSTERS") or Path.home() / ".cache" / "prepline" / "clusters")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held together while choosing, so never the same twice)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def _port_range_free(lo: int, hi: int) -> bool:
    for p in (lo, (lo + hi) // 2, hi):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


def _members(st: dict) -> list[int]:
    """Live (non-zombie) processes of a local cluster: its process group, and every process whose
    command line names its private temp dir (Ray starts some services in sessions of their own)."""
    pgid, marker = st["pgid"], st["temp_dir"].encode()
    try:
        os.waitpid(pgid, os.WNOHANG)  # reap the head if this process started it
    except ChildProcessError:
        pass
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            if int(fields[2]) == pgid:
                out.append(int(d))
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if marker in f.read():
                    out.append(int(d))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _alive(st: dict) -> bool:
    return bool(_members(st))


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class LocalProvider(ClusterProvider):
    def __init__(self, num_cpus: int | None = None, object_store_mb: int = 256, start_timeout: float = 120, num_gpus: int | None = None):
        self.num_cpus = num_cpus
        #: GPUs the head offers (Ray's --num-gpus): None = the GPUs Ray detects here
        self.num_gpus = num_gpus
        self.object_store_mb = object_store_mb
        self.start_timeout = start_timeout

    # -- state --------------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        return state_dir() / f"{name}.json"

    def _load(self, name: str) -> dict | None:
        try:
            return json.loads(self._path(name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def _info(self, st: dict, state: str | None = None) -> ClusterInfo:
        return ClusterInfo(
            name=st["name"], namespace=st.get("namespace", "default"),
            state=state or ("ready" if _alive(st) else "dead"),
            job_address=f"http://127.0.0.1:{st['ports']['dashboard']}", labels=st.get("labels", {}), created=st["created"],
        )

    # -- lifecycle ----------------------------------------------------------------------------
    def gpus_here(self) -> int:
        """The GPUs the head offers: ``num_gpus`` (provider_json), else what Ray detects on this machine
        (CUDA_VISIBLE_DEVICES, else the NVIDIA driver), as ``ray start`` would."""
        if self.num_gpus is not None:
            return int(self.num_gpus)
        try:
            from ray._private.accelerators import get_accelerator_manager_for_resource

            return int(get_accelerator_manager_for_resource("GPU").get_current_node_num_accelerators() or 0)
        except Exception:  # noqa: BLE001 - no Ray internals to ask: no GPU known
            return 0

    def create(self, spec: ClusterSpec) -> ClusterInfo:
        st = self._load(spec.name)
        if st and _alive(st):
            return self._info(st)
        gpus = self.gpus_here() if spec.gpus() else 0
        if spec.gpus() > gpus:  # the local equivalent of a GPU group no node can hold: fail before starting anything
            raise ClusterError(f"the cluster spec asks for {spec.gpus()} GPU(s) (gpu_workers/head gpu) and this machine has {gpus}",
                               "run the stage on a cluster with GPU nodes, drop gpu_workers from its cluster_json for a local run, "
                               'or set provider_json {"num_gpus": N} when Ray cannot detect the GPUs here')
        if st:
            self._cleanup(st)
        names = ["gcs", "dashboard", "client", "agent_listen", "agent_grpc", "metrics", "runtime_env", "node_manager", "object_manager"]
        ports = dict(zip(names, _free_ports(len(names))))
        for _ in range(50):  # a worker port range free and clear of the ports chosen above
            lo = random.randint(20000, 59000)
            if _port_range_free(lo, lo + 199) and not any(lo <= p <= lo + 199 for p in ports.values()):
                break
        ports["worker_lo"], ports["worker_hi"] = lo, lo + 199
        temp = tempfile.mkdtemp(prefix="plray-", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
        cpus = self.num_cpus or max(1, min(os.cpu_count() or 1, int(spec.head.cpus() + spec.workers.replicas * spec.workers.cpus())))
        ray = str(Path(sys.executable).parent / "ray")
        cmd = [
            # --no-monitor: no autoscaler monitor process (ray/_private/node.py start_head_processes starts
            # one unless no_monitor): a local head never scales, and it saves ~0.5 s of each start
            ray, "start", "--head", "--block", "--disable-usage-stats", "--no-monitor", "--node-ip-address=127.0.0.1",
            f"--temp-dir={temp}", f"--num-cpus={cpus}", f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
            *([f"--num-gpus={spec.gpus()}"] if spec.gpus() else []),
            "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--port={ports['gcs']}", f"--dashboard-port={ports['dashboard']}", f"--ray-client-server-port={ports['client']}",
            f"--dashboard-agent-listen-port={ports['agent_listen']}", f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
            f"--metrics-export-port={ports['metrics']}", f"--runtime-env-agent-port={ports['runtime_env']}",
            f"--node-manager-port={ports['node_manager']}", f"--object-manager-port={ports['object_manager']}",
            f"--min-worker-port={ports['worker_lo']}", f"--max-worker-port={ports['worker_hi']}",
        ]
        env = dict(os.environ)
        env.update({k: str(v) for k, v in spec.env.items()})
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every listener on loopback
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        # token auth with a token of this cluster's own (not ~/.ray/auth_token): only its state file knows it
        token = secrets.token_hex(24)
        env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN"] = "token", token
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # jobs' `python` = ours
        env.pop("RAY_ADDRESS", None)
        log = open(Path(temp) / "head.log", "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        st = {
            "name": spec.name, "namespace": spec.namespace or "default", "pgid": proc.pid, "ports": ports, "temp_dir": temp,
            "labels": dict(spec.labels), "created": now_iso(), "log": str(Path(temp) / "head.log"), "token": token,
            "spec": asdict(spec),  # to start the same head again (recover)
        }
        path = self._path(spec.name)
        path.touch(mode=0o600)
        path.write_text(json.dumps(st, indent=1))
        return self._info(st, "pending")

    def wait_ready(self, name: str, namespace: str = "default", timeout: float | None = None) -> ClusterInfo:
        st = self._load(name)
        if st is None:
            raise ClusterError(f"no local Ray cluster named {name}", "start it first (start_ray_cluster)")
        deadline = time.time() + (timeout or self.start_timeout)
        url = f"http://127.0.0.1:{st['ports']['dashboard']}"
        while time.time() < deadline:
            if not _alive(st):
                tail = Path(st["log"]).read_text(errors="replace")[-2000:] if Path(st["log"]).exists() else ""
                raise ClusterError(f"local Ray head {name} exited while starting:\n{tail}", "see the log above; free memory or ports")
            try:
                req = urllib.request.Request(f"{url}/api/jobs/", headers=self._headers(st))
                with urllib.request.urlopen(req, timeout=2):
                    return self._info(st, "ready")
            except (urllib.error.URLError, OSError, ConnectionError):
                pass
            time.sleep(READY_POLL_S)
        raise ClusterError(f"local Ray head {name} not ready after {timeout or self.start_timeout:.0f}s", f"see {st['log']}")

    def recover(self, name: str, namespace: str = "default", timeout: float | None = None) -> ClusterInfo:
        """A head that died (its processes gone, e.g. its dashboard crashed on a loaded machine) is
        started again from the spec it was created with, on fresh ports; one that is alive is waited for."""
        st = self._load(name)
        if st is None:
            raise ClusterError(f"no local Ray cluster named {name}", "start it first (start_ray_cluster)")
        if not _alive(st) and "spec" in st:
            s = dict(st["spec"])
            spec = ClusterSpec.from_dict(s)
            log_tail = Path(st["log"]).read_text(errors="replace")[-500:] if Path(st["log"]).exists() else ""
            _log.warning("local Ray head %s is gone; starting it again (its log ended with: %s)", name, log_tail.strip()[-200:])
            self.create(spec)
        return self.wait_ready(name, namespace, timeout)

    def delete(self, name: str, namespace: str = "default") -> bool:
        st = self._load(name)
        if st is None:
            return False
        self._cleanup(st)
        return True

    def _cleanup(self, st: dict) -> None:
        pids = _members(st)
        if pids:
            # Ray's services (GCS, raylet, dashboard) exit within ~0.05 s of SIGTERM; what lingers is
            # `ray start --block` itself (~3 s of its own shutdown) and the log monitor: the cluster and
            # its temp dir are thrown away, so they get SIGKILL after a short grace
            _kill(pids, signal.SIGTERM)
            deadline = time.time() + STOP_GRACE_S
            while _members(st) and time.time() < deadline:
                time.sleep(0.05)
            _kill(_members(st), signal.SIGKILL)
            deadline = time.time() + 5
            while _members(st) and time.time() < deadline:
                time.sleep(0.05)
        left = _members(st)
        if left:
            raise ClusterError(f"could not stop local Ray cluster {st['name']} (processes {left})", f"kill -9 {' '.join(map(str, left))}")
        shutil.rmtree(st["temp_dir"], ignore_errors=True)
        self._path(st["name"]).unlink(missing_ok=True)

    def list(self, namespace: str = "default", labels: dict | None = None) -> list[ClusterInfo]:
        out = []
        for f in sorted(state_dir().glob("*.json")):
            st = self._load(f.stem)
            if st and all(st.get("labels", {}).get(k) == v for k, v in (labels or {}).items()):
                out.append(self._info(st))
        return out

    # -- jobs -----------------------------------------------------------------------------------
    @staticmethod
    def _headers(st: dict) -> dict:
        return {"Authorization": f"Bearer {st['token']}"} if st.get("token") else {}

    def job_client(self, name: str, namespace: str | None = None) -> RayJobClient:
        """Our own Ray job client on the head's dashboard (the same code the KubeRay path uses)."""
        st = self._load(name)
        if st is None:
            raise ClusterError(f"no local Ray cluster named {name}", "start it first (start_ray_cluster)")
        # a loaded machine can stall the dashboard for seconds: retry connection errors for ~15 s
        return RayJobClient(f"http://127.0.0.1:{st['ports']['dashboard']}", headers=self._headers(st), retries=5, backoff=0.5)


__all__ = ["LocalProvider", "ClusterError", "TERMINAL"]
